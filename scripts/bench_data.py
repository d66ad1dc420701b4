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

``--compare-datasets ROUNDS`` instead measures nmt's encoding cache against
``datasets.Dataset.map(num_proc=...)`` writing a fingerprinted Arrow cache, by the same
cleaning and encoding rules, alternating the two in child processes; it prints encoding
time, time to the first batch, cache size and peak memory (Pss, summed over workers) per run::

    python scripts/bench_data.py --workers 2 --compare-datasets 2

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
    from nmt.corpus import read_lines

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
        from nmt.corpus import read_parallel
        from nmt.tokenizer import train_tokenizer

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
        sys.executable, "-m", "nmt", "train", "-c", str(ROOT / "configs/multi30k_en_de.yaml"), "--run-dir", str(run_dir),
        "--set", f"data.train_src={src}", "--set", f"data.train_tgt={tgt}",
        "--set", f"data.valid_src={Path(args.data) / 'val.en.gz'}", "--set", f"data.valid_tgt={Path(args.data) / 'val.de.gz'}",
        "--set", "data.valid_max_sentences=16", "--set", f"data.workers={workers}", "--set", f"tokenizer.model={spm_model}",
        "--set", f"train.max_steps={args.steps}", "--set", "train.log_every=1", "--set", f"train.validate_every={args.steps}",
        "--set", "train.save_every=0", "--set", "train.progress_bar=false", "--set", f"train.threads={args.threads}",
        "--set", "train.tensorboard=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
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
    encode = next((float(x) for line in log_lines for x in re.findall(r"encoded or loaded in ([\d.]+) s", line)), None)
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


# ------------------------------------------------------------------ nmt's cache against datasets'


def _encode_arrow(table, proto: bytes, max_len: int, max_len_ratio: float):
    """``datasets.map`` function: the block ``table`` (columns src, tgt) encoded by nmt's own
    rules (:func:`nmt.corpus.encode_chunk`), returned as list<int32> columns."""
    import numpy as np
    import pyarrow as pa

    from nmt.corpus import encode_chunk
    from nmt.tokenizer import Tokenizer

    global _ARROW_TOKENIZER
    if _ARROW_TOKENIZER is None:
        _ARROW_TOKENIZER = Tokenizer.from_protos({"joint": proto})
    chunk = encode_chunk(_ARROW_TOKENIZER, table.column("src").to_pylist(), table.column("tgt").to_pylist(), max_len, max_len_ratio, threads=1)

    def column(ids, lengths):
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, type=pa.int32()))

    return pa.table({"src_ids": column(chunk.src_ids, chunk.src_lengths), "tgt_ids": column(chunk.tgt_ids, chunk.tgt_lengths)})


_ARROW_TOKENIZER = None


def _pairs(src: str, tgt: str):
    from nmt.corpus import ParallelText

    for s, t in ParallelText.files(src, tgt).pairs():  # nmt's reading rules, so both variants read the same text
        yield {"src": s, "tgt": t}


class _ArrowCorpus:
    """The two list<int32> columns of a memory-mapped Arrow table, read as :func:`nmt.data.collate` reads a corpus."""

    def __init__(self, table):
        import numpy as np
        import pyarrow.compute as pc

        self.columns = table.column("src_ids"), table.column("tgt_ids")
        self.src_lengths, self.tgt_lengths = (np.concatenate([pc.list_value_length(c).to_numpy() for c in col.chunks]).astype(np.int64) + 1 for col in self.columns)

    def src(self, i):
        return self.columns[0][int(i)].values.to_numpy()

    def tgt(self, i):
        return self.columns[1][int(i)].values.to_numpy()


def prepare_variant(variant: str, src: Path, tgt: Path, spm_model: Path, cache: Path, workers: int) -> dict:
    """In this process: encode (or load from ``cache``) with ``variant`` ("nmt" or "datasets"),
    then build the first batch of the first epoch as training would."""
    start = time.perf_counter()
    from nmt.data import TokenBatchSampler, collate
    from nmt.tokenizer import Tokenizer

    tokenizer = Tokenizer.load_dir(spm_model.parent)
    if variant == "nmt":
        from nmt.corpus import ParallelText, encode_corpus

        corpus, report = encode_corpus(ParallelText.files(src, tgt), tokenizer, cache, max_len=128, max_len_ratio=3.0, workers=workers)
    else:
        import datasets

        datasets.disable_progress_bars()
        text = datasets.Dataset.from_generator(_pairs, gen_kwargs={"src": str(src), "tgt": str(tgt)}, cache_dir=str(cache))
        encoded = text.with_format("arrow").map(
            _encode_arrow, batched=True, batch_size=50_000, num_proc=workers, remove_columns=["src", "tgt"],
            fn_kwargs={"proto": tokenizer.protos()["joint"], "max_len": 128, "max_len_ratio": 3.0},
        )
        corpus = _ArrowCorpus(encoded.data)
    encoded_s = time.perf_counter() - start
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, 4096, seed=1)
    batch = collate(corpus, sampler.epoch_batches(0)[0])
    return {"pairs_kept": len(corpus.src_lengths), "encode_s": round(encoded_s, 1), "first_batch_s": round(time.perf_counter() - start, 1), "batch_shape": list(batch.tgt_out.shape)}


