#!/usr/bin/env python
"""Data at scale: encode a 4.5-million-pair corpus and start training on it.

Builds a corpus the size of WMT14 English-German by repeating Multi30k's training set
(29,000 pairs × 156 = 4,524,000 pairs; plain text under ``--work``), then runs
``nmt train`` on it in a child process for ``--steps`` steps and watches that process's
memory through ``/proc`` every 50 ms. Prints one JSON line per run:

* ``encode_s``: encoding (tokenization into the memory-mapped cache), from the log;
* ``cache_bytes``: size of the cache directory on disk;
* ``first_step_s``: process start to the first logged training step;
* ``peak_rss_mb``: the training process's peak resident memory (``VmHWM``);
* ``anon_mb_max_before_first_step``: the most anonymous memory while reading, encoding
  and setting up;
* ``anon_mb_first_step``, ``anon_mb_step_10``, ``anon_mb_max_after_10``,
  ``anon_mb_last_step``: anonymous (heap) resident memory at the first step, the tenth
  (optimizer state and allocator pools exist by then), its maximum after that, and the
  last; mapped cache pages are file-backed and not counted there (``file_mb_last_step``
  shows them);
* per worker count, then once more with the cache present (``cache_hit``).

Example (2 CPU cores)::

    python scripts/bench_data.py --workers 1,2 --steps 100

Encoding runs in the training process, ``data.workers`` SentencePiece threads, into an
Arrow cache (see :func:`nmt.data.encoded.encode_corpus`); docs/performance.md has the
measurements of it and of the designs before it.

Data: ``--data`` or $MULTI30K (default ``../shared/data/multi30k`` beside the checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_corpus(data: Path, work: Path, repeats: int) -> tuple[Path, Path, int]:
    """Write ``repeats`` copies of Multi30k train as plain text; reuse them if already there."""
    from nmt.data.corpus import read_lines

    paths = work / "train.en", work / "train.de"
    done = work / f"corpus-{repeats}.done"
    lines = {lang: read_lines(data / f"train.{lang}.gz") for lang in ("en", "de")}
    if not done.is_file():
        work.mkdir(parents=True, exist_ok=True)
        for path, lang in zip(paths, ("en", "de")):
            block = ("\n".join(lines[lang]) + "\n").encode()
            with open(path, "wb") as f:
                for _ in range(repeats):
                    f.write(block)
        done.touch()
    return *paths, repeats * len(lines["en"])


def train_tokenizer_once(data: Path, work: Path) -> Path:
    """A joint 8,000-piece BPE model trained on Multi30k train (what the corpus repeats)."""
    path = work / "spm.model"
    if not path.is_file():
        from nmt.config import TokenizerConfig
        from nmt.data.corpus import read_parallel
        from nmt.data.tokenizer import train_tokenizer

        src, tgt = read_parallel(data / "train.en.gz", data / "train.de.gz")
        train_tokenizer(src, tgt, TokenizerConfig(vocab_size=8000)).save(work)
    return path


def memory(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon and RssFile of ``pid`` in MB (empty once it has exited)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(args, src: Path, tgt: Path, spm_model: Path, run_dir: Path, workers: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "nmt",
        "train",
        "-c",
        str(ROOT / "configs/multi30k_en_de.yaml"),
        "--run-dir",
        str(run_dir),
        "--set",
        f"data.train_src={src}",
        "--set",
        f"data.train_tgt={tgt}",
        "--set",
        f"data.valid_src={Path(args.data) / 'val.en.gz'}",
        "--set",
        f"data.valid_tgt={Path(args.data) / 'val.de.gz'}",
        "--set",
        "data.valid_max_sentences=16",
        "--set",
        f"data.workers={workers}",
        "--set",
        f"tokenizer.model={spm_model}",
        "--set",
        f"train.max_steps={args.steps}",
        "--set",
        "train.log_every=1",
        "--set",
        f"train.validate_every={args.steps}",
        "--set",
        "train.save_every=0",
        "--set",
        "train.progress_bar=false",
        "--set",
        f"train.threads={args.threads}",
        "--set",
        "train.tensorboard=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
    )
    log_lines: list[str] = []
    reader = threading.Thread(target=lambda: log_lines.extend(proc.stderr), daemon=True)
    reader.start()
    metrics = run_dir / "metrics.jsonl"
    samples, last, first_step_s, steps_seen, before_anon = [], {}, None, 0, 0.0
    while proc.poll() is None:
        m = memory(proc.pid)
        if m:
            last = m
            if first_step_s is None:
                before_anon = max(before_anon, m["RssAnon"])
        if metrics.is_file():
            steps = sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line)
            if steps and first_step_s is None:
                first_step_s = time.perf_counter() - start
            if steps > steps_seen and m:
                samples.append({"step": steps, **m})
                steps_seen = steps
        time.sleep(0.05)
    reader.join()
    if proc.returncode != 0:
        sys.exit("nmt train failed:\n" + "".join(log_lines[-30:]))
    encode = next(
        (
            float(x)
            for line in log_lines
            for x in re.findall(r"encoded or loaded from .* in ([\d.]+) s", line)
        ),
        None,
    )
    warm = [s for s in samples if s["step"] >= 10]
    cache = run_dir / "cache"
    train_cache = max(cache.iterdir(), key=du)
    return {
        "workers": workers,
        "encode_s": encode,
        "cache_bytes": du(train_cache),
        "first_step_s": round(first_step_s, 2) if first_step_s else None,
        "total_s": round(time.perf_counter() - start, 2),
        "steps": args.steps,
        "peak_rss_mb": round(last.get("VmHWM", 0.0), 1),
        "anon_mb_max_before_first_step": round(before_anon, 1),
        "anon_mb_first_step": round(samples[0]["RssAnon"], 1) if samples else None,
        "anon_mb_step_10": round(warm[0]["RssAnon"], 1) if warm else None,
        "anon_mb_max_after_10": round(max(s["RssAnon"] for s in warm), 1) if warm else None,
        "anon_mb_last_step": round(samples[-1]["RssAnon"], 1) if samples else None,
        "file_mb_last_step": round(samples[-1]["RssFile"], 1) if samples else None,
        "kept_line": next((line.strip() for line in log_lines if "pairs kept" in line), ""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
    )
    parser.add_argument(
        "--work",
        default=str(ROOT / "runs" / "bench_data"),
        help="where the corpus, caches and runs go (git-ignored)",
    )
    parser.add_argument(
        "--repeats", type=int, default=156, help="copies of Multi30k train (156: 4,524,000 pairs)"
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="comma-separated data.workers values (encoding threads) to compare",
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    data, work = Path(args.data), Path(args.work)
    src, tgt, pairs = build_corpus(data, work / "corpus", args.repeats)
    spm_model = train_tokenizer_once(data, work)
    base = {
        "pairs": pairs,
        "corpus_bytes": src.stat().st_size + tgt.stat().st_size,
        "cpus": len(os.sched_getaffinity(0)),
    }
    run_dir = None
    for workers in [int(w) for w in args.workers.split(",")]:
        run_dir = work / f"run_w{workers}"
        shutil.rmtree(run_dir, ignore_errors=True)
        print(
            json.dumps(
                {**base, "cache_hit": False, **run(args, src, tgt, spm_model, run_dir, workers)}
            ),
            flush=True,
        )
    # The same run again on the cache the last run wrote: no tokenization.
    again = work / "run_cached"
    shutil.rmtree(again, ignore_errors=True)
    again.mkdir(parents=True)
    shutil.copytree(run_dir / "cache", again / "cache")
    print(
        json.dumps({**base, "cache_hit": True, **run(args, src, tgt, spm_model, again, workers)}),
        flush=True,
    )


if __name__ == "__main__":
    main()
