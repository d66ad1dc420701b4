import math

import pytest
import torch
from conftest import random_sources, tiny_config

from nmt.config import config_from_dict, with_vocab
from nmt.core.layers import sinusoidal_positions
from nmt.core.model import Transformer, count_parameters
from nmt.data.tokenizer import BOS


def test_sinusoidal_positions_hand_values():
    pe = sinusoidal_positions(3, 4)
    # d_model 4: frequencies 1 and 1/100; sin on even, cos on odd dimensions.
    expected = torch.tensor(
        [[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in range(3)]
    )
    torch.testing.assert_close(pe, expected, atol=1e-7, rtol=0)


def test_embedding_is_scaled_and_positioned(model):
    tokens = torch.tensor([[5, 6, 7]])
    x = model._embed(tokens, model.src_embed)
    expected = model.src_embed.weight[tokens] * math.sqrt(32) + sinusoidal_positions(3, 32)
    torch.testing.assert_close(x, expected)


def test_positions_extend_beyond_initial_table(model):
    src = random_sources([700])
    memory, _ = model.encode(src)
    assert memory.shape == (1, 701, 32)
    assert torch.isfinite(memory).all()


def test_post_ln_normalises_every_sublayer_output(model):
    # Post-LN ends each layer in LayerNorm (weight 1, bias 0 at init): per-position mean 0, variance
    # 1.
    memory, _ = model.encode(random_sources([9, 4]))
    torch.testing.assert_close(memory.mean(-1), torch.zeros(2, 10), atol=1e-5, rtol=0)
    torch.testing.assert_close(memory.var(-1, unbiased=False), torch.ones(2, 10), atol=1e-3, rtol=0)


def test_pre_ln_is_explicit_and_adds_final_norms():
    pre = Transformer(tiny_config(norm_position="pre"))
    post = Transformer(tiny_config())
    assert isinstance(pre.encoder_norm, torch.nn.LayerNorm)
    assert isinstance(post.encoder_norm, torch.nn.Identity)


def test_embeddings_tied_when_joint(model):
    assert model.src_embed is model.tgt_embed
    separate = Transformer(tiny_config(tgt_vocab_size=50, share_embeddings=False))
    assert separate.src_embed is not separate.tgt_embed
    h = torch.randn(2, 32)
    torch.testing.assert_close(separate.project(h), h @ separate.tgt_embed.weight.T)


def test_separate_vocabularies_of_equal_size_are_not_tied():
    # Hand count for d_model 32, d_ff 64, 2+2 layers: an encoder layer has qkv 32·96+96, out
    # 32·32+32, ffn 32·64+64 + 64·32+32 and two LayerNorms of 64: 8,544; a decoder layer adds
    # cross-attention (q 1,056, kv 2,112, out 1,056, LayerNorm 64): 12,832. One 40×32 embedding is
    # 1,280.
    layers = 2 * 8_544 + 2 * 12_832
    dims = dict(d_model=32, d_ff=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2)
    separate = Transformer(
        with_vocab(config_from_dict({"tokenizer": {"joint": False}, "model": dims}), 40, 40).model
    )
    assert separate.src_embed is not separate.tgt_embed
    assert count_parameters(separate) == layers + 2 * 1_280
    joint = Transformer(with_vocab(config_from_dict({"model": dims}), 40, 40).model)
    assert joint.src_embed is joint.tgt_embed and count_parameters(joint) == layers + 1_280
    with pytest.raises(ValueError, match="share_embeddings needs one vocabulary"):
        Transformer(tiny_config(tgt_vocab_size=50, share_embeddings=True))


def _prefixes(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randint(4, 40, (batch, length), generator=g)
    tgt[:, 0] = BOS
    return tgt


# decoding: the cache refuses to record autograd (test_the_cache_refuses_autograd)
@torch.inference_mode()
def test_cached_decoding_equals_full_recompute_at_every_step(model):
    src = random_sources([7, 3, 11])
    tgt = _prefixes(3, 12)
    memory, mask = model.encode(src)
    full = torch.log_softmax(model.decode(tgt, memory, mask), -1)  # (3, 12, vocab)
    cache = model.start_decoding(memory, mask, beam=1)
    for t in range(12):
        lprobs, cache = model.decode_step(tgt[:, t], cache)
        assert cache.length == t + 1
        torch.testing.assert_close(lprobs, full[:, t], atol=1e-5, rtol=0)


# decoding: the cache refuses to record autograd (test_the_cache_refuses_autograd)
@torch.inference_mode()
def test_beams_share_one_source_copy_and_match_tiled_recompute(model):
    beam = 3
    src = random_sources([7, 3])
    tgt = _prefixes(2 * beam, 6)
    memory, mask = model.encode(src)
    cache = model.start_decoding(memory, mask, beam=beam)
    assert cache.cross_kv.size(2) == 2  # one copy per sentence, not per beam
    tiled_memory, tiled_mask = memory.repeat_interleave(beam, 0), mask.repeat_interleave(beam, 0)
    full = torch.log_softmax(model.decode(tgt, tiled_memory, tiled_mask), -1)
    for t in range(6):
        lprobs, cache = model.decode_step(tgt[:, t], cache)
        torch.testing.assert_close(lprobs, full[:, t], atol=1e-5, rtol=0)


# decoding: the cache refuses to record autograd (test_the_cache_refuses_autograd)
@torch.inference_mode()
def test_cache_reorder_follows_back_pointers(model):
    beam = 2
    src = random_sources([5, 8])
    tgt = _prefixes(4, 5)
    memory, mask = model.encode(src)
    tiled = memory.repeat_interleave(beam, 0), mask.repeat_interleave(beam, 0)
    cache = model.start_decoding(memory, mask, beam)
    for t in range(3):
        _, cache = model.decode_step(tgt[:, t], cache)
    back = torch.tensor([1, 1, 3, 2])  # rows chosen as parents of the new rows
    cache.reorder_(back)
    lprobs, cache = model.decode_step(tgt[back, 3], cache)
    expected = torch.log_softmax(model.decode(tgt[back], *tiled), -1)[:, 3]
    torch.testing.assert_close(lprobs, expected, atol=1e-5, rtol=0)
    # A second reorder reads the buffer the first one wrote, and writes into the one it left.
    again = torch.tensor([1, 0, 3, 3])  # back-pointers stay within a sentence
    cache.reorder_(again)
    lprobs, _ = model.decode_step(tgt[back][again, 4], cache)
    expected = torch.log_softmax(model.decode(tgt[back][again], *tiled), -1)[:, 4]
    torch.testing.assert_close(lprobs, expected, atol=1e-5, rtol=0)


# decoding: the cache refuses to record autograd (test_the_cache_refuses_autograd)
@torch.inference_mode()
def test_cache_grows_on_demand_and_stays_exact(model):
    src = random_sources([4, 9])
    tgt = _prefixes(2, 11)
    memory, mask = model.encode(src)
    full = torch.log_softmax(model.decode(tgt, memory, mask), -1)
    cache = model.start_decoding(memory, mask, beam=1, capacity=1)
    for t in range(11):
        lprobs, cache = model.decode_step(tgt[:, t], cache)
        torch.testing.assert_close(lprobs, full[:, t], atol=1e-5, rtol=0)
    assert cache.length == 11 and cache.self_kv.size(4) == 16  # 1, 2, 4, 8, 16: doubled when needed


# decoding: the cache refuses to record autograd (test_the_cache_refuses_autograd)
@torch.inference_mode()
def test_dropping_sentences_keeps_the_others_exact(model):
    beam = 2
    src = random_sources([6, 3, 9])
    tgt = _prefixes(3 * beam, 4)
    memory, mask = model.encode(src)
    cache = model.start_decoding(memory, mask, beam)
    for t in range(3):
        _, cache = model.decode_step(tgt[:, t], cache)
    cache.keep_sentences_(torch.tensor([0, 2]))
    rows = torch.tensor([0, 1, 4, 5])
    lprobs, cache = model.decode_step(tgt[rows, 3], cache)
    keep = torch.tensor([0, 2])
    expected = torch.log_softmax(
        model.decode(
            tgt[rows],
            memory[keep].repeat_interleave(beam, 0),
            mask[keep].repeat_interleave(beam, 0),
        ),
        -1,
    )[:, 3]
    torch.testing.assert_close(lprobs, expected, atol=1e-5, rtol=0)
    assert cache.cross_kv.size(2) == 2 and cache.src_mask.size(0) == 2


def test_position_table_grows_on_the_cpu_in_float64_and_matches_the_formula(model):
    table = model.positions
    assert table.size(0) == 256
    model._embed(torch.full((1, 300), 5), model.tgt_embed)
    grown = model.positions
    assert grown.size(0) == 512 and grown.dtype == torch.float32
    torch.testing.assert_close(grown[:256], table, atol=0, rtol=0)
    pos, i, d = 400, 3, model.cfg.d_model
    assert float(grown[pos, 2 * i]) == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-6)
    assert float(grown[pos, 2 * i + 1]) == pytest.approx(
        math.cos(pos / 10000 ** (2 * i / d)), abs=1e-6
    )


def test_causality_later_tokens_do_not_change_earlier_logits(model):
    src = random_sources([6])
    tgt = _prefixes(1, 8)
    changed = tgt.clone()
    changed[0, 5] = (tgt[0, 5] + 1 - 4) % 36 + 4
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_sentence_alone_equals_sentence_in_padded_batch(model):
    batch = random_sources([4, 30, 17])
    alone = batch[:1, :5]
    tgt = _prefixes(3, 6)
    torch.testing.assert_close(model(alone, tgt[:1]), model(batch, tgt)[:1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_position,activation", [("post", "relu"), ("pre", "gelu")])
def test_training_step_reduces_loss(norm_position, activation):
    from nmt.core.loss import label_smoothed_loss

    torch.manual_seed(0)
    m = Transformer(tiny_config(norm_position=norm_position, activation=activation, dropout=0.0))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    src, tgt = random_sources([5, 6]), _prefixes(2, 7)
    out_tgt = torch.cat([tgt[:, 1:], torch.full((2, 1), 3)], 1)
    losses = []
    for _ in range(30):
        out = label_smoothed_loss(m(src, tgt), out_tgt, 0.0)
        (out.loss / out.n_tokens).backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item() / out.n_tokens)
    assert losses[-1] < 0.2 * losses[0]


def test_int8_logits_keep_the_output_bias_of_an_imported_model():
    """The quantized copy of the tied output matrix carries Marian's ``final_logits_bias``: a bias
    of +50 on one piece moves that piece's int8 logit by 50 as it moves the float32 one."""
    from nmt.runtime.device import to_dtype

    torch.manual_seed(0)
    model = Transformer(tiny_config(output_bias=True)).eval()
    model.output_bias[7] = 50.0
    h = torch.randn(3, 32)
    exact = model.project(h)
    int8 = to_dtype(model, torch.qint8).project(h)
    assert torch.allclose(int8, exact, atol=0.3) and (int8.argmax(-1) == 7).all()
