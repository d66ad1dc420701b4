import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import TOY, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.config import ConfigError, config_from_dict
from nmt.data.corpus import DataError, read_lines
from nmt.runs.checkpoint import CheckpointError, load_checkpoint
from nmt.training.train import train


def small_corpus(tmp_path, n=100):
    data = tmp_path / "data"
    data.mkdir()
    for split, count in (("train", n), ("valid", 8)):
        for lang in ("en", "de"):
            lines = read_lines(TOY / f"{split}.{lang}")[:count]
            (data / f"{split}.{lang}").write_text(
                "".join(line + "\n" for line in lines), encoding="utf-8"
            )
    return data


def tiny_run_config(data, run_dir, max_steps, **train):
    return config_from_dict(
        {
            "model": {
                "d_model": 32,
                "d_ff": 64,
                "n_heads": 4,
                "n_encoder_layers": 1,
                "n_decoder_layers": 1,
                "dropout": 0.1,
            },
            "data": {"dir": str(data)},
            "tokenizer": {"vocab_size": 120},
            "train": {
                "run_dir": str(run_dir),
                "max_steps": max_steps,
                "max_tokens": 600,
                "warmup_steps": 4,
                "log_every": 1,
                "validate_every": 1000,
                "valid_beam_size": 1,
                "threads": 1,
                **train,
            },
            "decode": {"max_len_b": 3, "max_len_a": 1.0},
        }
    )


def step_losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    data = small_corpus(tmp_path)
    whole = train(tiny_run_config(data, tmp_path / "whole", 14))
    first = train(tiny_run_config(data, tmp_path / "split", 7))
    assert first["step"] == 7
    resumed = train(
        tiny_run_config(data, tmp_path / "split", 7), resume=True, overrides=["train.max_steps=14"]
    )
    assert resumed["step"] == whole["step"] == 14
    a, b = (
        load_checkpoint(tmp_path / "whole" / "last.pt").payload,
        load_checkpoint(tmp_path / "split" / "last.pt").payload,
    )
    assert a["progress"]["epoch"] >= 1  # the run crossed an epoch boundary
    position = ("step", "epoch", "batch_in_epoch")
    assert [a["progress"][k] for k in position] == [b["progress"][k] for k in position]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert step_losses(tmp_path / "whole") == step_losses(tmp_path / "split")
    assert len(step_losses(tmp_path / "whole")) == 14


def test_subword_sampling_resumes_its_epoch_exactly_from_the_checkpoint(tmp_path, monkeypatch):
    """tokenizer.subword_alpha: each epoch is cut anew, and the checkpoint keeps the current
    epoch's cut, so a run stopped mid-epoch and resumed in another process (whose SentencePiece
    draws differ: simulated here by another seed) trains on the rest of that epoch exactly as an
    uninterrupted run does; the next epoch is a new draw. The pieces are not the best
    segmentation's (the losses differ from a run without sampling), and the alpha is the
    tokenizer's, fixed for a run."""
    import nmt.training.train as train_module

    data = small_corpus(tmp_path)
    sampled = ["tokenizer.subword_alpha=0.3"]
    train(overridden(tiny_run_config(data, tmp_path / "whole", 14), sampled))
    train(overridden(tiny_run_config(data, tmp_path / "split", 5), sampled))
    cut = train_module.sampled_training_corpus
    monkeypatch.setattr(
        train_module,
        "sampled_training_corpus",
        lambda cfg, tokenizer, seed: cut(cfg, tokenizer, (seed[0] + 1, *seed[1:])),
    )
    train(
        overridden(tiny_run_config(data, tmp_path / "split", 5), sampled),
        resume=True,
        overrides=["train.max_steps=14"],
    )
    records = [
        json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    ]
    first_epoch = [r["step"] for r in records if r.get("epoch") == 0]
    assert 5 < max(first_epoch) < 14  # the run was stopped inside epoch 0 and went on into epoch 1
    whole, split = step_losses(tmp_path / "whole"), step_losses(tmp_path / "split")
    assert [whole[s] for s in first_epoch] == [split[s] for s in first_epoch]
    assert whole[14] != split[14]  # epoch 1: another draw
    train(tiny_run_config(data, tmp_path / "best", 2))
    assert step_losses(tmp_path / "best")[2] != whole[2]
    with pytest.raises(
        ConfigError,
        match=r"cannot change the model or tokenizer of a run \(tokenizer.subword_alpha\)",
    ):
        train(
            overridden(tiny_run_config(data, tmp_path / "split", 5), sampled),
            resume=True,
            overrides=["tokenizer.subword_alpha=0.1"],
        )


def test_a_saved_cut_that_does_not_fit_is_said_and_the_epoch_cut_anew(tmp_path, caplog):
    """A checkpoint's epoch cut that is missing, damaged or of other data is never trained on:
    the resume says it is not exact and cuts the epoch again."""
    from nmt.runs.checkpoint import save_checkpoint

    data = small_corpus(tmp_path)
    sampled = ["tokenizer.subword_alpha=0.3"]
    train(overridden(tiny_run_config(data, tmp_path / "run", 3), sampled))
    payload = load_checkpoint(tmp_path / "run" / "last.pt").payload
    cut = payload["subwords"]
    damages = {
        "no cut": None,
        "offsets past the ids": {**cut, "src_offsets": cut["src_offsets"] + 1},
        "fewer pairs": {
            **cut,
            "src_offsets": cut["src_offsets"][:51],
            "tgt_offsets": cut["tgt_offsets"][:51],
            "parts": torch.tensor([50]),
        },
        "another epoch": {**cut, "epoch": 5},
    }
    for steps, (what, damaged) in enumerate(damages.items(), start=4):
        kept = {k: v for k, v in payload.items() if k != "subwords"}
        save_checkpoint(
            kept | ({"subwords": damaged} if damaged is not None else {}),
            tmp_path / "run" / "last.pt",
        )
        caplog.clear()
        result = train(
            overridden(tiny_run_config(data, tmp_path / "run", 3), sampled),
            resume=True,
            overrides=[f"train.max_steps={steps}"],
        )
        assert result["step"] == steps, what
        assert "is cut anew, so this resume is not exact" in caplog.text, what


def test_training_files_changed_during_a_sampled_run_stop_it_at_the_next_cut_keeping_its_steps(
    tmp_path, monkeypatch
):
    """Each epoch's cut reads the training files again: changed ones (even to as many pairs)
    stop the run with a clear error at that epoch, after saving last.pt."""
    import nmt.training.train as train_module

    data = small_corpus(tmp_path)
    cut = train_module.sampled_training_corpus

    def edit_then_cut(cfg, tokenizer, seed):
        if seed[1] == 1:  # epoch 1: two German lines swap places, so the pairs no longer match
            lines = (data / "train.de").read_text(encoding="utf-8").splitlines()
            lines[0], lines[1] = lines[1], lines[0]
            (data / "train.de").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return cut(cfg, tokenizer, seed)

    monkeypatch.setattr(train_module, "sampled_training_corpus", edit_then_cut)
    with pytest.raises(
        DataError,
        match=r"the training files changed during the run \(found when cutting epoch 1: 100 pairs "
        r"kept, 100 when it started\)",
    ):
        train(
            overridden(tiny_run_config(data, tmp_path / "run", 30), ["tokenizer.subword_alpha=0.3"])
        )
    last = load_checkpoint(tmp_path / "run" / "last.pt").payload
    assert last["progress"]["epoch"] == 1 and last["progress"]["batch_in_epoch"] == 0
    # every step trained is kept
    assert last["progress"]["step"] == max(step_losses(tmp_path / "run"))


def test_fresh_run_refuses_to_overwrite_a_run(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 1))
    before = (tmp_path / "run" / "last.pt").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(tiny_run_config(data, tmp_path / "run", 1))
    assert (tmp_path / "run" / "last.pt").read_bytes() == before
    with pytest.raises(ConfigError, match="does not exist"):
        train(tiny_run_config(data, tmp_path / "other", 1), resume=True)


