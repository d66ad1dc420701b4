#!/usr/bin/env python
"""Every GPU measurement in one command, each step in its own time-limited process.

Steps, in order; each appends one JSON line to the results file as soon as it ends, so a
run cut short keeps what it measured:

  setup     what is installed, and installs only what is missing: wheels from
            gpu_data/wheels where the machine has no network, else ``pip install -e
            ".[bench]"``; its seconds are recorded and not counted in the budget
  env       GPU, torch and CUDA versions; the bf16 matrix-product rate measured now (the
            ceiling for MFU); which scaled_dot_product_attention backends accept nmt's
            masks, and their times
  train     scripts/bench_train.py, the speed table: `base` in bf16 at 25k, 40k and 80k tokens
            a batch, nmt eager and compiled with each loss kernel (whole logits, chunks,
            Liger-Kernel's), Hugging Face MarianMTModel and Eole on the same batches: target
            tokens/s, step time, peak memory, recompiles after warm-up, MFU against env's rate
            and by 6·N against the card's peak
  decode    scripts/bench_decode.py: random `base` in bf16, beam 5, 25 forced pieces, 1, 32,
            64 and 128 sentences a batch: nmt, Hugging Face generate, CTranslate2 float16
  multi30k  ``nmt train -c configs/multi30k_gpu.yaml`` for at most 5 minutes, then the
            average of the last step checkpoints or best.pt, whichever scores higher on
            val, translates test_2016_flickr and test_2017_flickr once: BLEU and chrF
  sweep     only with ``--sweep FILE`` (and then alone, unless ``--only`` says more): the
            recipe's configurations in FILE trained at once on the one GPU, each one's
            validation BLEU curve, and the best on val scored once on the test splits
            (scripts/gpu_sweep.py)

Steps share one budget (``--budget-s``, 8 minutes): each runs under the smaller of its own
limit and what is left, and multi30k's training time shrinks to fit. A step that overruns
is killed with all its processes and recorded as ``timeout`` with what it printed.

``--dry-run`` runs the same steps on the CPU at tiny sizes (what the tests run): bf16
autocast, the fused optimizer, non-blocking copies, the SDPA backend probe, the Hugging
Face and CTranslate2 engines, training, averaging and scoring all run; only the CUDA
kernels and pinned host memory (which a CPU-only torch cannot allocate) are left to the GPU.

Data: ``--data``, else $MULTI30K, else gpu_data/multi30k in the checkout (git-ignored: the
copy that travels to a GPU machine; ``--prepare`` fills it), else ../shared/data/multi30k.
The dry run falls back to the shipped toy corpus (data/toy) when Multi30k is absent.

Usage::

    python scripts/gpu_check.py --prepare                   # here: copy the data, fetch wheels
    scripts/gpu_check.sh --out RESULTS.jsonl                # on the GPU machine
    scripts/gpu_check.sh --dry-run --out /tmp/dry.jsonl     # anywhere, on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
GPU_DATA = ROOT / "gpu_data"
STEPS = ("env", "train", "decode", "multi30k", "sweep")  # sweep: only with --sweep
# Modules every step needs (import name: distribution), then those of the comparison engines.
REQUIRED = {
    "torch": "torch",
    "sentencepiece": "sentencepiece",
    "sacrebleu": "sacrebleu",
    "typer": "typer",
    "yaml": "pyyaml",
    "numpy": "numpy",
    "tqdm": "tqdm",
}
OPTIONAL = {"transformers": "transformers", "ctranslate2": "ctranslate2"}
# The GPU run's training table besides: Liger-Kernel's fused loss (Triton, so a GPU's) and the
# second peer, Eole (installed without its serving and data dependencies, scripts/eole_engine.py).
# Looked for and installed where missing, never required: an engine without its package records
# an error and the table goes on.
GPU_PEERS = {"liger_kernel": "liger-kernel", "eole": "eole", "pyonmttok": "pyonmttok"}
# What --prepare fetches without dependencies (versions that install beside torch 2.13).
PEER_WHEELS = ["ctranslate2", "liger-kernel", "eole==0.6.4", "pyonmttok==1.38.1"]


@dataclass(frozen=True)
class Plan:
    """The sizes of one kind of run: the GPU's, or the dry run's on the CPU."""

    device: str
    budget_s: float  # all steps after setup together
    limits_s: dict[str, float]  # each step's own limit
    matmul_size: int
    train_args: list[str]
    decode_args: list[str]
    multi30k_sets: list[str]  # --set overrides of configs/multi30k_gpu.yaml
    multi30k_train_s: float  # train.max_time_s at most
    # multi30k's time besides training: tokenizer, encoding, validation, averaging, test
    multi30k_reserve_s: float
    eval_lines: int = 0  # sentences of val and test translated when selecting and scoring (0 = all)
    # bench_train.py's engines (nmt-compile last: if compiling overruns, the others are kept)
    train_engines: str = "nmt,hf"
    threads: int = 0  # CPU threads of every step (0: torch's default)


GPU = Plan(
    device="cuda",
    budget_s=480,
    limits_s={"env": 45, "train": 285, "decode": 150},
    matmul_size=8192,
    # the speed table: each engine's process runs the three budgets in turn, lengths rounded to
    # multiples of 8 (bounded shapes: the compiled step stops recompiling after its warm-up);
    # no profile (21 of them would cost a minute; bench_train.py --profile-steps N gives one)
    train_args=[
        "--preset",
        "base",
        "--max-tokens",
        "40000,80000,25000",
        "--steps",
        "12",
        "--warmup",
        "4",
        "--threads",
        "4",
        "--pad-to-multiple",
        "8",
        "--chunk-tokens",
        "8192",
    ],
    # nmt: the production path (the search's whole step of fixed shapes, one CUDA graph a step) in
    # bf16 and fp16; nmt-dynamic: the dynamic cache, what a failed capture falls back to; every
    # engine warms up on every batch first, so graphs are captured before the clock.
    decode_args=[
        "--preset",
        "base",
        "--lines",
        "1000",
        "--beam",
        "5",
        "--forced-len",
        "25",
        "--batch",
        "1,32,64,128",
        "--max-batches",
        "16",
        "--threads",
        "4",
        "--warm-all",
        "--profile",
        "--engines",
        "nmt,nmt@float16,ct2-float16,nmt-dynamic,hf",
    ],
    multi30k_sets=[],
    # eager then compiled × nmt's whole logits, its chunks, Liger-Kernel's fused loss; the peers
    # early, so that a call cut short still compares
    train_engines="nmt,hf,nmt-chunked,eole,nmt-compile-chunked,nmt-liger,nmt-compile",
    multi30k_train_s=300,
    multi30k_reserve_s=75,
)

DRY_VOCAB = "1000"
DRY = Plan(
    device="cpu",
    budget_s=900,
    limits_s={"env": 120, "train": 240, "decode": 240},
    matmul_size=256,
    train_args=[
        "--preset",
        "tiny",
        "--max-tokens",
        "800",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--vocab-size",
        DRY_VOCAB,
        "--chunk-tokens",
        "128",
    ],
    # ct2-int8: a CPU has no float16 kernels in CTranslate2; the conversion is quantised just the
    # same.
    decode_args=[
        "--preset",
        "tiny",
        "--lines",
        "24",
        "--beam",
        "2",
        "--forced-len",
        "3",
        "--batch",
        "1,4,8",
        "--max-batches",
        "3",
        "--threads",
        "1",
        "--vocab-size",
        DRY_VOCAB,
        "--warm-all",
        "--engines",
        # nmt-static: the GPU's path, eager (its CPU twin)
        "nmt,nmt-static,hf,ct2-int8",
    ],
    multi30k_sets=[
        "model.d_model=32",
        "model.d_ff=64",
        "model.n_heads=4",
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        f"tokenizer.vocab_size={DRY_VOCAB}",
        "data.workers=1",
        "data.valid_max_sentences=16",
        "train.threads=1",
        "train.max_steps=6",
        "train.max_tokens=800",
        "train.warmup_steps=2",
        "train.log_every=2",
        "train.validate_every=3",
        "train.save_every=2",
        "train.valid_beam_size=2",
        "train.tensorboard=false",
    ],
    multi30k_train_s=120,
    multi30k_reserve_s=240,
    eval_lines=16,
    # the GPU's loss kernels, their CPU twins: nmt's chunks, Liger's formula on PyTorch's loss
    train_engines="nmt,nmt-chunked,nmt-liger,hf",
    threads=1,
)


def fail(message: str) -> None:
    """Stop with a one-line error and exit code 2 (bad input or an unusable machine)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


