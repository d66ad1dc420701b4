#!/usr/bin/env python
r"""Do the exports keep their word? nmt's search against the same model exported to CTranslate2 and
Hugging Face, judged by nmt's own objective.

Each line is translated by ``nmt translate`` (the checkpoint's decode settings, or those given),
by CTranslate2 with the same beam, length penalty and limit, and by ``generate()`` with the
exported ``generation_config.json``. Every peer's best hypothesis is then scored by nmt's model as
nmt ranks hypotheses (``log P(Y|X)`` with EOS over ``lp(|Y|)``), so that a peer that "wins" has
found a translation nmt's search should have preferred: a search error of nmt's (or a difference of
the rules, which the JSON names). Prints one JSON object per peer:

    {"peer": "ctranslate2", "patience": 1, "lines": 200, "better_lines": 0, "better_share": 0.0,
     "same_output_share": 0.97, "largest_gain": 0.0, ...}

Example (the issue's 12-step toy model, beam 5, |Y|^2):

    nmt train -c configs/toy.yaml --run-dir R --set train.max_steps=12 --set train.validate_every=12
    python scripts/bench_exports.py --checkpoint R/best.pt --src data/toy/test.en --lines 200 \
        --set length_normalization=length --set length_penalty=2.0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def nmt_scores(model, src_ids, outputs, decode) -> list[float]:
    """The score nmt gives each output (piece ids, no EOS) of each source (piece ids):
    ``log P(Y|X)`` with EOS, over ``lp(|Y|)`` with EOS counted, in float64."""
    import torch

    from nmt.core.batching import pad_sources
    from nmt.data.tokenizer import BOS, EOS
    from nmt.decode.beams import length_penalty

    scores = []
    with torch.inference_mode():
        for src, out in zip(src_ids, outputs):
            tgt = torch.tensor([[BOS, *out]])
            lprobs = torch.log_softmax(model(pad_sources([src]), tgt).double(), -1)[0]
            gold = torch.tensor([*out, EOS])
            log_prob = float(lprobs.gather(1, gold.unsqueeze(1)).sum())
            penalty = length_penalty(
                len(out) + 1, decode.length_penalty, decode.length_normalization
            )
            scores.append(log_prob / penalty)
    return scores


def compare(name: str, settings: dict, ours: list, theirs: list, src_ids, model, decode) -> dict:
    """The JSON row of one peer: on how many lines its best output scores more than 0.01 above
    nmt's, both scored by nmt."""
    mine = nmt_scores(model, src_ids, ours, decode)
    peer = nmt_scores(model, src_ids, theirs, decode)
    gains = [p - m for p, m in zip(peer, mine)]
    better = sum(g > 0.01 for g in gains)
    return {
        "peer": name,
        **settings,
        "lines": len(ours),
        "better_lines": better,
        "better_share": round(better / max(1, len(ours)), 4),
        "same_output_share": round(sum(a == b for a, b in zip(ours, theirs)) / len(ours), 4),
        "largest_gain": round(max(gains + [0.0]), 4),
        "decode": {
            k: getattr(decode, k)
            for k in ("beam_size", "length_normalization", "length_penalty", "patience")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", required=True, help="source text, one sentence a line")
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument(
        "--set", action="append", default=[], help="decode.KEY=VALUE over the checkpoint's"
    )
    parser.add_argument(
        "--patience", default="1", help="CTranslate2's patience values to try, comma-separated"
    )
    parser.add_argument("--peers", default="ctranslate2,huggingface")
    args = parser.parse_args()

    import torch

    from nmt.config import apply_overrides, config_from_dict, config_to_dict
    from nmt.data.corpus import read_lines
    from nmt.data.tokenizer import EOS
    from nmt.interop.export import export, generation_settings
    from nmt.translation.inference import Decoding, Inference

    torch.set_num_threads(1)
    inference = Inference.load([args.checkpoint], torch.device("cpu"))
    model, tokenizer = inference.model, inference.tokenizer
    raw = apply_overrides(config_to_dict(inference.cfg), [f"decode.{s}" for s in args.set])
    decode = config_from_dict(raw).decode
    lines = [line for line in read_lines(args.src)[: args.lines] if line.strip()]
    src_ids = tokenizer.encode_src(lines)
    ours = [h[0].tokens for h in inference.translate(lines, Decoding(replace(decode, n_best=1)))]
    limits = [int(decode.max_len_a * (len(s) + 1) + decode.max_len_b) for s in src_ids]
    with tempfile.TemporaryDirectory() as tmp:
        if "ctranslate2" in args.peers:
            import ctranslate2

            export(args.checkpoint, Path(tmp) / "ct2", format="ctranslate2")
            translator = ctranslate2.Translator(str(Path(tmp) / "ct2"), intra_threads=1)
            sp = tokenizer.tgt
            alpha = 0.0 if decode.length_normalization == "none" else decode.length_penalty
            for patience in [float(p) for p in args.patience.split(",")]:
                theirs = []
                for src, limit in zip(src_ids, limits):  # CTranslate2's limit is one a batch
                    tokens = [tokenizer.src.id_to_piece(i) for i in src] + ["</s>"]
                    (result,) = translator.translate_batch(
                        [tokens],
                        beam_size=decode.beam_size,
                        patience=patience,
                        length_penalty=alpha,
                        max_decoding_length=limit,
                        min_decoding_length=decode.min_len,
                        disable_unk=not decode.allow_unk,
                        suppress_sequences=[["<s>"], ["<pad>"]],
                    )
                    theirs.append([sp.piece_to_id(p) for p in result.hypotheses[0]])
                row = compare(
                    "ctranslate2", {"patience": patience}, ours, theirs, src_ids, model, decode
                )
                print(json.dumps(row), flush=True)
        if "huggingface" in args.peers:
            import transformers

            export(args.checkpoint, Path(tmp) / "hf", format="huggingface")
            hf = transformers.MarianMTModel.from_pretrained(Path(tmp) / "hf").eval()
            # what export writes for these settings (the checkpoint's own may differ)
            settings, notes = generation_settings(
                decode, tokenizer, hf.config.max_position_embeddings
            )
            theirs = []
            with torch.inference_mode():
                for src in src_ids:
                    ids = torch.tensor([[*src, EOS]])
                    out = hf.generate(
                        input_ids=ids, attention_mask=torch.ones_like(ids), **settings
                    )[0]
                    theirs.append([t for t in out[1:].tolist() if t not in (EOS, 0)])
            keys = ("early_stopping", "length_penalty", "num_beams", "max_length")
            row = compare(
                "huggingface",
                {**{k: settings.get(k) for k in keys}, "notes": notes},
                ours,
                theirs,
                src_ids,
                model,
                decode,
            )
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
