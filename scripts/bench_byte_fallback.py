#!/usr/bin/env python3
r"""What SentencePiece's byte_fallback changes for a target with a large character set.

Trains the joint tokenizer a config describes twice, without and with ``byte_fallback``,
on the config's training text, then encodes a held-out target file and reports, for each:
the share of reference characters that become UNK (a model using that tokenizer can never
produce them: nmt bans UNK at decoding), the sentences with at least one UNK, whether
decoding the encoding gives the text back, and pieces per sentence.

    python scripts/bench_byte_fallback.py --config configs/small_enja.yaml \
        --ref ../shared/data/small_parallel_enja/test.ja.gz
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nmt.config import load_config  # noqa: E402
from nmt.data.clean import stripped_side  # noqa: E402
from nmt.data.corpus import load_split, read_lines  # noqa: E402
from nmt.data.tokenizer import UNK, train_tokenizer  # noqa: E402


def measure(tokenizer, refs: list[str]) -> dict:
    ids = tokenizer.encode_tgt(refs)
    unk_chars = 0
    for line, pieces in zip(refs, ids):
        # Characters hidden behind UNK: what is lost when the pieces are decoded.
        decoded = tokenizer.decode_tgt([[i for i in pieces if i != UNK]])[0]
        unk_chars += len(line.replace(" ", "")) - len(decoded.replace(" ", ""))
    chars = sum(len(line.replace(" ", "")) for line in refs)
    return {
        "unk_char_percent": round(100 * unk_chars / chars, 3),
        "sentences_with_unk": sum(UNK in p for p in ids),
        "round_trip_exact": sum(tokenizer.decode_tgt([p])[0] == line for line, p in zip(refs, ids)),
        "pieces_per_sentence": round(sum(map(len, ids)) / len(ids), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument(
        "--ref", required=True, type=Path, help="held-out target text (plain or .gz)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="config override section.key=value",
    )
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    refs = [line.strip() for line in read_lines(args.ref)]
    results = {"sentences": len(refs)}
    for fallback in (False, True):
        text = load_split(cfg.data, "train")
        tokenizer = train_tokenizer(
            stripped_side(text, 0),
            stripped_side(text, 1),
            replace(cfg.tokenizer, byte_fallback=fallback),
        )
        results[f"byte_fallback={str(fallback).lower()}"] = measure(tokenizer, refs)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
