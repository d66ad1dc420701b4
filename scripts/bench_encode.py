#!/usr/bin/env python
"""Encoding time of a corpus into an empty cache (``nmt.data.encoded.encode_corpus``), per
``data.workers`` value (SentencePiece threads), and the time to open the cache once present.
Prints one JSON line.

Example (Multi30k's 29,000 training pairs, the tokenizer the recipe trains)::

    python scripts/bench_encode.py --workers 1,2 --repeats 3

Data: ``--data`` or $MULTI30K (default ``../shared/data/multi30k`` beside the checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
    )
    parser.add_argument(
        "--workers", default="1,2", help="comma-separated data.workers values (encoding threads)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from nmt.config import TokenizerConfig
    from nmt.data.clean import stripped_side
    from nmt.data.corpus import ParallelText, find_split_file
    from nmt.data.encoded import encode_corpus
    from nmt.data.tokenizer import train_tokenizer

    text = ParallelText.files(
        find_split_file(args.data, "train", "en"), find_split_file(args.data, "train", "de")
    )
    tokenizer = train_tokenizer(
        stripped_side(text, 0), stripped_side(text, 1), TokenizerConfig(vocab_size=8000), 1
    )
    out: dict = {"pairs": text.check()}
    for workers in (int(w) for w in args.workers.split(",")):
        times = []
        for _ in range(args.repeats):
            cache = Path(tempfile.mkdtemp(prefix="bench-encode-"))
            start = time.perf_counter()
            corpus, _ = encode_corpus(text, tokenizer, cache, 100, 3.0, threads=workers)
            times.append(round(time.perf_counter() - start, 2))
            out["cache_bytes"] = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
            start = time.perf_counter()
            encode_corpus(text, tokenizer, cache, 100, 3.0, threads=workers)
            out["cache_hit_s"] = round(time.perf_counter() - start, 3)
            del corpus
            shutil.rmtree(cache)
        out[f"workers_{workers}_s"] = times
    print(json.dumps(out))


if __name__ == "__main__":
    main()