def test_step_checkpoints_keep_last_k(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 6, save_every=1, keep_last=2))
    assert sorted(p.name for p in (tmp_path / "run").glob("step_*.pt")) == [
        "step_5.pt",
        "step_6.pt",
    ]
    ckpt = load_checkpoint(tmp_path / "run" / "step_6.pt").payload
    assert ckpt["progress"]["step"] == 6 and "joint" in ckpt["tokenizer"]


def test_unusable_validation_set_fails_before_training(tmp_path):
    data = small_corpus(tmp_path, n=40)
    (data / "valid.en").write_text("\n  \n")
    (data / "valid.de").write_text("\n\n")
    with pytest.raises(
        DataError, match=r"the validation set \(.*valid.en and .*valid.de\) has no pair"
    ):
        train(tiny_run_config(data, tmp_path / "run", 2))
    # checked before the tokenizer trains or anything is written
    assert not (tmp_path / "run").exists()


def test_existing_run_artifacts_are_never_overwritten(tmp_path):
    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"an earlier run's best model")
    with pytest.raises(ConfigError, match=r"already holds a run \(best\.pt\)"):
        train(tiny_run_config(data, run, 1))
    assert (run / "best.pt").read_bytes() == b"an earlier run's best model"


def test_resume_cannot_change_the_model(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 1))
    config = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="cannot change the model"):
        train(
            tiny_run_config(data, tmp_path / "run", 1), resume=True, overrides=["model.d_model=64"]
        )
    assert (tmp_path / "run" / "config.yaml").read_text() == config


def test_early_stopping_on_validation_bleu(tmp_path):
    data = small_corpus(tmp_path, n=40)
    # lr 0: BLEU cannot change, so after the first validation every one is "no improvement".
    result = train(
        tiny_run_config(data, tmp_path / "run", 50, lr_scale=0.0, validate_every=1, patience=2)
    )
    assert result["step"] == 3
    assert load_checkpoint(tmp_path / "run" / "last.pt").payload["progress"]["bad_validations"] == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_with_finite_loss(tmp_path, precision):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 4, precision=precision))
    losses = step_losses(tmp_path / "run")
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses.values())
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt").payload
    assert "scale" in ckpt["scaler"] if precision == "fp16" else ckpt["scaler"] == {}


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    data = small_corpus(tmp_path, n=100)
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "nmt",
        "train",
        "--run-dir",
        str(run),
        "--set",
        f"data.dir={data}",
        "--set",
        "tokenizer.vocab_size=120",
        "--set",
        "model.d_model=32",
        "--set",
        "model.d_ff=64",
        "--set",
        "model.n_encoder_layers=1",
        "--set",
        "model.n_decoder_layers=1",
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.log_every=1",
        "--set",
        "train.threads=1",
        "--set",
        "train.max_tokens=300",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (
        (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().count("\n") >= 3
    ):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    ckpt = load_checkpoint(run / "last.pt").payload
    assert ckpt["progress"]["step"] >= 3
    assert ckpt["progress"]["step"] == max(step_losses(run))  # saved exactly where it stopped


@pytest.mark.slow
def test_compiled_training_step_equals_eager():
    """train.compile changes the kernels, not the arithmetic: the same gradients (atol 1e-6)
    and the same losses over 3 updates (rel 1e-5). Weights after Adam updates are not
    compared: an early Adam step is about lr · sign(g), so entries whose gradient is
    rounding noise (the key biases, which softmax ignores) move apart by up to 2 · lr."""
    from conftest import random_sources, tiny_config

    from nmt.config import TrainConfig
    from nmt.core.batching import Batch
    from nmt.core.loss import label_smoothed_loss
    from nmt.core.model import Transformer
    from nmt.core.update import Updater
    from nmt.runtime.compiled import _Compiled, _CompiledStep, compiling

    batches = []
    for seed, lengths in enumerate(([3, 7, 5], [9, 2], [4, 4, 6, 1])):
        src, tgt = (
            random_sources(lengths, seed=seed),
            random_sources([n + 1 for n in lengths], seed=seed + 10),
        )
        batches.append(
            Batch(src, torch.cat([torch.full((len(lengths), 1), 2), tgt[:, :-1]], dim=1), tgt)
        )

    def run(compile_: bool) -> tuple[dict, list[float], Updater]:
        torch.manual_seed(0)
        model = Transformer(tiny_config(dropout=0.0))
        tc, cpu = TrainConfig(compile=compile_, warmup_steps=2), torch.device("cpu")
        # as nmt train: the compiler tried first (here it works), then the step compiled
        loss_fn, compile_step = compiling(tc, cpu)
        updater = Updater(model, tc, cpu, loss_fn=loss_fn, compile_step=compile_step)
        assert isinstance(updater.trained, _CompiledStep) == compile_
        label_smoothed_loss(
            updater.trained(batches[0].src, batches[0].tgt_in), batches[0].tgt_out, 0.1
        ).loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return grads, [float(updater.step([b])[0].loss.detach()) for b in batches], updater

    (eager_grads, eager_losses, _), (compiled_grads, compiled_losses, updater) = (
        run(False),
        run(True),
    )
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    assert eager_losses[2] != eager_losses[0]  # the updates did something
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-6, rtol=1e-4)
    assert "train.compile" not in _Compiled.failed  # compiled indeed, not the eager fallback
    # Warmed up (the first shape compiled, the second made the graph dynamic), updates of new
    # batch sizes and lengths compile nothing more: the step stops recompiling. Sizes stay >= 2,
    # as train.pad_to_multiple keeps them; torch specialises a dimension of 1.
    from torch._dynamo.utils import counters

    compiled_before = counters["stats"]["unique_graphs"]
    for seed, lengths in enumerate(([5, 11, 2, 8], [13, 6], [2, 3, 9, 4, 7]), start=20):
        src, tgt = (
            random_sources(lengths, seed=seed),
            random_sources([n + 1 for n in lengths], seed=seed + 10),
        )
        bos = torch.full((len(lengths), 1), 2)
        updater.step([Batch(src, torch.cat([bos, tgt[:, :-1]], dim=1), tgt)])
    assert counters["stats"]["unique_graphs"] == compiled_before


@pytest.fixture
def compile_record(monkeypatch):
    """No compiler check or failed compile of this process remembered, before or after."""
    from nmt.runtime.compiled import _Compiled, compile_failure

    compile_failure.cache_clear()
    monkeypatch.setattr(_Compiled, "failed", {})
    yield
    compile_failure.cache_clear()


