import copy

import pytest
import torch
from torch import nn

from nmt.config import ConfigError, DecodeConfig
from nmt.search import translate_batch
from nmt.translate import resolve_dtype, to_dtype

from conftest import random_sources


def test_int8_quantizes_every_linear_layer_and_keeps_scores_close(model):
    float_model = copy.deepcopy(model)
    int8 = to_dtype(model, resolve_dtype("int8", torch.device("cpu")))
    assert not any(type(m) is nn.Linear for m in int8.modules())
    quantized = [m for m in int8.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert len(quantized) == 2 * 4 + 2 * 7  # encoder layer: qkv, out, fc1, fc2; decoder layer: also q, kv, out of cross-attention
    assert all(m.weight().qscheme() == torch.per_channel_affine for m in quantized)
    src = random_sources([6, 11], seed=4)
    with torch.inference_mode():
        expected = float_model.decode(torch.full((2, 1), 2), *float_model.encode(src)).log_softmax(-1)
        got = int8.decode(torch.full((2, 1), 2), *int8.encode(src)).log_softmax(-1)
    assert got.dtype == torch.float32
    assert float((got - expected).abs().max()) < 0.05  # int8 weights and activations: close, not equal
    (hyps, _) = translate_batch(int8, src, DecodeConfig(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=4, n_best=2))
    assert len(hyps) == 2 and hyps[0].score >= hyps[1].score


def test_int8_names_its_limits():
    with pytest.raises(ConfigError, match="--dtype must be float32, bfloat16, float16, int8 or auto, got 'int4'"):
        resolve_dtype("int4", torch.device("cpu"), "--dtype")
    with pytest.raises(ConfigError, match="--dtype int8 runs on the CPU only"):
        resolve_dtype("int8", torch.device("meta"), "--dtype")
