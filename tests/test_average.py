import pytest
import torch

from nmt.average import average_checkpoints
from nmt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, tokenizer_to_tensors
from nmt.config import config_from_dict, config_to_dict
from nmt.model import Transformer

from conftest import tiny_config


def write(path, seed):
    torch.manual_seed(seed)
    model = Transformer(tiny_config())
    state = model.state_dict()
    cfg = config_from_dict({"model": {"d_model": 32, "d_ff": 64, "n_heads": 4, "n_encoder_layers": 2, "n_decoder_layers": 2, "src_vocab_size": 40, "tgt_vocab_size": 40}})
    save_checkpoint({"model": state, "config": config_to_dict(cfg), "tokenizer": tokenizer_to_tensors({"joint": b"x"})}, path)
    return state


def test_average_of_three(tmp_path):
    states = [write(tmp_path / f"c{i}.pt", seed=i) for i in range(3)]
    before = [(tmp_path / f"c{i}.pt").read_bytes() for i in range(3)]
    average_checkpoints([tmp_path / f"c{i}.pt" for i in range(3)], tmp_path / "avg.pt")
    avg = load_checkpoint(tmp_path / "avg.pt")["model"]
    name = "decoder.0.ffn.fc1.weight"
    torch.testing.assert_close(avg[name], (states[0][name] + states[1][name] + states[2][name]) / 3)
    assert avg["src_embed.weight"].data_ptr() == avg["tgt_embed.weight"].data_ptr()  # still tied
    torch.testing.assert_close(avg["tgt_embed.weight"], sum(s["tgt_embed.weight"] for s in states) / 3)
    assert [(tmp_path / f"c{i}.pt").read_bytes() for i in range(3)] == before


def test_average_refuses_to_overwrite_an_input(tmp_path):
    write(tmp_path / "a.pt", 0)
    with pytest.raises(CheckpointError, match="one of the inputs"):
        average_checkpoints([tmp_path / "a.pt"], tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="nothing to average"):
        average_checkpoints([], tmp_path / "b.pt")