@dataclass(frozen=True)
class Data:
    """A corpus directory and the names of its validation and test splits."""

    dir: Path
    valid_split: str
    test_split: str  # the one reported first
    test_splits: tuple[str, ...] = ()  # every test split scored (the first is test_split)

    @classmethod
    def at(cls, directory: Path) -> Data:
        """Multi30k's split names (val; test_2016_flickr and test_2017_flickr) where its files are
        there, else nmt's (valid, test)."""

        def has(split: str) -> bool:
            return any((directory / f"{split}.en{gz}").is_file() for gz in ("", ".gz"))

        tests = tuple(s for s in ("test_2016_flickr", "test_2017_flickr") if has(s)) or ("test",)
        return cls(directory.resolve(), "val" if has("val") else "valid", tests[0], tests)


def find_data(given: str | None, dry_run: bool) -> Data:
    """The Multi30k directory to use (module doc), or the toy corpus in a dry run without one.

    Raises:
        SystemExit: (code 2) no training files there, or, outside a dry run, no Multi30k found.
    """
    candidates = (
        [given]
        if given
        else [
            os.environ.get("MULTI30K"),
            GPU_DATA / "multi30k",
            ROOT.parent / "shared" / "data" / "multi30k",
        ]
    )
    for c in filter(None, candidates):
        if any((Path(c) / name).is_file() for name in ("train.en", "train.en.gz")):
            return Data.at(Path(c))
    if dry_run and not given:
        return Data.at(ROOT / "data" / "toy")
    where = given or "gpu_data/multi30k, $MULTI30K or ../shared/data/multi30k"
    fail(
        f"no Multi30k data (train.en or train.en.gz) in {where}; copy it into gpu_data/multi30k "
        "(python scripts/gpu_check.py --prepare does) or pass --data DIR"
    )


