#!/usr/bin/env python
"""Terminology constraints on Multi30k: BLEU, term-use rate and speed, against unconstrained
decoding.

For each test sentence the unconstrained translation is made first; then 1-2 constraints are
drawn from its reference: German nouns (capitalised words, the sentence's first word
excepted) that the unconstrained output misses, chosen with a fixed seed. The same sentences
are translated again with those constraints (dynamic beam allocation, ``nmt.decode.steering``).
Reported, as one JSON object: BLEU and chrF of both outputs (sacreBLEU, with signatures), the
term-use rate (share of constraints whose text appears in the output) of both, how many
sentences got constraints, and the seconds each search took (same model, same batches).

Example (a trained Multi30k checkpoint)::

    python scripts/bench_constraints.py --checkpoint runs/multi30k_en_de/average.pt --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def nouns_missed(reference: str, hypothesis: str) -> list[str]:
    """Capitalised words of ``reference`` (its first word excepted) that ``hypothesis`` lacks, in
    order, once each."""
    words = re.findall(r"\w+", reference)
    present = set(re.findall(r"\w+", hypothesis))
    return list(dict.fromkeys(w for w in words[1:] if w[:1].isupper() and w not in present))


def term_use(outputs: list[str], constraints: list[list[str]]) -> float:
    """Share of constraints whose text appears, as a whole word, in its sentence's output."""
    total = sum(len(c) for c in constraints)
    used = sum(
        bool(re.search(rf"(?<!\w){re.escape(term)}(?!\w)", out))
        for out, terms in zip(outputs, constraints)
        for term in terms
    )
    return used / total if total else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
    )
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-constraints", type=int, default=2)
    args = parser.parse_args()

    import torch

    from nmt.data.corpus import read_lines
    from nmt.scoring.evaluate import score
    from nmt.translation.inference import Decoding, Inference
    from nmt.translation.steering_text import steering

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    inference = Inference.load([args.checkpoint], device)
    tokenizer, cfg = inference.tokenizer, inference.cfg
    src = read_lines(Path(args.data) / f"{args.split}.en.gz")
    ref = read_lines(Path(args.data) / f"{args.split}.de.gz")
    decode = replace(cfg.decode, beam_size=args.beam, n_best=1)
    start = time.perf_counter()
    plain = inference.best_strings(inference.translate(src, Decoding(decode)))
    plain_s = time.perf_counter() - start
    rng = random.Random(args.seed)
    constraints = []
    for r, h in zip(ref, plain):
        missed = nouns_missed(r, h)
        constraints.append(
            rng.sample(missed, min(len(missed), rng.randint(1, args.max_constraints)))
            if missed
            else []
        )
    wishes = [steering(tokenizer, constraints=c) for c in constraints]
    start = time.perf_counter()
    steered = inference.best_strings(inference.translate(src, Decoding(decode), wishes))
    steered_s = time.perf_counter() - start
    plain_score, steered_score = score(plain, [ref]), score(steered, [ref])
    print(
        json.dumps(
            {
                "checkpoint": args.checkpoint,
                "split": args.split,
                "sentences": len(src),
                "sentences_with_constraints": sum(bool(c) for c in constraints),
                "constraints": sum(len(c) for c in constraints),
                "beam": args.beam,
                "threads": args.threads,
                "unconstrained": {
                    "bleu": plain_score["bleu"],
                    "chrf": plain_score["chrf"],
                    "term_use": term_use(plain, constraints),
                    "seconds": plain_s,
                },
                "constrained": {
                    "bleu": steered_score["bleu"],
                    "chrf": steered_score["chrf"],
                    "term_use": term_use(steered, constraints),
                    "seconds": steered_s,
                },
                "bleu_signature": plain_score["bleu_signature"],
            }
        )
    )


if __name__ == "__main__":
    main()