@pytest.mark.parametrize(
    "precision, vocabularies", [("fp32", "joint"), ("bf16", "joint"), ("fp32", "separate")]
)
def test_updates_with_the_loss_in_chunks_equal_those_with_the_whole_logits(precision, vocabularies):
    """train.loss_chunk_tokens changes how the loss is computed, not what is learned: scored 5
    target tokens at a time, a model's first gradients are those of the whole logits, and three
    updates (Adam, the noam rate, clipping) give the same losses, to float rounding (bf16: to its
    rounding of the output matrix's gradient, summed per chunk), with one joint vocabulary and
    with separate ones (the target embedding alone is the output matrix). Weights are not
    compared: Adam scales the rounding noise of gradients that are nearly 0 (the key biases,
    whose gradient is 0 in exact arithmetic) up to steps of the learning rate's size."""
    from conftest import random_sources, tiny_config

    from nmt.config import TrainConfig
    from nmt.core.batching import Batch
    from nmt.core.model import Transformer
    from nmt.core.update import Updater
    from nmt.runtime.compiled import compiling

    batches = []
    for seed, lengths in enumerate(([3, 7, 5], [9, 2], [4, 4, 6, 1])):
        src = random_sources(lengths, seed=seed)
        tgt = random_sources([n + 1 for n in lengths], seed=seed + 10)
        bos = torch.full((len(lengths), 1), 2)
        batches.append(Batch(src, torch.cat([bos, tgt[:, :-1]], dim=1), tgt))

    def run(chunk: int):
        torch.manual_seed(0)
        separate = {"share_embeddings": False, "tgt_vocab_size": 45}
        sizes = separate if vocabularies == "separate" else {}
        model = Transformer(tiny_config(dropout=0.0, **sizes))
        tc = TrainConfig(warmup_steps=2, loss_chunk_tokens=chunk, precision=precision)
        loss_fn, step = compiling(tc, torch.device("cpu"))
        assert loss_fn.chunk_tokens == chunk
        updater = Updater(model, tc, torch.device("cpu"), loss_fn=loss_fn, compile_step=step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            first = batches[0]
            out = updater.loss(model(first.src, first.tgt_in, project=False), first)
        out.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return grads, [float(updater.step([b])[0].loss.detach()) for b in batches]

    (whole_grads, whole), (grads, chunked) = run(0), run(5)
    tolerance = 1e-5 if precision == "fp32" else 1e-2
    assert chunked == pytest.approx(whole, rel=tolerance)
    assert whole[2] != whole[0]  # the updates did something
    for name, grad in whole_grads.items():
        scale = float(grad.abs().max())
        bound = 1e-5 * scale if precision == "fp32" else 2e-2 * scale
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=bound + 1e-12)