# --------------------------------------------------------------------------- running steps


@dataclass
class Results:
    """The results file (one JSON line per step) and the log of every step's output."""

    path: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # every step's process environment
    lines: list[dict] = field(default_factory=list)

    def add(self, record: dict) -> None:
        self.lines.append(record)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(
            f"[gpu_check] {record['step']}: {record['status']} in {record.get('seconds', 0):.1f} s",
            flush=True,
        )


def run_process(
    cmd: list[str], limit_s: float, log: Path, env: dict[str, str]
) -> tuple[str, float, list[dict], str]:
    """Run ``cmd`` in a process group of its own, stdout and stderr appended to ``log``.

    At ``limit_s`` the whole group (the benchmarks' worker processes too) gets SIGTERM,
    then SIGKILL 10 s later.

    Returns:
        status (``ok``, ``failed`` or ``timeout``), seconds, the JSON objects the process
        printed one a line (those printed before a timeout too), and the last lines of its
        output when it did not succeed. The CPU seconds of the process and its descendants
        are logged.
    """
    cpu_before = _children_cpu_s()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        start_offset = f.tell()
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=max(1.0, limit_s))
            status = "ok" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
            _kill_group(proc)
        seconds = time.monotonic() - started
        f.write(
            f"[gpu_check] {status} in {seconds:.1f} s wall, {_children_cpu_s() - cpu_before:.1f} s "
            "CPU\n"
        )
    text = log.read_bytes()[start_offset:].decode("utf-8", errors="replace")
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                records.append(value)
    tail = "" if status == "ok" else "\n".join(text.strip().splitlines()[-8:])
    return status, seconds, records, tail


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def child_env(site: Path | None, threads: int = 0) -> dict[str, str]:
    """The environment of every step: this checkout's nmt first, no hub downloads, unbuffered
    output; ``threads`` > 0 caps CPU threads (a loaded machine stalls OpenMP's barriers)."""
    paths = (
        [str(ROOT)]
        + ([str(site)] if site else [])
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


# --------------------------------------------------------------------------- setup


def missing_modules(site: Path | None, peers: bool = False) -> list[str]:
    """Distributions whose modules cannot be imported (looked up, not imported); with ``peers``
    those of ``GPU_PEERS`` too."""
    if site and str(site) not in sys.path:
        sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return [
        dist
        for module, dist in {**REQUIRED, **OPTIONAL, **(GPU_PEERS if peers else {})}.items()
        if importlib.util.find_spec(module) is None
    ]


def setup(work: Path, results: Results, peers: bool = False) -> Path | None:
    """Install what is missing (with ``peers``, ``GPU_PEERS`` too), the shortest way; returns the
    folder wheels went into, if any.

    Raises:
        SystemExit: (code 2) a module every step needs is still missing afterwards.
    """
    started = time.monotonic()
    record: dict = {
        "step": "setup",
        "python": sys.executable,
        "python_version": sys.version.split()[0],
    }
    missing = missing_modules(None, peers)
    record["missing"] = missing
    site = None
    wheels = sorted((GPU_DATA / "wheels").glob("*.whl"))
    # a machine with no network: install the wheels copied along, beside the installed packages
    if missing and wheels:
        site = work / "site"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--target",
            str(site),
            *map(str, wheels),
        ]
    elif missing:
        # Keeps an installed torch that satisfies torch>=2.4; gives up quickly where there is no
        # network.
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--retries",
            "1",
            "--timeout",
            "15",
            "-e",
            ".[bench]",
        ]
    if missing:
        record["install"] = " ".join(cmd[3:]).replace(str(GPU_DATA) + "/", "")
        status, _, _, tail = run_process(cmd, 900, results.log, child_env(None))
        record["install_status"] = status
        if tail:
            record["install_error"] = tail
    still = missing_modules(site, peers)
    record.update(still_missing=still, seconds=round(time.monotonic() - started, 1))
    record["status"] = "failed" if set(still) & set(REQUIRED.values()) else "ok"
    results.add(record)
    if record["status"] != "ok":
        fail(
            f"{', '.join(still)} missing after setup; install them (pip install -e '.[bench]'), or "
            "put their wheels in gpu_data/wheels"
        )
    return site


# --------------------------------------------------------------------------- the steps


def step_env(plan: Plan, run) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--probe-env",
        "--device",
        plan.device,
        "--matmul-size",
        str(plan.matmul_size),
    ]
    return run("env", cmd, plan.limits_s["env"])


def step_train(plan: Plan, data: Data, ceiling_tflops: float | None, engines: str, run) -> dict:
    cmd = [
        sys.executable,
        str(SCRIPTS / "bench_train.py"),
        "--data",
        str(data.dir),
        "--device",
        plan.device,
        "--precision",
        "bf16",
        "--rounds",
        "1",
        "--engines",
        engines,
        "--matmul-size",
        str(plan.matmul_size),
        *plan.train_args,
    ]
    if ceiling_tflops:
        cmd += ["--ceiling-tflops", str(ceiling_tflops)]
    return run("train", cmd, plan.limits_s["train"])


