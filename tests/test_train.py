import json

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import ConfigError, config_from_dict
from nmt.data import read_lines
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
    assert a["progress"] == b["progress"]
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