def test_without_a_compiler_train_compile_trains_eagerly_said_once_and_writes_its_checkpoint(
    tmp_path, monkeypatch, caplog, compile_record
):
    """A C++ compiler that is not there (CXX names none): the check before the first step finds
    out in seconds, where compiling the step would have failed only once traced."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda *a, **k: compiled.append(a))
    data = small_corpus(tmp_path)
    with caplog.at_level("WARNING", logger="nmt"):
        result = train(tiny_run_config(data, tmp_path / "run", 3, compile=True))
    assert result["step"] == 3 and not compiled
    assert load_checkpoint(tmp_path / "run" / "last.pt").payload["progress"]["step"] == 3
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "train.compile: torch.compile cannot compile on cpu" in warning, warning
    assert "no-such-compiler" in warning and "--set train.compile=false" in warning, warning
    assert len(warning.splitlines()) == 1


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    compile_=st.booleans(),
    compile_loss=st.booleans(),
    reasons=st.lists(st.none() | st.sampled_from(["no compiler", "took over 120 s"]), min_size=1),
)
def test_compiling_runs_eagerly_where_any_process_cannot_compile_and_says_so_once(
    compile_, compile_loss, reasons, monkeypatch, caplog
):
    """Under train.compile each process of a job checks (here: ``reasons``, one per process); one
    that cannot compile makes every process train eagerly, said in one line naming the settings
    asked for. Without train.compile nothing is checked."""
    from nmt.config import TrainConfig
    from nmt.core.loss import EAGER
    from nmt.runtime import compiled as compiled_module

    tried = []
    monkeypatch.setattr(compiled_module, "compile_failure", lambda device: tried.append(device))
    tc = TrainConfig(compile=compile_, compile_loss=compile_loss)
    caplog.clear()
    with caplog.at_level("INFO", logger="nmt"):
        loss, step = compiled_module.compiling(tc, torch.device("cpu"), lambda _: reasons)
    asked = [
        n for n, on in (("train.compile", compile_), ("train.compile_loss", compile_loss)) if on
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert tried == (["cpu"] if compile_ else [])
    model = torch.nn.Linear(2, 2)
    if compile_ and any(reasons):
        assert loss.passes is EAGER and step(model) is model
        (warning,) = warnings
        assert all(name in warning for name in asked) and next(filter(None, reasons)) in warning
    else:
        assert warnings == []
        assert (loss.passes is EAGER) != compile_loss
        assert (step(model) is model) != compile_


def test_a_step_that_fails_to_compile_runs_eagerly_said_once(monkeypatch, caplog, compile_record):
    """What the check before the first step does not catch fails at the first step: from then
    on the step runs eagerly, with the eager values."""
    from nmt.runtime.compiled import _CompiledStep

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5))
    step = _CompiledStep(model)

    def broken(*args):
        raise RuntimeError("inductor: no compiler\nmore detail")

    monkeypatch.setattr(step, "compiled", broken)
    x = torch.randn(5, 4)
    with caplog.at_level("WARNING", logger="nmt"):
        assert step.train(False) is step and not model.training
        outs = [step(x) for _ in range(2)]
    for out in outs:
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == (
        "warning: train.compile: compiling the training step failed (inductor: no compiler); it "
        "runs eagerly"
    )


# --------------------------------------------------------------------------- run directory
# lifecycle


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_second_trainer_on_a_locked_run_directory_is_refused(tmp_path):
    from nmt.runs.rundir import RunDir

    data = small_corpus(tmp_path, n=40)
    holder = RunDir(tmp_path / "run")
    holder.lock()
    with pytest.raises(ConfigError, match=rf"in use by another nmt train \(pid {os.getpid()}\)"):
        train(tiny_run_config(data, tmp_path / "run", 1))
    holder.release()
    # A holder killed with SIGKILL leaves no stuck lock: the kernel drops it with the process.
    script = (
        f"from nmt.runs.rundir import RunDir; import time; r = RunDir({str(tmp_path / 'run')!r}); "
        "r.lock(); print('locked', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError, match="in use by another nmt train"):
        train(tiny_run_config(data, tmp_path / "run", 1))
    child.kill()
    child.wait(timeout=30)
    assert train(tiny_run_config(data, tmp_path / "run", 1))["step"] == 1


def test_a_run_killed_before_its_first_checkpoint_starts_afresh(tmp_path):
    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n{"step": 2, "loss": 8.0}\n')
    with pytest.raises(ConfigError, match="holds no checkpoint .* run without --resume"):
        train(tiny_run_config(data, run, 2), resume=True)
    with pytest.raises(DataError):  # a fresh start that fails leaves the old logs as they were
        train(tiny_run_config(tmp_path / "no-data", run, 2))
    assert len(records(run)) == 2
    assert train(tiny_run_config(data, run, 2))["step"] == 2
    assert [r["step"] for r in records(run) if "loss" in r] == [1, 2]
    assert records(run)[0]["loss"] != 9.0


def test_resume_takes_the_newest_complete_checkpoint_and_keeps_one_history(tmp_path, caplog):
    data = small_corpus(tmp_path, n=100)
    whole = tmp_path / "whole"
    train(tiny_run_config(data, whole, 10))
    run = tmp_path / "run"
    train(tiny_run_config(data, run, 7, save_every=1, keep_last=10))
    # A run killed after step_7.pt: last.pt is older, a damaged step_6.pt and a killed
    # writer's temporary lie around, and metrics.jsonl already has a record of step 8.
    (run / "last.pt").write_bytes((run / "step_4.pt").read_bytes())
    (run / "step_6.pt").write_bytes((run / "step_6.pt").read_bytes()[:1000])
    (run / ".step_8.pt.tmp424242").write_bytes(b"partial")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "loss": 1.0}\n')
    # a damaged file newer than any: named, though an older one is used
    (run / "step_9.pt").write_bytes(b"")
    with caplog.at_level("WARNING", logger="nmt"):
        result = train(tiny_run_config(data, run, 7), resume=True, overrides=["train.max_steps=10"])
    skipped = sorted(
        r.getMessage().removeprefix("warning: ").split(":")[0]
        for r in caplog.records
        if r.getMessage().startswith("warning: skipping ")
    )
    assert skipped == [f"skipping {run / 'step_6.pt'}", f"skipping {run / 'step_9.pt'}"]
    assert result["step"] == 10
    assert not (run / ".step_8.pt.tmp424242").exists()
    steps = [r["step"] for r in records(run) if "loss" in r]
    assert steps == list(range(1, 11))  # one history: no duplicate or backward steps
    assert step_losses(run) == step_losses(whole)  # resumed from step 7, exactly
    # keep_last 10
    assert sorted(int(p.stem[5:]) for p in run.glob("step_*.pt")) == list(range(1, 11))


def test_resuming_a_finished_run_changes_nothing(tmp_path):
    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    train(tiny_run_config(data, run, 4, validate_every=2))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    result = train(tiny_run_config(data, run, 4), resume=True)
    assert result["stopped_by"] == "done" and result["step"] == 4
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert [r["step"] for r in records(run) if "bleu" in r] == [2, 4]


def test_a_run_resumes_from_another_working_directory(tmp_path, monkeypatch):
    data = small_corpus(tmp_path, n=40)
    monkeypatch.chdir(tmp_path)
    train(tiny_run_config("data", "run", 2))
    saved = load_checkpoint(tmp_path / "run" / "last.pt").payload["config"]
    assert saved["data"]["dir"] == str(data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert (
        train(
            tiny_run_config("data", tmp_path / "run", 2),
            resume=True,
            overrides=["train.max_steps=3"],
        )["step"]
        == 3
    )


def test_resume_with_an_edited_config_applies_or_refuses(tmp_path):
    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    train(tiny_run_config(data, run, 2))
    edited = tmp_path / "edited.yaml"
    edited.write_text(
        f"data:\n  dir: {data}\ntrain:\n  run_dir: {run}\n  max_steps: 3\n  log_every: 1\n"
    )
    assert train(tiny_run_config(data, run, 2), resume=True, config_file=edited)["step"] == 3
    edited.write_text("model:\n  d_model: 64\ntrain:\n  max_steps: 4\n")
    with pytest.raises(
        ConfigError, match=r"cannot change the model or tokenizer of a run \(model\.d_model\)"
    ):
        train(tiny_run_config(data, run, 2), resume=True, config_file=edited)


def test_resume_from_an_averaged_checkpoint_is_refused_before_writing(tmp_path):
    from nmt.tools.average import average_checkpoints

    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "src", 2))
    run = tmp_path / "run"
    run.mkdir()
    average_checkpoints([tmp_path / "src" / "last.pt"], run / "last.pt")
    with pytest.raises(CheckpointError, match=r"holds no training state \(an nmt average output\)"):
        train(tiny_run_config(data, run, 2), resume=True)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "last.pt"]


def test_logged_learning_rate_is_the_rate_the_update_used(tmp_path):
    from nmt.core.schedule import noam_lr

    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 5))
    lrs = {r["step"]: r["lr"] for r in records(tmp_path / "run") if "lr" in r}
    assert lrs[1] == pytest.approx(32**-0.5 * 4**-1.5)  # 0.0221: step 1 of warmup 4
    assert lrs == {k: pytest.approx(noam_lr(k, 32, 4)) for k in range(1, 6)}
    assert max(lrs, key=lrs.get) == 4  # the peak falls on the last warmup step


def test_an_fp16_update_the_scaler_skips_moves_nothing():
    from dataclasses import replace

    from conftest import random_sources, tiny_config

    from nmt.config import TrainConfig
    from nmt.core.batching import Batch
    from nmt.core.loss import ProjectedLoss
    from nmt.core.model import Transformer
    from nmt.core.update import Updater

    calls = []

    def overflow_first(states, target, smoothing, model):
        out = ProjectedLoss()(states, target, smoothing, model)
        calls.append(1)
        return replace(out, loss=out.loss * float("inf")) if len(calls) == 1 else out

    src, tgt = random_sources([3, 5]), random_sources([4, 6], seed=1)
    batch = Batch(src, torch.cat([torch.full((2, 1), 2), tgt[:, :-1]], dim=1), tgt)
    model = Transformer(tiny_config(dropout=0.0))
    updater = Updater(
        model,
        TrainConfig(precision="fp16", warmup_steps=4),
        torch.device("cpu"),
        loss_fn=overflow_first,
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    updater.step([batch])
    assert updater.skipped and updater.scheduler.last_epoch == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    updater.step([batch])
    assert not updater.skipped and updater.scheduler.last_epoch == 1
    assert updater.last_lr == pytest.approx(32**-0.5 * 4**-1.5)  # step 1's rate, not step 2's


def test_a_signal_during_validation_stops_it_at_once(tmp_path, monkeypatch):
    import threading

    import nmt.training.train

    data = small_corpus(tmp_path, n=40)

    def slow_validation(*args):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(60)

    monkeypatch.setattr(nmt.training.train, "validate", slow_validation)
    started = time.perf_counter()
    result = train(tiny_run_config(data, tmp_path / "run", 10, validate_every=2))
    assert time.perf_counter() - started < 30
    assert result["interrupted"] and result["step"] == 2
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt").payload
    assert ckpt["progress"]["step"] == 2 and ckpt["progress"]["validated_step"] == -1


def test_a_second_signal_stops_at_once(tmp_path):
    import threading

    from nmt.training.distributed import Interrupted, StopSignal

    with StopSignal() as signals:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.perf_counter()
        with pytest.raises(Interrupted):
            with signals.interruptible():
                time.sleep(30)
        assert time.perf_counter() - started < 5 and signals.received == signal.SIGTERM
        # at once: the same request forwarded (torchrun does this)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(StopSignal.SAME_REQUEST_S)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(KeyboardInterrupt):
            time.sleep(30)


def test_a_full_disk_at_the_first_checkpoint_is_one_error_and_no_temporary(tmp_path, monkeypatch):
    import errno

    from nmt.files import OutputError

    data = small_corpus(tmp_path, n=40)
    fsync = os.fsync

    def full_for_checkpoints(fd):
        if ".last.pt.tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_checkpoints)
    run = tmp_path / "run"
    with pytest.raises(
        OutputError, match=rf"^cannot write {run}/last.pt: no space left on the device$"
    ):
        train(tiny_run_config(data, run, 2))
    assert not list(run.glob(".*.tmp*")) and not (run / "last.pt").exists()


def test_max_epochs_stops_at_the_end_of_the_epoch(tmp_path):
    """And says so: ``stopped_by`` once said "steps" for a run ``train.max_epochs`` ended. The same
    batches bounded by ``train.max_steps`` train the same losses and say "steps"."""
    data = small_corpus(tmp_path, n=40)
    result = train(tiny_run_config(data, tmp_path / "run", 1000, max_epochs=1))
    progress = load_checkpoint(tmp_path / "run" / "last.pt").payload["progress"]
    assert (progress["epoch"], progress["batch_in_epoch"]) == (1, 0)
    assert {r["epoch"] for r in records(tmp_path / "run") if "loss" in r} == {0}
    assert result["stopped_by"] == "epochs" and 1 < result["step"] == len(
        step_losses(tmp_path / "run")
    )
    by_steps = train(tiny_run_config(data, tmp_path / "steps", result["step"]))
    assert by_steps["stopped_by"] == "steps" and step_losses(tmp_path / "steps") == step_losses(
        tmp_path / "run"
    )


def test_a_validation_abandoned_by_a_signal_runs_when_the_run_resumes(tmp_path, monkeypatch):
    import threading

    import nmt.training.train

    data = small_corpus(tmp_path, n=40)
    real_validate = nmt.training.train.validate

    def interrupted_validation(*args):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(60)

    monkeypatch.setattr(nmt.training.train, "validate", interrupted_validation)
    assert train(tiny_run_config(data, tmp_path / "run", 6, validate_every=2))["step"] == 2
    monkeypatch.setattr(nmt.training.train, "validate", real_validate)
    train(
        tiny_run_config(data, tmp_path / "run", 6, validate_every=2),
        resume=True,
        overrides=["train.max_steps=3"],
    )
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    # as an uninterrupted run: step 2's validation is not lost
    assert [r["step"] for r in records if "bleu" in r] == [2, 3]


def test_resume_with_the_command_that_started_the_run(tmp_path):
    from nmt.config import load_config

    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    file = tmp_path / "run.yaml"
    file.write_text(
        f"model:\n  preset: tiny\n  d_model: 128\ndata:\n  dir: {data}\ntokenizer:\n  vocab_size: "
        "1000\n"
        "train:\n  max_tokens: 600\n  validate_every: 1000\n  threads: 1\n"
    )
    sizes = [
        "model.d_model=32",
        "model.d_ff=64",
        "tokenizer.vocab_size=120",
        f"train.run_dir={run}",
    ]
    train(
        load_config(file, sizes + ["train.max_steps=2"]),
        overrides=sizes + ["train.max_steps=2"],
        config_file=file,
    )
    # the same sizes again: no change to the model or tokenizer
    again = sizes + ["train.max_steps=3"]
    assert (
        train(load_config(file, again), resume=True, overrides=again, config_file=file)["step"] == 3
    )
    assert load_checkpoint(run / "last.pt").payload["config"]["model"]["d_model"] == 32
    changed = [
        "model.d_model=64",
        "tokenizer.vocab_size=120",
        f"train.run_dir={run}",
        "train.max_steps=4",
    ]
    with pytest.raises(
        ConfigError, match=r"cannot change the model or tokenizer of a run \(model\.d_model\)"
    ):
        train(load_config(file, changed), resume=True, overrides=changed, config_file=file)


def test_the_result_line_has_every_key_however_the_run_ends(tmp_path, monkeypatch):
    """The final JSON line once lacked bleu/chrf/valid_loss when the last step was a validation
    step, and said best_bleu -1.0 when no validation ran."""
    import threading

    import nmt.training.train
    from nmt.training.train import RESULT_METRICS

    data = small_corpus(tmp_path, n=40)
    keys = {
        "step",
        "train_seconds",
        "best_bleu",
        "interrupted",
        "stopped_by",
        "valid_step",
        *RESULT_METRICS,
    }
    # step 4 validated inside the loop
    validated_last = train(tiny_run_config(data, tmp_path / "a", 4, validate_every=2))
    assert (
        set(validated_last) == keys
        and validated_last["valid_step"] == 4
        and validated_last["stopped_by"] == "steps"
    )
    record = records(tmp_path / "a")[-1]
    assert {k: validated_last[k] for k in RESULT_METRICS} == {k: record[k] for k in RESULT_METRICS}
    assert validated_last["best_bleu"] == max(
        r["bleu"] for r in records(tmp_path / "a") if "bleu" in r
    )
    # step 3 validated by finish
    validated_at_end = train(tiny_run_config(data, tmp_path / "b", 3, validate_every=2))
    assert (
        set(validated_at_end) == keys
        and validated_at_end["valid_step"] == 3
        and isinstance(validated_at_end["bleu"], float)
    )
    done = train(tiny_run_config(data, tmp_path / "a", 4), resume=True)
    assert (
        set(done) == keys
        and done["stopped_by"] == "done"
        and {k: done[k] for k in RESULT_METRICS} == {k: record[k] for k in RESULT_METRICS}
    )
    timed = train(tiny_run_config(data, tmp_path / "c", 1000, max_time_s=1e-9))
    assert (
        set(timed) == keys
        and timed["stopped_by"] == "time"
        and timed["valid_step"] == timed["step"]
    )
    monkeypatch.setattr(
        nmt.training.train,
        "validate",
        lambda *args: (
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start(),
            time.sleep(30),
        ),
    )
    stopped = train(tiny_run_config(data, tmp_path / "d", 10, validate_every=2))
    assert set(stopped) == keys and stopped["stopped_by"] == "signal" and stopped["interrupted"]
    assert stopped["best_bleu"] is None and all(
        stopped[k] is None for k in ("valid_step", *RESULT_METRICS)
    )
    json.dumps(stopped)  # the line nmt train prints


def test_resume_applies_changed_optimizer_and_schedule_settings_at_once(tmp_path):
    """Changed weight_decay, adam_eps and adam_betas were logged as applied while the optimizer
    kept the old values, and a changed warm-up took effect one step late."""
    from nmt.core.schedule import noam_lr

    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    train(tiny_run_config(data, run, 3))
    changes = [
        "train.max_steps=5",
        "train.weight_decay=0.01",
        "train.adam_eps=1e-6",
        "train.adam_betas=[0.8, 0.95]",
        "train.warmup_steps=2",
    ]
    train(tiny_run_config(data, run, 3), resume=True, overrides=changes)
    (group,) = load_checkpoint(run / "last.pt").payload["optimizer"]["param_groups"]
    assert (group["weight_decay"], group["eps"], tuple(group["betas"])) == (0.01, 1e-6, (0.8, 0.95))
    lrs = {r["step"]: r["lr"] for r in records(run) if "lr" in r}
    assert [lrs[k] for k in (1, 2, 3)] == pytest.approx([noam_lr(k, 32, 4) for k in (1, 2, 3)])
    # the new warm-up from the first resumed step
    assert [lrs[k] for k in (4, 5)] == pytest.approx([noam_lr(k, 32, 2) for k in (4, 5)])


def test_a_linear_schedule_resumed_with_more_steps_follows_the_new_line(tmp_path):
    """The linear rate depends on max_steps, which --resume may change: steps 1-3 follow the first
    run's line to 0, the resumed steps 4-5 the new one, from the step it resumes at."""
    from nmt.core.schedule import linear_lr

    data = small_corpus(tmp_path, n=40)
    run = tmp_path / "run"
    cfg = tiny_run_config(data, run, 3, schedule="linear", lr=1e-3, warmup_steps=2)
    train(cfg)
    train(cfg, resume=True, overrides=["train.max_steps=5"])
    lrs = {r["step"]: r["lr"] for r in records(run) if "lr" in r}
    assert [lrs[k] for k in (1, 2, 3)] == pytest.approx(
        [linear_lr(k, 1e-3, 2, 3) for k in (1, 2, 3)]
    )
    assert [lrs[k] for k in (4, 5)] == pytest.approx([linear_lr(k, 1e-3, 2, 5) for k in (4, 5)])