def step_decode(plan: Plan, data: Data, run) -> dict:
    cmd = [
        sys.executable,
        str(SCRIPTS / "bench_decode.py"),
        "--data",
        str(data.dir),
        "--split",
        data.test_split,
        "--device",
        plan.device,
        "--dtype",
        "bfloat16",
        "--latency-sentences",
        "0",
        *plan.decode_args,
    ]
    return run("decode", cmd, plan.limits_s["decode"])


def training_time(plan: Plan, left_s: float, step: str, results: Results) -> tuple[float, dict]:
    """The recipe's training time the budget allows (at most the plan's), and the record of ``step``
    skipped for lack of it (added to ``results``), or ``{}``."""
    train_s = min(plan.multi30k_train_s, left_s - plan.multi30k_reserve_s)
    if train_s >= 30:
        return train_s, {}
    record = {
        "step": step,
        "status": "skipped",
        "seconds": 0.0,
        "error": f"{left_s:.0f} s of the budget left: too little to train",
    }
    results.add(record)
    return train_s, record


def step_multi30k(
    plan: Plan, data: Data, work: Path, left_s: float, extra_sets: list[str], results: Results
) -> dict:
    """Train with configs/multi30k_gpu.yaml for what the budget allows (at most the plan's
    training time), then select and score a checkpoint; one record for both."""
    train_s, skipped = training_time(plan, left_s, "multi30k", results)
    if skipped:
        return skipped
    run_dir = work / "multi30k"
    sets = [
        f"data.dir={data.dir}",
        f"data.valid_split={data.valid_split}",
        f"train.device={plan.device}",
        f"train.max_time_s={train_s:.0f}",
        *plan.multi30k_sets,
        *extra_sets,
    ]
    cmd = [
        sys.executable,
        "-m",
        "nmt",
        "train",
        "-c",
        str(ROOT / "configs" / "multi30k_gpu.yaml"),
        "--run-dir",
        str(run_dir),
    ]
    for s in sets:
        cmd += ["--set", s]
    started = time.monotonic()
    status, seconds, printed, tail = run_process(
        cmd, train_s + plan.multi30k_reserve_s, results.log, results.env
    )
    record: dict = {
        "step": "multi30k",
        "data": str(data.dir),
        "train_time_limit_s": round(train_s),
        "train_status": status,
        "train_process_s": round(seconds, 1),
    }
    if printed:  # nmt train's last line: the final validation, steps, seconds
        done = printed[-1]
        record.update(
            steps=done.get("step"),
            train_seconds=round(done.get("train_seconds", 0.0), 1),
            best_valid_bleu=done.get("best_bleu"),
        )
    record.update(training_figures(run_dir))
    statuses = [status]
    if tail:
        record["error"] = tail
    if (run_dir / "best.pt").is_file():
        left = plan.multi30k_reserve_s + train_s - (time.monotonic() - started)
        cmd = [
            sys.executable,
            __file__,
            "--select",
            str(run_dir),
            "--data",
            str(data.dir),
            "--valid-split",
            data.valid_split,
            "--test-split",
            ",".join(data.test_splits or (data.test_split,)),
            "--device",
            plan.device,
            "--eval-lines",
            str(plan.eval_lines),
        ]
        status, _, selected, tail = run_process(cmd, max(30.0, left), results.log, results.env)
        statuses.append(status)
        if selected:
            record.update(selected[-1])
        if tail:
            record["error"] = tail
    record["seconds"] = round(time.monotonic() - started, 1)
    not_ok = [s for s in statuses if s != "ok"]
    record["status"] = not_ok[0] if not_ok else "ok" if "test_bleu" in record else "failed"
    results.add(record)
    return record


def step_sweep(
    plan: Plan, data: Data, work: Path, left_s: float, sweep_file: Path, results: Results
) -> dict:
    """Train the sweep's configurations of the recipe at once for what the budget allows, then score
    the one with the best validation BLEU on every test split (scripts/gpu_sweep.py); one record."""
    sys.path.insert(0, str(SCRIPTS))
    from gpu_sweep import chosen, curve, read_sweep, train_concurrently

    configs = read_sweep(sweep_file)
    train_s, skipped = training_time(plan, left_s, "sweep", results)
    if skipped:
        return skipped
    started, runs_dir = time.monotonic(), work / "sweep"
    runs_dir.mkdir(parents=True, exist_ok=True)
    common = [
        f"data.dir={data.dir}",
        f"data.valid_split={data.valid_split}",
        f"train.device={plan.device}",
        *plan.multi30k_sets,
    ]
    base = ROOT / "configs" / "multi30k_gpu.yaml"
    statuses = train_concurrently(
        configs, common, base, runs_dir, train_s, train_s + plan.multi30k_reserve_s / 2, results.env
    )
    runs = {
        c["name"]: {"set": c["set"], "status": statuses[c["name"]], **curve(runs_dir / c["name"])}
        for c in configs
    }
    record: dict = {
        "step": "sweep",
        "file": str(sweep_file),
        "concurrent": len(configs),
        "train_time_limit_s": round(train_s),
        "runs": runs,
    }
    best = chosen(runs)
    record["chosen"] = best
    if best is not None and (runs_dir / best / "best.pt").is_file():
        cmd = [
            sys.executable,
            __file__,
            "--select",
            str(runs_dir / best),
            "--data",
            str(data.dir),
            "--valid-split",
            data.valid_split,
        ]
        cmd += [
            "--test-split",
            ",".join(data.test_splits or (data.test_split,)),
            "--device",
            plan.device,
            "--eval-lines",
            str(plan.eval_lines),
        ]
        left = max(30.0, left_s - (time.monotonic() - started))
        status, _, selected, tail = run_process(cmd, left, results.log, results.env)
        if selected:
            record["selection"] = selected[-1]
        if tail:
            record["error"] = tail
        record["status"] = "ok" if status == "ok" and selected else status
    else:
        record["status"] = "failed"
        record["error"] = "no configuration validated: " + "; ".join(
            f"{k}: {v['status']}" for k, v in runs.items()
        )
    record["seconds"] = round(time.monotonic() - started, 1)
    results.add(record)
    return record


