#!/usr/bin/env python
"""Streaming translation benchmark: memory on a long pipe, and speed against the whole-input path.

``pipe``: feeds ``--lines`` lines (Multi30k test sentences, repeated) through a pipe into
``nmt translate`` (or, with ``--whole-input``, a process that reads all of standard input
first and translates it in one call, which is what ``nmt translate`` did before it
streamed), and samples the process's resident memory while it runs. ``--time-limit`` stops
it early; the record says how far it got. Prints one JSON object.

``file``: in one process, translates the same lines once with
:meth:`nmt.translation.inference.Inference.translate` over the whole input and once with
:meth:`nmt.translation.inference.Inference.stream` in ``--buffer-size`` buffers, alternating
``--repeats`` times, and prints the best sentences/s of each.

    python scripts/bench_stream.py pipe --checkpoint RUN/best.pt --lines 1000000 --beam 1
    python scripts/bench_stream.py file --checkpoint RUN/best.pt --lines 4000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def source_lines(args) -> list[str]:
    from nmt.data.corpus import read_lines

    return read_lines(Path(args.data) / f"{args.split}.en.gz")


def status_bytes(pid: int, key: str) -> int:
    """``key`` (VmRSS, VmHWM) of process ``pid`` from /proc, in bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pipe(args) -> dict:
    """Run the translator on a pipe of ``args.lines`` lines; memory sampled every 0.2 s."""
    lines = source_lines(args)
    if args.whole_input:
        cmd = [
            sys.executable,
            __file__,
            "whole",
            "--checkpoint",
            args.checkpoint,
            "--beam",
            str(args.beam),
            "--threads",
            str(args.threads),
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "nmt",
            "translate",
            "--checkpoint",
            args.checkpoint,
            "--buffer-size",
            str(args.buffer_size),
            "--beam-size",
            str(args.beam),
            "--threads",
            str(args.threads),
        ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    written, translated = [0], [0]

    def feed():
        try:
            for i in range(args.lines):
                proc.stdin.write((lines[i % len(lines)] + "\n").encode())
                written[0] += 1
            proc.stdin.close()
        except (BrokenPipeError, ValueError):  # stopped at the time limit
            pass

    def drain():
        for _ in proc.stdout:
            translated[0] += 1

    threads = [
        threading.Thread(target=feed, daemon=True),
        threading.Thread(target=drain, daemon=True),
    ]
    for t in threads:
        t.start()
    start, samples, peak = time.perf_counter(), [], 0
    while proc.poll() is None and time.perf_counter() - start < args.time_limit:
        peak = max(peak, status_bytes(proc.pid, "VmHWM"))
        samples.append(
            (round(time.perf_counter() - start, 1), translated[0], status_bytes(proc.pid, "VmRSS"))
        )
        time.sleep(0.2)
    seconds = time.perf_counter() - start
    finished = proc.poll() is not None
    if not finished:
        proc.kill()
    proc.wait()
    samples = [s for s in samples if s[2]]
    quarter = (
        [samples[min(len(samples) - 1, len(samples) * q // 4)] for q in (1, 2, 3, 4)]
        if samples
        else []
    )
    return {
        "mode": "whole-input" if args.whole_input else f"stream (--buffer-size {args.buffer_size})",
        "lines_asked": args.lines,
        "lines_written": written[0],
        "lines_translated": translated[0],
        "finished": finished,
        "seconds": round(seconds, 1),
        "sentences_per_s_including_load": round(translated[0] / seconds, 1),
        "peak_rss_bytes": peak,
        "rss_at_quarters_of_run": [
            {"s": s, "translated": n, "rss_bytes": r} for s, n, r in quarter
        ],
    }


def whole(args) -> None:
    """The pre-streaming path: all of standard input, translated in one call, then written."""
    import torch

    from nmt.translation.inference import Decoding, Inference

    torch.set_num_threads(args.threads)
    inference = Inference.load([args.checkpoint], torch.device("cpu"))
    from dataclasses import replace

    lines = sys.stdin.buffer.read().decode("utf-8").split("\n")[:-1]
    results = inference.translate(
        lines, Decoding(replace(inference.cfg.decode, beam_size=args.beam))
    )
    sys.stdout.write("".join(s + "\n" for s in inference.best_strings(results)))


def file(args) -> dict:
    """Whole-input against buffered translation of the same lines, in one process."""
    from dataclasses import replace

    import torch

    from nmt.data.corpus import buffers
    from nmt.translation.inference import Decoding, Inference

    torch.set_num_threads(args.threads)
    base = source_lines(args)
    lines = [base[i % len(base)] for i in range(args.lines)]
    inference = Inference.load([args.checkpoint], torch.device("cpu"))
    tokenizer, decode = inference.tokenizer, replace(inference.cfg.decode, beam_size=args.beam)
    batching = {
        "whole": batch_shapes(tokenizer, [lines], decode.max_tokens),
        "stream": batch_shapes(tokenizer, buffers(lines, args.buffer_size), decode.max_tokens),
    }
    best = {"whole": float("inf"), "stream": float("inf")}
    for _ in range(args.repeats):
        t = time.perf_counter()
        inference.translate(lines, Decoding(decode))
        best["whole"] = min(best["whole"], time.perf_counter() - t)
        t = time.perf_counter()
        for _ in inference.stream(buffers(lines, args.buffer_size), Decoding(decode)):
            pass
        best["stream"] = min(best["stream"], time.perf_counter() - t)
    return {
        "lines": len(lines),
        "beam": args.beam,
        "buffer_size": args.buffer_size,
        "threads": args.threads,
        "repeats": args.repeats,
        "whole_sentences_per_s": round(len(lines) / best["whole"], 2),
        "stream_sentences_per_s": round(len(lines) / best["stream"], 2),
        "stream_over_whole": round(best["whole"] / best["stream"], 3),
        **{
            f"{path}_{key}": value
            for path, shapes in batching.items()
            for key, value in shapes.items()
        },
    }


def batch_shapes(tokenizer, chunks, max_tokens: int) -> dict:
    """Batches and padded source tokens when each chunk of lines is sorted and batched on its
    own (what the timing depends on, free of this machine's noise)."""
    import numpy as np

    from nmt.core.batching import token_batches

    n_batches = padded = real = 0
    for chunk in chunks:
        lengths = np.array([len(s) + 1 for s in tokenizer.encode_src(chunk)], dtype=np.int64)
        for batch in token_batches(lengths, max_tokens, np.argsort(lengths, kind="stable")):
            n_batches += 1
            padded += len(batch) * int(lengths[batch].max())
            real += int(lengths[batch].sum())
    return {"batches": n_batches, "padding_fraction": round(1 - real / padded, 4)}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "mode",
        choices=["pipe", "file", "whole"],
        help="whole: internal (the whole-input translator that pipe --whole-input runs)",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
        help="Multi30k directory",
    )
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument(
        "--lines",
        type=int,
        default=1_000_000,
        help="lines to translate (the split's sentences, repeated)",
    )
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--buffer-size", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--time-limit", type=float, default=float("inf"), help="pipe: stop after this many seconds"
    )
    p.add_argument(
        "--whole-input",
        action="store_true",
        help="pipe: measure the whole-input path instead of nmt translate",
    )
    p.add_argument(
        "--repeats", type=int, default=2, help="file: alternating runs of each path (best is kept)"
    )
    args = p.parse_args()
    if args.mode == "whole":
        whole(args)
    else:
        print(json.dumps(pipe(args) if args.mode == "pipe" else file(args)), flush=True)


if __name__ == "__main__":
    main()
