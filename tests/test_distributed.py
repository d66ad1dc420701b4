import subprocess
import sys

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import TokenizerConfig
from nmt.corpus import read_parallel
from nmt.tokenizer import train_tokenizer

from test_train import small_corpus


def common_args(data, tokenizer_model):
    settings = {
        "data.dir": data, "tokenizer.model": tokenizer_model,
        "model.d_model": 32, "model.d_ff": 64, "model.n_heads": 4, "model.n_encoder_layers": 1, "model.n_decoder_layers": 1,
        "model.dropout": 0.0,  # dropout draws differ between 1 and 2 processes; the arithmetic must not
        "train.max_steps": 3, "train.max_tokens": 300, "train.warmup_steps": 2, "train.validate_every": 1000,
        "train.valid_beam_size": 1, "train.threads": 1, "train.log_every": 1, "train.progress_bar": False, "train.tensorboard": False,
        "decode.max_len_a": 0.0, "decode.max_len_b": 2,
    }
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_with_update_freq_2(tmp_path):
    data = small_corpus(tmp_path)
    src, tgt = read_parallel(data / "train.en", data / "train.de")
    (tmp_path / "spm.model").write_bytes(train_tokenizer(src, tgt, TokenizerConfig(vocab_size=120)).protos()["joint"])
    args = common_args(data, tmp_path / "spm.model")
    env_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "nmt", "train"]
    two = subprocess.run([*env_cmd, "--run-dir", str(tmp_path / "ddp"), *args], capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "nmt", "train", "--run-dir", str(tmp_path / "single"), "--set", "train.update_freq=2", *args], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = load_checkpoint(tmp_path / "ddp" / "last.pt"), load_checkpoint(tmp_path / "single" / "last.pt")
    assert a["progress"]["step"] == b["progress"]["step"] == 3
    # Same updates, different summation order: equal to float32 rounding (atol 1e-5).
    for name, tensor in a["model"].items():
        torch.testing.assert_close(tensor, b["model"][name], atol=1e-5, rtol=0, msg=name)