def decode_words(decode: dict) -> str:
    """A chosen decoding setting in words: "length α 1.5, exact"."""
    rule = f"patience {decode['patience']:g}" if decode.get("patience") else "exact"
    return f"{decode['length_normalization']} α {decode['length_penalty']:g}, {rule}"


def sweep_summary(r: dict) -> list[str]:
    """The sweep record's lines of the summary: each configuration's curve, and the chosen one's
    test scores."""
    out = [
        f"sweep: {r.get('concurrent')} configurations at once for {r.get('train_time_limit_s')} s "
        f"(each about 1/{r.get('concurrent')} of the GPU)"
    ]
    for name, run in r.get("runs", {}).items():
        curve = " ".join(f"{v['step']}:{v['bleu']}" for v in run["validations"])
        out.append(
            f"  {name:<16} {run['status']:<8} steps {run['steps']:>6}  val BLEU {curve}  "
            f"({' '.join(run['set']) or 'the recipe as it is'})"
        )
    selection = r.get("selection", {})
    if selection:
        tests = "; ".join(
            f"{k} BLEU {v['bleu']} chrF {v['chrf']}" for k, v in selection.get("tests", {}).items()
        )
        out.append(
            f"  chosen on val: {r['chosen']} ({selection['selected']}, "
            f"{decode_words(selection['decode'])}): {tests}"
        )
    return out


