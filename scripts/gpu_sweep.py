"""The sweep step of scripts/gpu_check.py: K configurations of the 5-minute recipe trained at once
on one GPU.

GPU time comes in short, rare calls, so one call tunes the recipe: every configuration of the
sweep file (``configs/sweeps/multi30k_gpu.yaml``: a name and the ``--set`` overrides of
``configs/multi30k_gpu.yaml`` each) trains in a process of its own, all of them concurrently and
for the same time, each reporting its validation BLEU curve. The configuration with the best
validation BLEU (val only: the test sets are never read to choose) then has its best checkpoint,
or the average of its last ones, scored once on every test split.

The runs share the GPU, so each sees about 1/K of it: the curves compare configurations at equal
GPU time, not at what one of them reaches alone in 5 minutes (the multi30k step measures that).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def read_sweep(path: Path) -> list[dict]:
    """The configurations of a sweep file: a YAML list of ``{name, set: [KEY=VALUE, ...]}``.

    Raises:
        SystemExit: (code 2) the file is not such a list, or two entries share a name.
    """
    import yaml

    entries = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(entries, list) or not entries:
        raise SystemExit(f"error: {path}: a sweep is a YAML list of {{name, set}} entries")
    configs, names = [], set()
    for i, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("set", []), list)
        ):
            raise SystemExit(
                f"error: {path}: entry {i} must be {{name: NAME, set: [KEY=VALUE, ...]}}"
            )
        if entry["name"] in names or not entry["name"].replace("_", "").replace("-", "").isalnum():
            raise SystemExit(
                f"error: {path}: entry {i}'s name {entry['name']!r} is repeated or not a plain name"
            )
        names.add(entry["name"])
        configs.append({"name": entry["name"], "set": [str(s) for s in entry.get("set", [])]})
    return configs


def curve(run_dir: Path) -> dict:
    """A run's validation BLEU by step, its steps and median target tokens/s (from
    metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if path.is_file()
        else []
    )
    speeds = sorted(r["tgt_tokens_per_s"] for r in rows if "tgt_tokens_per_s" in r)
    valid = [{"step": r["step"], "bleu": round(r["bleu"], 2)} for r in rows if "bleu" in r]
    return {
        "validations": valid,
        "best_valid_bleu": max((v["bleu"] for v in valid), default=None),
        "steps": max((r["step"] for r in rows), default=0),
        "median_tgt_tokens_per_s": round(speeds[len(speeds) // 2], 1) if speeds else None,
    }


def train_concurrently(
    configs: list[dict],
    common: list[str],
    base: Path,
    work: Path,
    train_s: float,
    limit_s: float,
    env: dict,
) -> dict[str, str]:
    """Start ``nmt train`` for every configuration at once (``common`` and its own ``--set``s), each
    with ``train.max_time_s`` ``train_s``; wait at most ``limit_s`` for all. Returns each run's
    status:
    ``ok``, ``failed`` (its log's last line) or ``timeout`` (its process group killed)."""
    procs = {}
    for c in configs:
        cmd = [
            sys.executable,
            "-m",
            "nmt",
            "train",
            "-c",
            str(base),
            "--run-dir",
            str(work / c["name"]),
        ]
        for s in [*common, f"train.max_time_s={train_s:.0f}", *c["set"]]:
            cmd += ["--set", s]
        # closed below, once the process has ended
        log = open(work / f"{c['name']}.log", "w", encoding="utf-8")
        procs[c["name"]] = (
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            ),
            log,
        )
    deadline, statuses = time.monotonic() + limit_s, {}
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            statuses[name] = (
                "ok" if proc.returncode == 0 else "failed: " + _last_line(work / f"{name}.log")
            )
        except subprocess.TimeoutExpired:
            statuses[name] = "timeout"
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        log.close()
    return statuses


def _last_line(path: Path) -> str:
    lines = [
        line
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
        if line.strip()
    ]
    return lines[-1][:300] if lines else "(no output)"


def chosen(runs: dict[str, dict]) -> str | None:
    """The configuration with the highest validation BLEU (the first of equals, in the file's
    order)."""
    scored = {
        name: r["best_valid_bleu"] for name, r in runs.items() if r["best_valid_bleu"] is not None
    }
    return max(scored, key=scored.get) if scored else None