def test_a_changed_batch_budget_on_resume_applies_from_the_next_epoch(tmp_path):
    """Doubling train.max_tokens on --resume once made the saved position point into other
    batches (5,926 of 12,000 pairs skipped, 1,035 repeated): the resumed epoch now keeps its
        batches."""
    data = small_corpus(tmp_path, n=100)
    whole = tmp_path / "whole"
    train(tiny_run_config(data, whole, 30))
    by_step = {r["step"]: r for r in records(whole) if "loss" in r}
    first_epoch = [k for k, r in by_step.items() if r["epoch"] == 0]
    assert len(first_epoch) > 4
    split = tmp_path / "split"
    stop = first_epoch[len(first_epoch) // 2]
    train(tiny_run_config(data, split, stop))
    train(
        tiny_run_config(data, split, stop),
        resume=True,
        overrides=["train.max_steps=30", "train.max_tokens=1200"],
    )
    resumed = {r["step"]: r for r in records(split) if "loss" in r}
    # the same batches to the epoch's end
    assert [resumed[k]["loss"] for k in first_epoch] == [by_step[k]["loss"] for k in first_epoch]
    after = [k for k in resumed if k > first_epoch[-1]]
    # then the new budget
    assert (
        after
        and resumed[after[0]]["epoch"] == 1
        and resumed[after[0]]["loss"] != by_step[after[0]]["loss"]
    )
    assert load_checkpoint(split / "last.pt").payload["progress"]["batching"] == [1200, 1, 1]


def test_no_module_imports_a_posix_only_module_unguarded():
    """rundir.py imported fcntl at the top, so nmt.training.train could not be imported on
    Windows."""
    import ast
    from pathlib import Path

    posix_only = {"fcntl", "resource", "termios", "pwd", "grp", "posix"}
    for path in sorted((Path(__file__).parents[1] / "nmt").rglob("*.py")):
        # module level, outside try blocks
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not posix_only & {n.split(".")[0] for n in names if n}, (
                f"{path.name}:{node.lineno} imports {names} unguarded"
            )


def test_a_system_without_file_locks_runs_unlocked_and_says_so(tmp_path, monkeypatch, caplog):
    import builtins

    import nmt.runs.rundir

    real_import = builtins.__import__
    monkeypatch.setattr(nmt.runs.rundir, "fcntl", None)
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError(name))
            if name == "msvcrt"
            else real_import(name, *a, **k)
        ),
    )
    run = nmt.runs.rundir.RunDir(tmp_path / "run")
    with caplog.at_level("WARNING", logger="nmt.train"):
        run.lock()
    run.release()
    assert "this system offers no file locking" in caplog.text