def training_figures(run_dir: Path) -> dict:
    """Median logged target tokens/s and the last validation of ``run_dir/metrics.jsonl``."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    speeds = sorted(r["tgt_tokens_per_s"] for r in rows if "tgt_tokens_per_s" in r)
    valid = [r for r in rows if "bleu" in r]
    out = {}
    if speeds:
        out["median_tgt_tokens_per_s"] = round(speeds[len(speeds) // 2], 1)
    if valid:
        out["validations"] = [{"step": r["step"], "bleu": round(r["bleu"], 2)} for r in valid]
    return out


# --------------------------------------------------------------------------- work done inside step
# processes


def probe_env(device_name: str, matmul_size: int) -> None:
    """Print versions, the device and the bf16 matrix-product rate, then the SDPA backends' times
    (env step)."""
    import platform

    import torch

    sys.path.insert(0, str(SCRIPTS))
    from bench_train import matmul_ceiling

    device = torch.device(device_name)
    record: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": device_name,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        record.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
        )
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run(
                [
                    smi,
                    "--query-gpu=driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            record["nvidia_smi"] = out.stdout.strip()
    record["matmul_size"] = matmul_size
    record["bf16_matmul_tflops"] = float(
        f"{matmul_ceiling(device, torch.bfloat16, matmul_size) / 1e12:.4g}"
    )
    print(json.dumps(record), flush=True)  # kept even if the attention probe below breaks
    print(json.dumps({"sdpa_ms": sdpa_probe(device, small=device.type != "cuda")}), flush=True)


def sdpa_probe(device, small: bool) -> dict:
    """Time of each scaled_dot_product_attention backend on nmt's three attention shapes in
    bf16 (``base``: 8 heads of 64), in ms, or why the backend refused them.

    Shapes: the encoder's self-attention under a ``(batch, 1, 1, src_len)`` key mask and the
    decoder's causal self-attention, forward and backward; a decoding step's cross-attention,
    five beams' queries folded into the query axis, under the key mask, forward only.
    ``default`` is torch's own choice.
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(SCRIPTS))
    from bench_train import sync

    batch, length, heads, head_dim, beam = (4, 8, 2, 16, 2) if small else (256, 32, 8, 64, 5)
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, grad=False):
        return torch.randn(
            *shape, device=device, dtype=torch.bfloat16, generator=gen
        ).requires_grad_(grad)

    mask = torch.arange(length, device=device) < torch.randint(
        length // 2, length + 1, (batch, 1, 1, 1), device=device, generator=gen
    )
    cases = {
        "encoder_key_mask": (
            lambda: [rand(batch, heads, length, head_dim, grad=True) for _ in range(3)],
            {"attn_mask": mask},
            True,
        ),
        "decoder_causal": (
            lambda: [rand(batch, heads, length, head_dim, grad=True) for _ in range(3)],
            {"is_causal": True},
            True,
        ),
        "decode_cross_beams": (
            lambda: [
                rand(batch, heads, beam, head_dim),
                rand(batch, heads, length, head_dim),
                rand(batch, heads, length, head_dim),
            ],
            {"attn_mask": mask},
            False,
        ),
    }
    backends = {
        "default": None,
        **{
            name.lower(): getattr(SDPBackend, name)
            for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
        },
    }
    out: dict = {}
    for case, (make, kwargs, backward) in cases.items():
        q, k, v = make()
        out[case] = {}
        for name, backend in backends.items():
            try:
                times = []
                for _ in range(6):
                    sync(device)
                    t = time.perf_counter()
                    with (
                        sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
                    ):
                        y = F.scaled_dot_product_attention(q, k, v, **kwargs)
                        if backward:
                            y.sum().backward()
                    sync(device)
                    times.append(time.perf_counter() - t)
                out[case][name] = round(sorted(times[1:])[len(times[1:]) // 2] * 1e3, 4)
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                out[case][name] = "refused: " + str(exc).strip().splitlines()[0][:160]
    return out


# What the selection tries on val besides the checkpoint's own decoding setting (the grid of
# scripts/train_recipe.sh, which chose patience 1 α 2.0 on the CPU recipe; None: the exact rule).
DECODE_GRID = {"normalizations": ["length"], "alphas": [1.0, 1.5, 2.0], "patiences": [None, 1]}


def select_and_score(
    run_dir: Path,
    data_dir: Path,
    valid_split: str,
    test_split: str,
    device_name: str,
    eval_lines: int,
    last: int = 5,
) -> dict:
    """Average the newest ``last`` step checkpoints, keep that or best.pt (whichever has the
    higher val BLEU), choose its length normalisation, α and stopping rule (exact or patience 1)
    on val too (``DECODE_GRID``: the exact search ranks differently from the one the recipe's α
    was first chosen under), and score its translations of each test split (``test_split``,
    comma-separated) once: the multi30k step's second half."""
    import torch

    from nmt.data.corpus import find_split_file, read_lines
    from nmt.runs.runid import step_checkpoints
    from nmt.scoring.evaluate import score
    from nmt.tools.average import average_checkpoints
    from nmt.tools.tune import grid, tune_decode
    from nmt.translation.inference import Decoding, Inference

    device = torch.device(device_name)

    def lines(split: str, lang: str) -> list[str]:
        text = read_lines(find_split_file(data_dir, split, lang))
        return text[:eval_lines] if eval_lines else text

    def bleu(path: Path, split: str, cache: str = "auto", **chosen_decode) -> dict:
        inference = Inference.load([path], device)
        decode = replace(inference.cfg.decode, cache=cache, **chosen_decode)
        sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        sync()
        start = time.perf_counter()
        hyps = inference.best_strings(inference.translate(lines(split, "en"), Decoding(decode)))
        sync()
        return {**score(hyps, [lines(split, "de")]), "seconds": time.perf_counter() - start}

    started = time.perf_counter()
    candidates = {"best": run_dir / "best.pt"}
    steps = step_checkpoints(run_dir)[-last:]
    if len(steps) > 1:
        average_checkpoints(steps, run_dir / "average.pt")
        candidates["average"] = run_dir / "average.pt"
    valid = {name: bleu(path, valid_split)["bleu"] for name, path in candidates.items()}
    chosen = max(valid, key=valid.get)
    inference = Inference.load([candidates[chosen]], device)
    own = inference.cfg.decode
    settings = grid(
        [own.beam_size],
        [
            own.length_normalization,
            *(n for n in DECODE_GRID["normalizations"] if n != own.length_normalization),
        ],
        [own.length_penalty, *(a for a in DECODE_GRID["alphas"] if a != own.length_penalty)],
        [own.patience, *(p for p in DECODE_GRID["patiences"] if p != own.patience)],
    )
    rows = tune_decode(inference, lines(valid_split, "en"), lines(valid_split, "de"), own, settings)
    best_row = max(rows, key=lambda row: row["bleu"])  # ties: the first, the config's own first
    decode = {k: best_row[k] for k in ("length_normalization", "length_penalty", "patience")}
    splits = test_split.split(",")  # scored once each, the chosen checkpoint only
    tests = {split: bleu(candidates[chosen], split, **decode) for split in splits}
    test_split, test = splits[0], tests[splits[0]]
    # the same search with the dynamic cache: the same BLEU, in its time
    dynamic = bleu(candidates[chosen], test_split, "dynamic", **decode)
    return {
        "tests": {
            split: {
                "lines": len(lines(split, "en")),
                "bleu": round(t["bleu"], 2),
                "chrf": round(t["chrf"], 2),
            }
            for split, t in tests.items()
        },
        "averaged": [p.name for p in steps] if "average" in candidates else [],
        "valid_bleu": {k: round(v, 2) for k, v in valid.items()},
        "selected": chosen,
        # chosen on val: the checkpoint's own setting first, then the grid's
        "decode": decode,
        "decode_valid_bleu": {decode_words(r): round(r["bleu"], 2) for r in rows},
        "test_split": test_split,
        "test_lines": len(lines(test_split, "en")),
        "test_bleu": round(test["bleu"], 2),
        "test_chrf": round(test["chrf"], 2),
        "test_decode_s": round(test["seconds"], 2),
        "test_bleu_dynamic_cache": round(dynamic["bleu"], 2),
        "test_decode_s_dynamic_cache": round(dynamic["seconds"], 2),
        "bleu_signature": test["bleu_signature"],
        "chrf_signature": test["chrf_signature"],
        "select_and_score_s": round(time.perf_counter() - started, 1),
    }


# --------------------------------------------------------------------------- preparing a GPU
# machine's copy


def prepare(source: str | None, python_version: str) -> None:
    """Copy Multi30k into gpu_data/multi30k and fetch the wheels the GPU machine lacks into
    gpu_data/wheels: CTranslate2 and ``GPU_PEERS`` (its image has torch, Triton and
    transformers), each without dependencies (eole's would pull another torch), and pydantic
    with its own (eole's configs need it)."""
    src = Path(source or os.environ.get("MULTI30K") or ROOT.parent / "shared" / "data" / "multi30k")
    if not (src / "train.en.gz").is_file():
        fail(f"{src} holds no Multi30k (train.en.gz); pass --data DIR")
    dest = GPU_DATA / "multi30k"
    dest.mkdir(parents=True, exist_ok=True)
    # contents only: a read-only source's permissions would block the next --prepare
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, dest / f.name)
    wheels = GPU_DATA / "wheels"
    platforms = [
        arg
        for tag in (
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
        )
        for arg in ("--platform", tag)
    ]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(wheels),
    ]
    subprocess.run([*cmd, "--no-deps", *PEER_WHEELS], check=True)
    subprocess.run([*cmd, "pydantic>=2"], check=True)
    size = sum(p.stat().st_size for p in GPU_DATA.rglob("*") if p.is_file())
    print(
        f"gpu_data: {size / 2**20:.1f} MiB ({dest}, "
        f"{', '.join(p.name for p in wheels.glob('*.whl'))})"
    )


