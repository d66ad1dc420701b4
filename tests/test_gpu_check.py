"""Tests for scripts/gpu_check.py: its dry run (every step of the GPU run, on the CPU) and its
process handling."""

import base64
import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_step_over_its_limit_is_killed_with_its_children_and_keeps_what_it_printed(
    gpu_check, tmp_path
):
    # The step prints a record and its grandchild's pid, then outlives its 2 s limit.
    code = (
        "import json, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(json.dumps({'measured': 1, 'grandchild': child.pid}), flush=True)\n"
        "time.sleep(120)\n"
    )
    log = tmp_path / "log"
    started = time.monotonic()
    status, _, records, tail = gpu_check.run_process(
        [sys.executable, "-c", code], 2.0, log, dict(os.environ)
    )
    assert status == "timeout"
    assert time.monotonic() - started < 30
    assert records[0]["measured"] == 1
    deadline = time.monotonic() + 10
    while _alive(records[0]["grandchild"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(records[0]["grandchild"])
    assert tail  # the last lines of the output come with a step that did not succeed


def test_a_failing_step_reports_failed_and_its_last_lines(gpu_check, tmp_path):
    status, _, records, tail = gpu_check.run_process(
        [sys.executable, "-c", "print('{\"partial\": 2}'); raise SystemExit('boom')"],
        30,
        tmp_path / "log",
        dict(os.environ),
    )
    assert status == "failed"
    assert records == [{"partial": 2}]
    assert "boom" in tail


def _write_wheel(directory: Path) -> None:
    """A one-module pure-Python wheel, ``gpucheck_probe`` (``VALUE = 7``), as pip builds them."""
    files = {
        "gpucheck_probe/__init__.py": b"VALUE = 7\n",
        "gpucheck_probe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: "
        b"gpucheck-probe\nVersion: 0.1\n",
        "gpucheck_probe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: "
        b"test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    files["gpucheck_probe-0.1.dist-info/RECORD"] = (
        record + "gpucheck_probe-0.1.dist-info/RECORD,,\n"
    ).encode()
    directory.mkdir(parents=True)
    with zipfile.ZipFile(directory / "gpucheck_probe-0.1-py3-none-any.whl", "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)


def test_setup_installs_only_what_is_missing_from_copied_wheels_without_an_index(
    gpu_check, tmp_path, monkeypatch
):
    monkeypatch.setattr(gpu_check, "GPU_DATA", tmp_path / "gpu_data")
    monkeypatch.setattr(
        gpu_check, "OPTIONAL", {**gpu_check.OPTIONAL, "gpucheck_probe": "gpucheck-probe"}
    )
    # setup puts the install folder on this process's path
    monkeypatch.setattr(sys, "path", list(sys.path))
    _write_wheel(tmp_path / "gpu_data" / "wheels")
    work = tmp_path / "work"
    work.mkdir()
    results = gpu_check.Results(tmp_path / "results.jsonl", tmp_path / "results.log")
    site = gpu_check.setup(work, results)
    assert site == work / "site"
    (line,) = [json.loads(x) for x in results.path.read_text().splitlines()]
    assert line["step"] == "setup" and line["status"] == "ok" and line["install_status"] == "ok"
    assert line["missing"] == ["gpucheck-probe"] and line["still_missing"] == []
    assert "--no-index" in line["install"]
    # every step's process finds it
    out = subprocess.run(
        [sys.executable, "-c", "import gpucheck_probe; print(gpucheck_probe.VALUE)"],
        env=gpu_check.child_env(site),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "7"
    # nothing missing: nothing installed
    assert gpu_check.setup(work, results) is None
    assert "install" not in json.loads(results.path.read_text().splitlines()[-1])


def test_data_falls_back_to_the_toy_corpus_only_in_a_dry_run(
    gpu_check, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(gpu_check, "GPU_DATA", tmp_path / "gpu_data")
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path / "repo" / "checkout")  # no ../shared beside it
    monkeypatch.delenv("MULTI30K", raising=False)
    toy = gpu_check.find_data(None, dry_run=True)
    assert (toy.dir, toy.valid_split, toy.test_split) == (
        tmp_path / "repo" / "checkout" / "data" / "toy",
        "valid",
        "test",
    )
    for given, dry_run in ((None, False), (str(tmp_path / "missing"), True)):
        with pytest.raises(SystemExit) as stop:
            gpu_check.find_data(given, dry_run=dry_run)
        assert stop.value.code == 2
        assert "no Multi30k data" in capsys.readouterr().err
    m30k = tmp_path / "gpu_data" / "multi30k"
    m30k.mkdir(parents=True)
    for name in ("train.en.gz", "val.en.gz", "test_2016_flickr.en.gz"):
        (m30k / name).write_bytes(b"")
    found = gpu_check.find_data(None, dry_run=False)
    assert (found.dir, found.valid_split, found.test_split) == (m30k, "val", "test_2016_flickr")


@pytest.mark.slow
def test_dry_run_runs_every_step_of_the_gpu_run(tmp_path, gpu_check):
    """scripts/gpu_check.sh --dry-run: one result line per step, in order, each ok, with the figures
    the GPU run reports."""
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--dry-run",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, (
        proc.stdout[-3000:]
        + proc.stderr[-3000:]
        + (out.with_suffix(".log").read_text()[-3000:] if out.with_suffix(".log").exists() else "")
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in lines] == ["setup", "env", "train", "decode", "multi30k"]
    assert all(r["status"] == "ok" for r in lines), lines
    setup, env_, train, decode, m30k = lines

    assert setup["still_missing"] == []
    assert env_["device"] == "cpu" and env_["bf16_matmul_tflops"] > 0
    for case in ("encoder_key_mask", "decoder_causal", "decode_cross_beams"):
        assert isinstance(env_["sdpa_ms"][case]["default"], float) and isinstance(
            env_["sdpa_ms"][case]["math"], float
        )

    engines = {r["engine"]: r for r in train["records"] if "engine" in r}
    assert set(engines) == {"nmt", "nmt-chunked", "nmt-liger", "hf"}
    # the GPU's loss kernels' CPU twins score the first batch as nmt's whole logits do
    for twin in ("nmt-chunked", "nmt-liger"):
        assert engines[twin]["first_step_loss"] == pytest.approx(
            engines["nmt"]["first_step_loss"], rel=1e-5
        )
    assert engines["nmt-chunked"]["loss_kernel"] == "nmt, chunks of 128"
    assert all(r["mfu_6n"] is None for r in engines.values())  # a CPU has no published peak
    for r in engines.values():
        assert (
            r["precision"] == "bf16"
            and r["steps"] == 2
            and r["matmul_ceiling_tflops"] == pytest.approx(env_["bf16_matmul_tflops"], rel=1e-3)
        )
        # the token budget, padding included, bounds the targets
        assert r["tgt_tokens_per_step"] <= 800
        # a random model's loss is near ln(vocab)
        assert abs(r["first_step_loss"] - math.log(1000)) < 1.5
        assert r["mfu"] == pytest.approx(
            r["tflops_per_s"] / r["matmul_ceiling_tflops"], rel=0.05, abs=1e-3
        )
    assert engines["nmt"]["parameters"] == engines["hf"]["parameters"]  # the same weights

    by_key = {(r["engine"], r["batch_sentences"]): r for r in decode["records"]}
    assert set(by_key) == {
        (e, b) for e in ("nmt", "nmt-static", "hf", "ct2-int8") for b in (1, 4, 8)
    }
    # the GPU's step of fixed shapes, eager on the CPU, generates what the dynamic cache does
    for batch in (1, 4, 8):
        assert (
            by_key[("nmt-static", batch)]["outputs_digest"]
            == by_key[("nmt", batch)]["outputs_digest"]
        )
    for (_engine, batch), r in by_key.items():
        # --max-batches 3 of 24 sentences: 3 batches of each size, 24 at most
        assert r["sentences"] == min(24, 3 * batch)
        # every engine generated exactly the 3 forced pieces
        assert r["tgt_tokens_per_s"] == pytest.approx(3 * r["sentences_per_s"], rel=0.02)
    assert (
        by_key[("nmt", 8)]["self_cache_bytes_measured"]
        == by_key[("nmt", 8)]["self_cache_bytes_formula"]
    )

    assert m30k["steps"] == 6 and [v["step"] for v in m30k["validations"]] == [3, 6]
    assert m30k["averaged"] == ["step_2.pt", "step_4.pt", "step_6.pt"]
    assert set(m30k["valid_bleu"]) == {"best", "average"} and m30k["selected"] == max(
        m30k["valid_bleu"], key=m30k["valid_bleu"].get
    )
    assert (
        m30k["test_lines"] == 16 and 0 <= m30k["test_bleu"] <= 100 and 0 < m30k["test_chrf"] <= 100
    )
    assert "tok:13a" in m30k["bleu_signature"]
    assert m30k["test_bleu_dynamic_cache"] == m30k["test_bleu"] and m30k["test_decode_s"] > 0
    # the decoding setting chosen on val: the recipe's own (length α 0.6, patience 1) first, then
    # α 0.6, 1.0, 1.5, 2.0 × patience 1 and the exact rule: 8 settings, the best kept
    tried = m30k["decode_valid_bleu"]
    assert len(tried) == 8 and next(iter(tried)) == "length α 0.6, patience 1"
    assert "length α 2, exact" in tried
    chosen = gpu_check.decode_words(m30k["decode"])
    assert tried[chosen] == max(tried.values())


@pytest.mark.slow
def test_dry_run_sweep_trains_configurations_at_once_and_scores_the_best_on_val(tmp_path):
    """scripts/gpu_check.sh --sweep: K configurations of the recipe trained concurrently in one
    call, each reporting its validation curve; the best on val is scored once on the test splits."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "- name: plain\n  set: []\n- name: sharper\n  set: [train.label_smoothing=0.0]\n",
        encoding="utf-8",
    )
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--dry-run",
            "--sweep",
            str(sweep),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in lines] == ["setup", "sweep"]
    (r,) = lines[1:]
    assert r["status"] == "ok" and r["concurrent"] == 2 and set(r["runs"]) == {"plain", "sharper"}
    for run in r["runs"].values():
        assert run["status"] == "ok" and [v["step"] for v in run["validations"]] == [3, 6]
    assert r["chosen"] == max(r["runs"], key=lambda k: r["runs"][k]["best_valid_bleu"])
    # each test split, once
    assert r["selection"]["tests"] and all(t["lines"] > 0 for t in r["selection"]["tests"].values())
    assert "sweep:" in proc.stdout and "chosen on val" in proc.stdout


def test_a_sweep_file_is_checked_before_anything_runs(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_sweep import chosen, read_sweep

    for text, reason in (
        ("name: x\n", "a YAML list"),
        ("- name: a\n- name: a\n", "repeated"),
        ("- set: []\n", "entry 0 must be"),
    ):
        (tmp_path / "s.yaml").write_text(text, encoding="utf-8")
        with pytest.raises(SystemExit, match=reason):
            read_sweep(tmp_path / "s.yaml")
    assert read_sweep(ROOT / "configs" / "sweeps" / "multi30k_gpu.yaml")[0] == {
        "name": "recipe",
        "set": [],
    }
    runs = {
        "a": {"best_valid_bleu": 20.0},
        "b": {"best_valid_bleu": 31.5},
        "c": {"best_valid_bleu": None},
    }
    assert chosen(runs) == "b" and chosen({"c": {"best_valid_bleu": None}}) is None