def test_a_nan_gradient_is_caught_at_once_and_leaves_the_weights(tmp_path):
    from conftest import random_sources, tiny_config

    from nmt.config import TrainConfig
    from nmt.core.batching import Batch
    from nmt.core.model import Transformer
    from nmt.core.update import Updater

    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.0))
    updater = Updater(model, TrainConfig(warmup_steps=4), torch.device("cpu"))
    src, tgt = random_sources([5, 6]), random_sources([4, 4], seed=1)
    batch = Batch(src, torch.cat([torch.full((2, 1), 2), tgt[:, :-1]], 1), tgt)
    updater.step([batch])
    with torch.no_grad():
        model.decoder[0].ffn.fc1.weight[0, 0] = float("nan")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    updater.step([batch])
    assert updater.nonfinite and updater.skipped and updater.scheduler.last_epoch == 1
    assert all(
        torch.equal(v, before[k])
        or (torch.isnan(v).any() and torch.equal(v.isnan(), before[k].isnan()))
        for k, v in model.state_dict().items()
    )


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_nonfinite_gradient_stops_or_skips_as_the_config_says(
    tmp_path, monkeypatch, caplog, mode
):
    from nmt.core.update import Updater

    data = small_corpus(tmp_path, n=40)
    calls = {"n": 0}
    finite = Updater._gradients_finite

    def third_update_is_nan(self):
        calls["n"] += 1
        return False if calls["n"] == 3 else finite(self)

    monkeypatch.setattr(Updater, "_gradients_finite", third_update_is_nan)
    with caplog.at_level("WARNING", logger="nmt.train"):
        result = train(tiny_run_config(data, tmp_path / "run", 5, nonfinite_loss=mode))
    assert "step 3: the gradients are NaN or infinite" in caplog.text
    if mode == "stop":
        assert result["stopped_by"] == "nonfinite" and result["step"] == 2
        assert load_checkpoint(tmp_path / "run" / "last.pt").payload["progress"]["step"] == 2
    else:
        assert (
            result["stopped_by"] == "steps"
            and result["step"] == 5
            and sorted(step_losses(tmp_path / "run")) == [1, 2, 3, 4, 5]
        )


def test_a_loss_that_doubles_from_its_lowest_is_warned_about_once(caplog):
    from types import SimpleNamespace

    from nmt.training.train import Trainer

    trainer = SimpleNamespace(
        lowest_loss=None, warned_divergence=False, ddp=SimpleNamespace(main=True)
    )
    with caplog.at_level("WARNING", logger="nmt.train"):
        for step, loss in enumerate([5.0, 3.0, 2.5, 4.0, 5.5, 9.0], start=1):
            Trainer.notice_divergence(trainer, {"loss": loss, "step": step})
    (warning,) = [r.getMessage() for r in caplog.records]
    assert (
        "step 5: the training loss 5.500 is more than twice its lowest, 2.500 at step 3" in warning
    )


def test_every_checkpoint_of_a_run_names_the_run_also_after_a_resume(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 2, save_every=1))
    first = load_checkpoint(tmp_path / "run" / "step_1.pt").payload["run"]
    train(tiny_run_config(data, tmp_path / "run", 2), resume=True, overrides=["train.max_steps=3"])
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last.run == first and first["dir"] == str(tmp_path / "run")
    train(tiny_run_config(data, tmp_path / "other", 1))
    assert load_checkpoint(tmp_path / "other" / "last.pt").payload["run"]["id"] != first["id"]


def overridden(cfg, overrides):
    """``cfg`` with ``--set`` style ``overrides`` applied, as the command line builds it."""
    from nmt.config import apply_overrides, config_to_dict

    return config_from_dict(apply_overrides(config_to_dict(cfg), overrides))


def adam_steps(payload):
    return sorted({int(state["step"]) for state in payload["optimizer"]["state"].values()})


def test_init_from_starts_a_new_run_at_step_1_with_fresh_adam_by_default(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "base", 3))
    base = load_checkpoint(tmp_path / "base" / "last.pt").payload
    assert adam_steps(base) == [3]
    # lr 0: the weights cannot move, so the new run's weights are the checkpoint's exactly, whatever
    # Adam holds.
    config = tiny_run_config(
        data, tmp_path / "tuned", 2, schedule="constant", lr=0.0, warmup_steps=1
    )
    # regularisation may change in a fine-tuning run
    changes = ["model.dropout=0.3", "tokenizer.subword_alpha=0.1"]
    result = train(
        overridden(config, changes), init_from=tmp_path / "base" / "last.pt", overrides=changes
    )
    assert result["step"] == 2 and sorted(step_losses(tmp_path / "tuned")) == [1, 2]
    tuned = load_checkpoint(tmp_path / "tuned" / "last.pt").payload
    assert all(torch.equal(tuned["model"][k], base["model"][k]) for k in base["model"])
    assert (
        adam_steps(tuned) == [2]
        and tuned["scheduler"]["last_epoch"] == 2
        and tuned["progress"]["step"] == 2
    )
    assert tuned["init_from"] == {"path": str(tmp_path / "base" / "last.pt"), "step": 3}
    assert (
        tuned["config"]["model"]["dropout"] == 0.3
        and tuned["config"]["tokenizer"]["subword_alpha"] == 0.1
    )
    assert tuned["tokenizer"].keys() == base["tokenizer"].keys()
    # no tokenizer trained
    assert all(torch.equal(tuned["tokenizer"][k], base["tokenizer"][k]) for k in base["tokenizer"])


def test_a_tokenizer_not_trained_on_the_run_s_text_is_measured_on_it_before_training(
    tmp_path, caplog
):
    """Fine-tuning into text the tokenizer does not cover (here upper-case German, the toy tokenizer
    knowing lower case only) said nothing; the model could never write those characters. Measured
    now when the tokenizer comes from
    --init-from or the config, never when the run trains its own or resumes."""
    data = small_corpus(tmp_path, n=40)
    upper = tmp_path / "upper"
    upper.mkdir()
    for split in ("train", "valid"):
        (upper / f"{split}.en").write_text(
            (data / f"{split}.en").read_text(encoding="utf-8"), encoding="utf-8"
        )
        (upper / f"{split}.de").write_text(
            (data / f"{split}.de").read_text(encoding="utf-8").upper(), encoding="utf-8"
        )
    with caplog.at_level("WARNING", logger="nmt.train"):
        train(tiny_run_config(data, tmp_path / "base", 1))
        # its own tokenizer, trained on the upper-case text
        train(tiny_run_config(upper, tmp_path / "own", 1))
        assert [r for r in caplog.records if "was not trained on this text" in r.getMessage()] == []
        train(
            tiny_run_config(upper, tmp_path / "tuned", 1), init_from=tmp_path / "base" / "last.pt"
        )
        (tuned,) = [
            r.getMessage()
            for r in caplog.records
            if "was not trained on this text" in r.getMessage()
        ]
        caplog.clear()
        train(
            tiny_run_config(upper, tmp_path / "tuned", 1),
            resume=True,
            overrides=["train.max_steps=2"],
        )
        given = tiny_run_config(upper, tmp_path / "given", 1)
        train(
            overridden(given, [f"tokenizer.model={tmp_path / 'base' / 'spm.model'}"]),
            overrides=[f"tokenizer.model={tmp_path / 'base' / 'spm.model'}"],
        )
    (named,) = [
        r.getMessage() for r in caplog.records if "was not trained on this text" in r.getMessage()
    ]
    assert tuned.startswith(
        f"warning: the tokenizer from --init-from {tmp_path / 'base' / 'last.pt'} was not trained "
        "on this text: "
    )
    assert (
        f"of the target side's pieces ({upper / 'train.de'}) are unknown, in 100.0% of its lines "
        "(40 lines sampled); " in tuned
    )
    assert tuned.endswith(
        "the model can never write them: train a tokenizer on this text (start without "
        "--init-from), or accept it"
    )
    assert named.startswith(
        f"warning: the tokenizer given by tokenizer.model {tmp_path / 'base' / 'spm.model'} was "
        "not trained on this text: "
    )
    assert (
        named.endswith("train a tokenizer on this text (leave those keys unset), or accept it")
        and "100.0% of its lines" in named
    )