# --------------------------------------------------------------------------- main


def summary(lines: list[dict]) -> str:
    """A short table of the headline figures."""
    out = []
    for r in lines:
        if r["step"] == "env" and "bf16_matmul_tflops" in r:
            out.append(
                f"env: {r.get('gpu', r['device'])}, torch {r['torch']}, CUDA {r['cuda']}, bf16 "
                f"matmul {r['bf16_matmul_tflops']} TFLOP/s"
            )
        for e in r.get("records", []):
            if r["step"] == "train" and "tgt_tokens_per_s" in e:
                six_n = f" (6N {e['mfu_6n']:.1%})" if e.get("mfu_6n") is not None else ""
                out.append(
                    f"train {e['engine']:<19} {e['max_tokens']:>6} tok/batch "
                    f"{e['tgt_tokens_per_s']:>10,.0f} tgt tok/s  step {e['step_time_s']} s  "
                    f"MFU {e['mfu']:.1%}{six_n}  "
                    f"{e.get('cuda_max_allocated_mb', e['peak_rss_mb'])} MB  "
                    f"recompiles {e.get('recompiles_after_warmup', 0)}"
                )
            elif r["step"] == "train" and "ratios" in e:
                out += [f"train {k}: {v}" for k, v in e["ratios"].items() if "products" not in k]
            elif r["step"] == "decode" and "sentences_per_s" in e:
                memory = (
                    f"  peak {e['cuda_max_allocated_bytes'] / 2**30:.2f} GiB"
                    if "cuda_max_allocated_bytes" in e
                    else ""
                )
                out.append(
                    f"decode {e['engine']:<14} {e['dtype']:<8} batch {e['batch_sentences']:>4}  "
                    f"{e['sentences_per_s']:>10,.1f} sentences/s{memory}"
                )
            elif "error" in e:
                out.append(f"{r['step']} {e.get('engine', '')}: error {e['error']}")
        table = [e for e in r.get("records", []) if r["step"] == "train" and "engine" in e]
        fastest = max(
            (e for e in table if e["engine"].startswith("nmt") and "tgt_tokens_per_s" in e),
            key=lambda e: e["tgt_tokens_per_s"],
            default=None,
        )
        if fastest:  # every nmt engine computes nmt's loss: the fastest is the default to take
            out.append(
                f"train fastest nmt setting: {fastest['engine']} ({fastest['loss_kernel']}) at "
                f"{fastest['max_tokens']} tokens a batch, {fastest['tgt_tokens_per_s']:,.0f} "
                "tgt tok/s"
            )
        if r["step"] == "multi30k" and "test_bleu" in r:
            others = "; ".join(
                f"{k} BLEU {v['bleu']}"
                for k, v in r.get("tests", {}).items()
                if k != r["test_split"]
            )
            out.append(
                f"multi30k: {r.get('steps')} steps in {r.get('train_seconds', 0):.0f} s, "
                f"{r['selected']} ({decode_words(r['decode'])}): {r['test_split']} BLEU "
                f"{r['test_bleu']} chrF {r['test_chrf']} "
                f"in {r.get('test_decode_s')} s "
                f"(dynamic cache: BLEU {r.get('test_bleu_dynamic_cache')} in "
                f"{r.get('test_decode_s_dynamic_cache')} s){'; ' + others if others else ''}"
            )
        if r["step"] == "sweep":
            out += sweep_summary(r)
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny sizes on the CPU: proves every step before a GPU is spent on it",
    )
    p.add_argument(
        "--out",
        default=None,
        help="results file, one JSON line per step (default WORK/results.jsonl); the log goes "
        "beside it (.log)",
    )
    p.add_argument(
        "--work",
        default=None,
        help="folder for the training run and installed wheels (default runs/gpu_check/UTC-TIME)",
    )
    p.add_argument("--data", default=None, help="Multi30k directory (see above)")
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated subset of {','.join(STEPS)} (default: all; --sweep: only sweep)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for all steps after setup (default 480; dry run 900)",
    )
    p.add_argument(
        "--train-engines",
        default=None,
        help="bench_train.py engines of the train step (default: nmt,hf,nmt-compile-loss,"
        "nmt-compile; dry run nmt,hf; nmt-compile: torch.compile; nmt-compile-loss: the loss "
        "compiled)",
    )
    p.add_argument(
        "--multi30k-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override configs/multi30k_gpu.yaml in the multi30k step (repeatable)",
    )
    p.add_argument(
        "--sweep",
        default=None,
        metavar="FILE",
        help="train the configurations of FILE (e.g. configs/sweeps/multi30k_gpu.yaml) at once and "
        "score the best on val (the sweep step)",
    )
    p.add_argument(
        "--prepare",
        action="store_true",
        help="copy the data into gpu_data/ and fetch wheels for the GPU machine, then stop",
    )
    p.add_argument(
        "--wheel-python", default="3.12", help="with --prepare: the GPU machine's Python version"
    )
    p.add_argument("--probe-env", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--select", default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--matmul-size", type=int, default=8192, help=argparse.SUPPRESS)
    p.add_argument("--valid-split", default="val", help=argparse.SUPPRESS)
    p.add_argument("--test-split", default="test_2016_flickr", help=argparse.SUPPRESS)
    p.add_argument("--eval-lines", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare:
        prepare(args.data, args.wheel_python)
        return
    if args.probe_env:
        probe_env(args.device, args.matmul_size)
        return
    if args.select:
        print(
            json.dumps(
                select_and_score(
                    Path(args.select),
                    Path(args.data),
                    args.valid_split,
                    args.test_split,
                    args.device,
                    args.eval_lines,
                )
            ),
            flush=True,
        )
        return

    plan = DRY if args.dry_run else GPU
    only = [
        s.strip()
        for s in (args.only or ("sweep" if args.sweep else ",".join(STEPS[:-1]))).split(",")
        if s.strip()
    ]
    if "sweep" in only and not args.sweep:
        fail("--only sweep needs --sweep FILE (a YAML list of {name, set})")
    unknown = sorted(set(only) - set(STEPS))
    if unknown:
        fail(f"--only {','.join(unknown)}: not a step; choose from {','.join(STEPS)}")
    data = find_data(args.data, args.dry_run)
    work = Path(
        args.work or ROOT / "runs" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    ).resolve()
    if (work / "multi30k").exists():
        fail(f"{work} holds an earlier check's run; choose another --work")
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or work / "results.jsonl").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    results = Results(out, out.with_suffix(".log"))
    print(
        f"[gpu_check] {'dry run on the CPU' if args.dry_run else 'GPU run'}; data {data.dir}; "
        f"results {out}; log {results.log}",
        flush=True,
    )

    site = setup(work, results, peers=not args.dry_run)
    results.env = child_env(site, plan.threads)
    budget_s = args.budget_s or plan.budget_s
    deadline = time.monotonic() + budget_s

    def run(name: str, cmd: list[str], limit_s: float) -> dict:
        limit = min(limit_s, deadline - time.monotonic())
        if limit < 5:
            record = {
                "step": name,
                "status": "skipped",
                "seconds": 0.0,
                "error": "the budget is spent",
            }
        else:
            status, seconds, records, tail = run_process(cmd, limit, results.log, results.env)
            record = {
                "step": name,
                "status": status,
                "seconds": round(seconds, 1),
                "limit_s": round(limit),
            }
            if name == "env":
                for r in records:
                    record.update(r)
            else:
                record["records"] = records
            if tail:
                record["error"] = tail
        results.add(record)
        return record

    ceiling = None
    if "env" in only:
        env = step_env(plan, run)
        ceiling = env.get("bf16_matmul_tflops")
        if not args.dry_run and env.get("cuda_available") is False:
            fail(
                f"this torch ({env.get('torch', 'not importable')}) sees no CUDA device; install a "
                "CUDA build of torch"
            )
    if "train" in only:
        step_train(plan, data, ceiling, args.train_engines or plan.train_engines, run)
    if "decode" in only:
        step_decode(plan, data, run)
    if "multi30k" in only:
        step_multi30k(plan, data, work, deadline - time.monotonic(), args.multi30k_set, results)
    if "sweep" in only:
        step_sweep(plan, data, work, deadline - time.monotonic(), Path(args.sweep), results)
    print(summary(results.lines), flush=True)
    failed = [
        r["step"]
        for r in results.lines
        if r["status"] != "ok" or any("error" in e for e in r.get("records", []))
    ]
    if failed:
        print(f"[gpu_check] not ok: {', '.join(failed)} (details in {results.log})", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
