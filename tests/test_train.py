import json
import math
import signal
import subprocess
import sys
import time

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import ConfigError, config_from_dict
from nmt.corpus import DataError, read_lines
from nmt.train import train

from conftest import TOY


def small_corpus(tmp_path, n=100):
    data = tmp_path / "data"
    data.mkdir()
    for split, count in (("train", n), ("valid", 8)):
        for lang in ("en", "de"):
            lines = read_lines(TOY / f"{split}.{lang}")[:count]
            (data / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return data


def tiny_run_config(data, run_dir, max_steps, **train):
    return config_from_dict(
        {
            "model": {"d_model": 32, "d_ff": 64, "n_heads": 4, "n_encoder_layers": 1, "n_decoder_layers": 1, "dropout": 0.1},
            "data": {"dir": str(data)},
            "tokenizer": {"vocab_size": 120},
            "train": {"run_dir": str(run_dir), "max_steps": max_steps, "max_tokens": 600, "warmup_steps": 4, "log_every": 1, "validate_every": 1000, "valid_beam_size": 1, "threads": 1, **train},
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
    resumed = train(tiny_run_config(data, tmp_path / "split", 7), resume=True, overrides=["train.max_steps=14"])
    assert resumed["step"] == whole["step"] == 14
    a, b = load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "split" / "last.pt")
    assert a["progress"]["epoch"] >= 1  # the run crossed an epoch boundary
    position = ("step", "epoch", "batch_in_epoch")
    assert [a["progress"][k] for k in position] == [b["progress"][k] for k in position]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert step_losses(tmp_path / "whole") == step_losses(tmp_path / "split")
    assert len(step_losses(tmp_path / "whole")) == 14


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
    assert sorted(p.name for p in (tmp_path / "run").glob("step_*.pt")) == ["step_5.pt", "step_6.pt"]
    ckpt = load_checkpoint(tmp_path / "run" / "step_6.pt")
    assert ckpt["progress"]["step"] == 6 and "joint" in ckpt["tokenizer"]


def test_unusable_validation_set_fails_before_training(tmp_path):
    data = small_corpus(tmp_path, n=40)
    (data / "valid.en").write_text("\n  \n")
    (data / "valid.de").write_text("\n\n")
    with pytest.raises(DataError, match="validation set has no pair"):
        train(tiny_run_config(data, tmp_path / "run", 2))
    assert not (tmp_path / "run" / "last.pt").exists()


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
        train(tiny_run_config(data, tmp_path / "run", 1), resume=True, overrides=["model.d_model=64"])
    assert (tmp_path / "run" / "config.yaml").read_text() == config


def test_early_stopping_on_validation_bleu(tmp_path):
    data = small_corpus(tmp_path, n=40)
    # lr 0: BLEU cannot change, so after the first validation every one is "no improvement".
    result = train(tiny_run_config(data, tmp_path / "run", 50, lr_scale=0.0, validate_every=1, patience=2))
    assert result["step"] == 3
    assert load_checkpoint(tmp_path / "run" / "last.pt")["progress"]["bad_validations"] == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_with_finite_loss(tmp_path, precision):
    data = small_corpus(tmp_path, n=40)
    train(tiny_run_config(data, tmp_path / "run", 4, precision=precision))
    losses = step_losses(tmp_path / "run")
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses.values())
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    assert "scale" in ckpt["scaler"] if precision == "fp16" else ckpt["scaler"] == {}


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    data = small_corpus(tmp_path, n=100)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "nmt", "train", "--run-dir", str(run), "--set", f"data.dir={data}", "--set", "tokenizer.vocab_size=120",
           "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
           "--set", "train.max_steps=100000", "--set", "train.log_every=1", "--set", "train.threads=1", "--set", "train.max_tokens=300"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    ckpt = load_checkpoint(run / "last.pt")
    assert ckpt["progress"]["step"] >= 3
    assert ckpt["progress"]["step"] == max(step_losses(run))  # saved exactly where it stopped


@pytest.mark.slow
def test_compiled_training_step_equals_eager():
    """train.compile changes the kernels, not the arithmetic: the same gradients (atol 1e-6)
    and the same losses over 3 updates (rel 1e-5). Weights after Adam updates are not
    compared: an early Adam step is about lr · sign(g), so entries whose gradient is
    rounding noise (the key biases, which softmax ignores) move apart by up to 2 · lr."""
    from nmt.config import TrainConfig
    from nmt.data import Batch
    from nmt.loss import label_smoothed_loss
    from nmt.model import Transformer
    from nmt.update import Updater

    from conftest import random_sources, tiny_config

    batches = []
    for seed, lengths in enumerate(([3, 7, 5], [9, 2], [4, 4, 6, 1])):
        src, tgt = random_sources(lengths, seed=seed), random_sources([n + 1 for n in lengths], seed=seed + 10)
        batches.append(Batch(src, torch.cat([torch.full((len(lengths), 1), 2), tgt[:, :-1]], dim=1), tgt))

    def run(compile_: bool) -> tuple[dict, list[float]]:
        torch.manual_seed(0)
        model = Transformer(tiny_config(dropout=0.0))
        updater = Updater(model, TrainConfig(compile=compile_, warmup_steps=2), torch.device("cpu"))
        label_smoothed_loss(updater.trained(batches[0].src, batches[0].tgt_in), batches[0].tgt_out, 0.1).loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return grads, [float(updater.step([b])[0].loss.detach()) for b in batches]

    (eager_grads, eager_losses), (compiled_grads, compiled_losses) = run(False), run(True)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    assert eager_losses[2] != eager_losses[0]  # the updates did something
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-6, rtol=1e-4)