def test_init_from_keeps_adams_moments_when_asked(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "base", 3))
    base = load_checkpoint(tmp_path / "base" / "last.pt").payload
    config = tiny_run_config(
        data,
        tmp_path / "tuned",
        1,
        schedule="constant",
        lr=0.0,
        warmup_steps=1,
        reset_optimizer=False,
    )
    train(config, init_from=tmp_path / "base" / "last.pt")
    tuned = load_checkpoint(tmp_path / "tuned" / "last.pt").payload
    # Adam's own count goes on; the run's starts at 1
    assert adam_steps(tuned) == [4] and tuned["progress"]["step"] == 1
    beta2 = tuned["config"]["train"]["adam_betas"][1]
    # one more update of the second moment: beta2 · v + (1 - beta2) · g², never below beta2 · v
    for key, state in base["optimizer"]["state"].items():
        assert torch.all(
            tuned["optimizer"]["state"][key]["exp_avg_sq"]
            >= beta2 * state["exp_avg_sq"] * (1 - 1e-6)
        )


def test_init_from_refuses_another_architecture_and_resume_before_writing(tmp_path):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "base", 1))
    with pytest.raises(ConfigError) as err:
        train(
            overridden(tiny_run_config(data, tmp_path / "tuned", 1), ["model.d_model=64"]),
            init_from=tmp_path / "base" / "last.pt",
            overrides=["model.d_model=64"],
        )
    assert err.value.key == "model.d_model" and "differs from the checkpoint's 32" in str(err.value)
    with pytest.raises(
        ConfigError, match="tokenizer.vocab_size 200 differs from the checkpoint's 120"
    ):
        train(
            overridden(tiny_run_config(data, tmp_path / "tuned", 1), ["tokenizer.vocab_size=200"]),
            init_from=tmp_path / "base" / "last.pt",
            overrides=["tokenizer.vocab_size=200"],
        )
    with pytest.raises(ConfigError) as err:
        train(
            tiny_run_config(data, tmp_path / "base", 1),
            resume=True,
            init_from=tmp_path / "base" / "last.pt",
        )
    assert err.value.render({"resume": "--resume", "init_from": "--init-from"}.get).startswith(
        "--resume and --init-from cannot go together"
    )
    assert not (tmp_path / "tuned").exists()


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=st.integers(1, 4), good_first=st.integers(0, 2), interrupted=st.integers(0, 2))
def test_updates_skipped_in_a_row_stop_the_run_at_the_limit_and_a_made_update_resets_the_count(
    tmp_path_factory, limit, good_first, interrupted
):
    """With train.nonfinite_loss: skip and weights that give a non-finite loss every time, training
    skipped 368 updates in a row at step 1 for 579 s, saving nothing, until it was killed."""
    from nmt.core.update import Updater

    tmp_path = tmp_path_factory.mktemp("skips")
    data = small_corpus(tmp_path, n=40)
    calls = {"n": 0}
    finite = Updater._gradients_finite
    # good_first updates are made, then `interrupted` skipped ones and one made (fewer than the
    # limit in a row), then only skipped ones.
    pattern = [True] * good_first + [False] * min(interrupted, limit - 1) + [True]

    def scripted(self):
        calls["n"] += 1
        ok = pattern[calls["n"] - 1] if calls["n"] <= len(pattern) else False
        return finite(self) and ok

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Updater, "_gradients_finite", scripted)
        result = train(
            tiny_run_config(
                data, tmp_path / "run", 50, nonfinite_loss="skip", max_skipped_updates=limit
            )
        )
    made = pattern.count(True)
    assert result["stopped_by"] == "nonfinite" and result["step"] == made
    assert calls["n"] == len(pattern) + limit  # it stopped at the limit's skipped update, not after
    assert load_checkpoint(tmp_path / "run" / "last.pt").payload["progress"]["step"] == made


@pytest.mark.parametrize("at_step", [0, 1, 2])
def test_a_run_directory_removed_during_training_ends_in_one_error_naming_it(
    tmp_path, monkeypatch, at_step
):
    """A run directory deleted during training ended in a 144-line double traceback (releasing the
    lock listed the directory again and raised over the error that stopped the run)."""
    import shutil

    from nmt.files import OutputError
    from nmt.training.train import Trainer

    data = small_corpus(tmp_path, n=40)
    run, step = tmp_path / "run", Trainer.train_step

    def removed(self, group):
        if self.progress.step == at_step:
            shutil.rmtree(run)
        return step(self, group)

    monkeypatch.setattr(Trainer, "train_step", removed)
    with pytest.raises(
        OutputError,
        match=rf"^cannot write {run}/\S+: its directory {run} no longer exists \(removed while nmt "
        r"was writing to it\?\)",
    ):
        train(tiny_run_config(data, run, 4, save_every=1))
    assert not run.exists()


def _warnings(caplog, read) -> list[str]:
    """The warnings logged while ``read()`` runs."""
    import logging

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        read()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("foreign", ["last.pt", "best.pt"])
@pytest.mark.parametrize("other_steps", [1, 3])  # the other run's checkpoint older or newer
def test_a_checkpoint_of_another_run_in_the_run_directory_is_named_by_resume_and_translate(
    tmp_path, caplog, foreign, other_steps
):
    """A last.pt replaced by another run's checkpoint resumed silently (exit 0): metrics.jsonl then
    mixed two runs. A best.pt of another run was translated with --checkpoint RUN without a word,
    and --resume named the run's own last.pt as the stranger. The directory's run.json says which
    run it holds: the stranger is named, whichever file it replaced and whichever is newer."""
    import shutil

    data = small_corpus(tmp_path, n=40)
    run, other = tmp_path / "run", tmp_path / "other"
    train(tiny_run_config(data, run, 2, save_every=1, validate_every=2))
    train(tiny_run_config(data, other, other_steps, validate_every=other_steps))
    records = (run / "metrics.jsonl").read_bytes()
    shutil.copyfile(other / "last.pt", run / foreign)
    own = run / ("best.pt" if foreign == "last.pt" else "last.pt")
    with pytest.raises(ConfigError) as refused:
        train(tiny_run_config(data, run, 2), resume=True, overrides=["train.max_steps=4"])
    assert str(refused.value) == (
        f"--resume: {run / foreign} was written by another run (started in {other}) than the run "
        f"{run / 'run.json'} names (started in {run}), whose checkpoint is {own}; move the other "
        f"run's checkpoint out of {run}, or resume that run in a directory of its own"
    )
    assert (run / "metrics.jsonl").read_bytes() == records  # nothing of the other run appended
    # translate, evaluate (and info, export, --init-from) read RUN as its best.pt
    warned = _warnings(caplog, lambda: load_checkpoint(run))
    assert warned == (
        [
            f"warning: {run / 'best.pt'} was written by another run (started in {other}) than the "
            f"run {run / 'run.json'} names (started in {run}), whose checkpoint is {own}; reading "
            f"{run / 'best.pt'} all the same: move the other run's checkpoint out of {run}, or "
            "give the checkpoint's file, not the directory, to use it knowingly"
        ]
        if foreign == "best.pt"
        else []
    )
    assert _warnings(caplog, lambda: load_checkpoint(run / "best.pt")) == []  # the file, as asked
    train(tiny_run_config(data, other, 3), resume=True, overrides=["train.max_steps=4"])
    assert load_checkpoint(other / "last.pt").payload["progress"]["step"] == 4