def _tree_memory(pid: int) -> tuple[float, float]:
    """Proportional set size (Pss) and its anonymous part, in MB, of ``pid`` and all its
    descendants: pages shared by forked workers count once in the sum, not once a process."""
    pss = anon = 0.0
    pending = [pid]
    while pending:
        p = pending.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "Pss":
                        pss += int(value.split()[0]) / 1024
                    elif key == "Pss_Anon":
                        anon += int(value.split()[0]) / 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                pending += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return pss, anon


def compare_with_datasets(args, src: Path, tgt: Path, spm_model: Path, work: Path) -> None:
    """Both variants in child processes, alternating (nmt, datasets, then datasets, nmt, ...),
    each with an empty cache and then with its cache present; memory (Pss) summed over the
    child and its workers every 100 ms."""
    workers = int(args.workers.split(",")[-1])
    for round_ in range(args.compare_datasets):
        for variant in ("nmt", "datasets") if round_ % 2 == 0 else ("datasets", "nmt"):
            cache = work / f"compare_{variant}"
            shutil.rmtree(cache, ignore_errors=True)
            for hit in (False, True):
                cmd = [sys.executable, __file__, "--variant", variant, "--cache", str(cache), "--data", args.data, "--work", args.work, "--workers", str(workers), "--repeats", str(args.repeats)]
                start = time.perf_counter()
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
                peak_rss = peak_anon = 0.0
                while proc.poll() is None:
                    rss, anon = _tree_memory(proc.pid)
                    peak_rss, peak_anon = max(peak_rss, rss), max(peak_anon, anon)
                    time.sleep(0.1)
                result = json.loads(proc.stdout.read().strip().splitlines()[-1])
                ids_bytes = du(cache) if variant == "nmt" else sum(f.stat().st_size for f in cache.rglob("cache-*.arrow"))
                print(json.dumps({"round": round_, "variant": variant, "cache_hit": hit, "workers": workers, **result, "wall_s": round(time.perf_counter() - start, 1),
                                  "cache_bytes": du(cache), "ids_cache_bytes": ids_bytes, "peak_tree_pss_mb": round(peak_rss), "peak_tree_anon_pss_mb": round(peak_anon),
                                  "load_avg_1min": os.getloadavg()[0]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")))
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_data"), help="where the corpus, caches and runs go (git-ignored)")
    parser.add_argument("--repeats", type=int, default=156, help="copies of Multi30k train (156: 4,524,000 pairs)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to compare")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare-datasets", type=int, default=0, metavar="ROUNDS",
                        help="instead: compare nmt's encoding cache with datasets.map(num_proc=workers)'s Arrow cache, ROUNDS alternating rounds")
    parser.add_argument("--variant", choices=("nmt", "datasets"), help=argparse.SUPPRESS)  # one side of the comparison, in a child process
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    data, work = Path(args.data), Path(args.work)
    src, tgt, pairs = build_corpus(data, work / "corpus", args.repeats)
    spm_model = train_tokenizer_once(data, work)
    if args.variant:
        print(json.dumps(prepare_variant(args.variant, src, tgt, spm_model, Path(args.cache), int(args.workers))))
        return
    if args.compare_datasets:
        compare_with_datasets(args, src, tgt, spm_model, work)
        return
    base = {"pairs": pairs, "corpus_bytes": src.stat().st_size + tgt.stat().st_size, "cpus": len(os.sched_getaffinity(0))}
    run_dir = None
    for workers in [int(w) for w in args.workers.split(",")]:
        run_dir = work / f"run_w{workers}"
        shutil.rmtree(run_dir, ignore_errors=True)
        print(json.dumps({**base, "cache_hit": False, **run(args, src, tgt, spm_model, run_dir, workers)}), flush=True)
    # The same run again on the cache the last run wrote: no tokenization.
    again = work / "run_cached"
    shutil.rmtree(again, ignore_errors=True)
    again.mkdir(parents=True)
    shutil.copytree(run_dir / "cache", again / "cache")
    print(json.dumps({**base, "cache_hit": True, **run(args, src, tgt, spm_model, again, workers)}), flush=True)


if __name__ == "__main__":
    main()