def test_another_runs_checkpoint_as_a_run_directorys_only_one_is_refused_on_resume(tmp_path):
    """last.pt, the directory's only checkpoint, replaced by another run's: --resume continued it,
    and both runs' records mixed in metrics.jsonl."""
    import shutil

    data = small_corpus(tmp_path, n=40)
    run, other = tmp_path / "run", tmp_path / "other"
    train(tiny_run_config(data, run, 2))
    train(tiny_run_config(data, other, 3))
    (run / "best.pt").unlink(missing_ok=True)
    shutil.copyfile(other / "last.pt", run / "last.pt")
    records = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="holds no checkpoint; move the other run's checkpoint"):
        train(tiny_run_config(data, run, 2), resume=True, overrides=["train.max_steps=4"])
    assert (run / "metrics.jsonl").read_bytes() == records


def test_a_run_directory_without_run_json_names_two_runs_checkpoints_together(tmp_path, caplog):
    """A directory of an nmt from before run.json has only its checkpoints to say which run it
    holds: two of different runs are named together, neither as the other's."""
    import shutil

    data = small_corpus(tmp_path, n=40)
    run, other = tmp_path / "run", tmp_path / "other"
    train(tiny_run_config(data, run, 2, validate_every=2))
    train(tiny_run_config(data, other, 1, validate_every=1))
    (run / "run.json").unlink()
    shutil.copyfile(other / "best.pt", run / "best.pt")
    both = (
        f"{run / 'best.pt'} (started in {other}) and {run / 'last.pt'} (started in {run}) were "
        f"written by different runs, and {run} has no run.json to say which is its own"
    )
    assert _warnings(caplog, lambda: load_checkpoint(run))[0].startswith(f"warning: {both}; ")
    with pytest.raises(ConfigError, match="were written by different runs, and .* has no run.json"):
        train(tiny_run_config(data, run, 2), resume=True, overrides=["train.max_steps=4"])
    (run / "best.pt").unlink()  # the other run's moved out: this one resumes, and says so from now
    train(tiny_run_config(data, run, 2), resume=True, overrides=["train.max_steps=3"])
    assert json.loads((run / "run.json").read_text())["dir"] == str(run)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 40), holds=st.integers(0, 45), seed=st.integers(0, 3))
def test_a_token_budget_the_device_cannot_hold_is_one_line_naming_what_fits_and_nothing_changes(
    batch, holds, seed
):
    """train.max_tokens too large for a GPU ended in a CUDA traceback at some step; before the first
    step the largest batch now runs once (weights, optimizer and generators untouched), and halving
    it finds what fits."""
    from nmt.config import ConfigError, TrainConfig
    from nmt.core.batching import Batch
    from nmt.core.model import Transformer
    from nmt.core.update import Updater
    from nmt.runtime.device import check_fits

    torch.manual_seed(seed)
    model = Transformer(tiny_config()).train()
    updater = Updater(model, TrainConfig(warmup_steps=2), torch.device("cpu"))
    src = torch.randint(4, 40, (batch, 7))
    tgt = torch.randint(4, 40, (batch, 6))
    largest = Batch(src, tgt[:, :-1], tgt[:, 1:])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    trial = updater.trial

    def limited(part):  # a device that holds at most `holds` sentences of this length
        if part.src.size(0) > holds:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        trial(part)

    updater.trial = limited
    if batch <= holds:
        check_fits(updater, largest, 7 * batch)
    else:
        fits = batch
        while fits > holds:
            fits //= 2
        message = (
            f"a batch of {fits * 7} tokens does; set train.max_tokens={fits * 7} or less"
            if fits
            else "not even one sentence"
        )
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_fits(updater, largest, 7 * batch)
    assert (
        all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
        and not updater.optimizer.state
    )
    assert torch.equal(torch.get_rng_state(), rng) and all(
        p.grad is None for p in model.parameters()
    )


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=6),
    multiple=st.integers(2, 16),
    seed=st.integers(0, 3),
)
def test_lengths_padded_to_a_multiple_give_the_same_loss_and_gradients(lengths, multiple, seed):
    """train.pad_to_multiple only adds PAD: masked keys, positions past EOS and ignored targets
    change nothing."""
    from nmt.core.batching import collate
    from nmt.core.loss import label_smoothed_loss
    from nmt.core.model import Transformer

    g = torch.Generator().manual_seed(seed)

    class Pairs:
        def src(self, i):
            return torch.randint(
                4, 40, (lengths[i][0],), generator=torch.Generator().manual_seed(seed * 100 + i)
            ).numpy()

        def tgt(self, i):
            return torch.randint(
                4,
                40,
                (lengths[i][1],),
                generator=torch.Generator().manual_seed(seed * 100 + 50 + i),
            ).numpy()

    torch.manual_seed(int(torch.randint(0, 1000, (1,), generator=g)))
    model = Transformer(tiny_config(dropout=0.0)).train()
    results = []
    for m in (1, multiple):
        batch = collate(Pairs(), list(range(len(lengths))), multiple=m)
        assert batch.src.size(1) % m == 0 and batch.tgt_in.size(1) % m == 0
        model.zero_grad()
        out = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1)
        out.loss.backward()
        results.append(
            (out.loss.detach(), int(out.n_tokens), [p.grad.clone() for p in model.parameters()])
        )
    (loss, n, grads), (padded_loss, padded_n, padded_grads) = results
    assert n == padded_n
    torch.testing.assert_close(padded_loss, loss, rtol=1e-5, atol=1e-5)
    # Padded shapes sum in another order: float32's error is relative to the terms summed, which
    # can cancel to a much smaller element, so it is bounded by the tensor's scale, not the element.
    for a, b in zip(grads, padded_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()) + 1e-9)


def test_a_run_logs_its_first_step_and_first_minute_before_log_every(tmp_path, caplog):
    """A run whose log goes to a file says at once that it trains and how fast, not after
    train.log_every steps; those early lines are not records (metrics.jsonl keeps its rhythm)."""
    data = small_corpus(tmp_path)
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="nmt.train"):
        train(tiny_run_config(data, run, 4, log_every=3))
    logged = [int(m.split()[1]) for m in caplog.messages if re.match(r"step \d+ epoch", m)]
    assert logged == [1, 3]
    assert sorted(step_losses(run)) == [3]
    # resumed: its own first step is logged early
    caplog.clear()
    with caplog.at_level("INFO", logger="nmt.train"):
        train(
            tiny_run_config(data, run, 4, log_every=3), resume=True, overrides=["train.max_steps=7"]
        )
    logged = [int(m.split()[1]) for m in caplog.messages if re.match(r"step \d+ epoch", m)]
    assert logged == [5, 6]


def test_the_first_minute_is_logged_once(monkeypatch):
    from nmt.runs import progress

    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    invocation = progress.Invocation(first_step=11, started=100.0)
    due = []
    for step, at in [(11, 100.5), (12, 130.0), (13, 159.9), (14, 160.0), (15, 170.0), (16, 400)]:
        now[0] = at
        due.append(invocation.early_log_due(step))
    assert due == [True, False, False, True, False, False]
    assert invocation.seconds() == 300
