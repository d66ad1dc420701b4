"""The step of fixed shapes (nmt.decode.static) against the dynamic cache: on the CPU it runs
eagerly, the twin of what a GPU replays as CUDA graphs, so these tests check the GPU path's
results through the same loop and the same entry."""

from dataclasses import replace

import pytest
import torch
from conftest import random_sources, tiny_config

import nmt.decode.static as static
from nmt.config import DecodeConfig
from nmt.core.batching import pad_sources
from nmt.core.model import Transformer
from nmt.decode.sampling import Sampling
from nmt.decode.search import ScorerStep, step_kind, translate_batch
from nmt.decode.static import STATIC_CAPACITY, Arena, StaticStep, round_up, sentence_bucket
from nmt.decode.steering import Steering


def same_results(a, b, tolerance=1e-5):
    """The same hypotheses in the same order; scores and log-probabilities equal to float32
    rounding, which over 80 steps' sums is about 1e-7 of the value (attention over the capacity sums
    its masked zeros in another order, so the last bits may differ)."""
    for hyps_a, hyps_b in zip(a, b, strict=True):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        assert [h.score for h in hyps_a] == pytest.approx(
            [h.score for h in hyps_b], abs=tolerance, rel=1e-6
        )
        assert [h.log_prob for h in hyps_a] == pytest.approx(
            [h.log_prob for h in hyps_b], abs=tolerance, rel=1e-6
        )


def test_buckets_by_hand():
    assert [sentence_bucket(n) for n in (1, 2, 3, 4, 5, 9, 32, 33, 128)] == [
        1,
        2,
        4,
        4,
        8,
        16,
        32,
        64,
        128,
    ]
    assert [round_up(n, 16) for n in (1, 16, 17, 40)] == [16, 16, 32, 48]


def test_the_static_step_runs_on_a_gpu_where_it_serves():
    """``decode.cache`` auto: the static step on a GPU, the dynamic cache on a CPU; an ensemble, a
    shortlist or a limit past the static capacity run the dynamic cache whatever is asked."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert step_kind("auto", cpu) == "dynamic" and step_kind("auto", cuda) == "static"
    assert step_kind("static", cpu) == "static" and step_kind("dynamic", cuda) == "dynamic"
    assert step_kind("auto", cuda, shortlist=True) == "dynamic"
    assert step_kind("static", cuda, models=2) == "dynamic"
    assert step_kind("auto", cuda, longest=STATIC_CAPACITY - 1) == "static"
    assert step_kind("auto", cuda, longest=STATIC_CAPACITY) == "dynamic"
    # asked for by name, the static step still only serves where it can: an ensemble or a
    # shortlist asked to run "static" runs the dynamic cache, not the first model alone
    assert step_kind("static", cpu, models=2) == "dynamic"
    assert step_kind("static", cpu, shortlist=True) == "dynamic"
    assert step_kind("tiled", cuda) == "tiled"
    with pytest.raises(ValueError, match="unknown step 'Static'; use auto, dynamic, static"):
        step_kind("Static", cpu)


@pytest.mark.parametrize("beam,n_best,alpha", [(1, 1, 0.0), (4, 1, 0.6), (4, 4, 0.0), (8, 4, 1.0)])
def test_static_search_equals_the_dynamic_cache(model, beam, n_best, alpha):
    # Nine sentences (a bucket of 16 slots): some settle early and stay, masked.
    src = random_sources([1, 2, 7, 19, 33, 60, 4, 5, 9], seed=beam)
    decode = DecodeConfig(
        beam_size=beam, length_penalty=alpha, max_len_a=0.25, max_len_b=6, n_best=n_best
    )
    same_results(
        translate_batch(model, src, decode, step="static"),
        translate_batch(model, src, decode, step="dynamic"),
    )


def test_the_static_loop_stops_one_step_late_and_that_step_changes_nothing(model, monkeypatch):
    """The host learns that every sentence has settled one step late (on a GPU it reads the flag
    while the next step runs), so the slab runs one step more than the dynamic search, masked."""
    counted = {"static": 0, "dynamic": 0}
    score = StaticStep.score, ScorerStep.score

    def counting(kind, original):
        def run(self, beams, step):
            counted[kind] += 1
            return original(self, beams, step)

        return run

    monkeypatch.setattr(StaticStep, "score", counting("static", score[0]))
    monkeypatch.setattr(ScorerStep, "score", counting("dynamic", score[1]))
    src = random_sources([4, 6, 2], seed=4)
    # raw log-probabilities: a sentence settles once its running hypotheses fall below a finished
    decode = DecodeConfig(beam_size=3, n_best=1, length_penalty=0.0, max_len_a=0.0, max_len_b=60)
    dynamic = translate_batch(model, src, decode, step="dynamic")
    same_results(translate_batch(model, src, decode, step="static"), dynamic)
    # every sentence settled well before the limit, so the late stop is seen
    assert max(len(h.tokens) for hyps in dynamic for h in hyps) < 59
    assert counted["static"] == counted["dynamic"] + 1


def test_a_capture_that_fails_on_a_gpu_falls_back_to_the_dynamic_cache(model, monkeypatch, caplog):
    """Taken for a GPU on this CPU, the static step's first CUDA call fails: the batch is decoded
    by the dynamic cache (the same results), said once, and later batches are not captured."""
    monkeypatch.setattr(static, "_BROKEN", [])
    monkeypatch.setattr(static, "captures", lambda memory: static.graphs_work())
    src = random_sources([3, 9, 14], seed=6)
    decode = DecodeConfig(beam_size=3, n_best=2, length_penalty=0.6, max_len_a=0.5, max_len_b=5)
    expected = translate_batch(model, src, decode, step="dynamic")
    with caplog.at_level("WARNING", logger="nmt.graphs"):
        same_results(translate_batch(model, src, decode, step="static"), expected)
        assert not static.graphs_work()
        same_results(translate_batch(model, src, decode, step="static"), expected)
        assert step_kind("auto", torch.device("cuda")) == "dynamic"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "CUDA graph capture failed" in warning and "dynamic cache" in warning


def test_a_japanese_target_in_byte_pieces_searches_as_with_the_dynamic_cache(byte_tokenizer):
    """A target vocabulary that is mostly byte pieces (Japanese text spelt byte by byte): the
    whole-character rule gives the dynamic cache's hypotheses and valid text."""
    tok = byte_tokenizer
    vocab = tok.tgt.get_piece_size()
    torch.manual_seed(3)
    m = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    src = pad_sources(tok.encode_src(["犬が走る", "a dog runs on the beach", "猫"]))
    decode = DecodeConfig(beam_size=4, n_best=2, length_penalty=1.0, max_len_a=0.0, max_len_b=12)
    rules = tok.output_rules
    held = translate_batch(m, src, decode, step="static", rules=rules)
    same_results(held, translate_batch(m, src, decode, step="dynamic", rules=rules))
    pieces = [h.tokens for hyps in held for h in hyps]
    assert sum(tok.tgt.is_byte(i) for p in pieces for i in p) > len(pieces)  # bytes were written
    for text, p in zip(tok.decode_tgt(pieces), pieces):
        # cut by the limit, a last character may be incomplete (and is dropped when decoded)
        assert "\ufffd" not in text or len(p) == 12


def test_a_slab_keeps_one_search_state_per_settings(model):
    slab = Arena(model, torch.float32, torch.device("cpu")).slab(model, 2, 3, 16, 32)
    made = []
    first = slab.state(("settings",), lambda: made.append(1) or "state")
    assert slab.state(("settings",), lambda: made.append(1) or "other") == first and made == [1]
    slab.graphs[(True, 0, 16)] = "a graph of these settings"
    # other settings, which a graph holds as constants: a new state, the graphs dropped
    assert slab.state(("others",), lambda: "new") == "new" and not slab.graphs


def test_sampling_and_steering_on_the_static_step_equal_the_dynamic_cache(model):
    """A sampled or steered search reads the host each step, so a GPU captures only the model's
    part of its step; the rest runs as on the dynamic cache, with the same results."""
    src = random_sources([2, 7, 19, 33, 5], seed=11)
    decode = DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=0.5, max_len_b=6, n_best=2)
    cases = {
        "sampling": dict(sampling=Sampling(temperature=0.9, top_p=0.95, seed=4)),
        "steering": dict(
            steering=[
                Steering(prefix=((7,), (8, 9))),
                Steering(constraints=((11, 12),), bans=((13,),)),
                Steering(),
                Steering(bans=((5, 6),)),
                Steering(),
            ],
        ),
    }
    for kwargs in cases.values():
        same_results(
            translate_batch(model, src, decode, step="static", **kwargs),
            translate_batch(model, src, decode, step="dynamic", **kwargs),
        )


def test_batches_reuse_their_slab_and_the_search_state_of_their_settings(model, monkeypatch):
    """As on a GPU, where the graphs read them: batches of one bucket share the slab and the search
    state of their settings, each batch starting it afresh (the same results as the dynamic cache,
    whatever the batch before left); other settings get a state of their own."""
    slab_for = static.slab_for
    monkeypatch.setattr(static, "slab_for", lambda *a, keep: slab_for(*a, keep=True))
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=8, n_best=2)
    a, b = random_sources([3, 5, 7], seed=1), random_sources([4, 6, 2], seed=2)
    states = []
    for src, settings in ((a, decode), (b, decode), (a, decode), (a, replace(decode, min_len=3))):
        same_results(
            translate_batch(model, src, settings, step="static"),
            translate_batch(model, src, settings, step="dynamic"),
        )
        (slab,) = static._ARENAS[model].slabs.values()
        states.append(slab.search[1][0])
    assert states[0] is states[1] is states[2] and states[3] is not states[0]
    static.release_graphs(model)


def test_a_slab_holds_finite_values_in_every_unused_slot_and_position(model):
    slab = Arena(model, torch.float32, torch.device("cpu")).slab(
        model, sentences=4, beam=2, src_len=16, capacity=16
    )
    with torch.inference_mode():
        memory, mask = model.encode(random_sources([3, 5]))
        slab.load(
            model,
            torch.stack(
                [torch.stack(layer.cross_attn.memory_kv(memory)) for layer in model.decoder]
            ),
            mask,
        )
        out = model.decode_step(torch.full((8,), 2), slab.caches[0])[0]
    # empty slots attend to one zero key
    assert slab.src_mask[2:, 0, 0].tolist() == [[True] + [False] * 15] * 2
    assert torch.isfinite(out).all() and int(slab.length) == 1


def test_the_slabs_of_every_bucket_share_one_arena_sized_by_the_largest(model):
    arena = Arena(model, torch.float32, torch.device("cpu"))
    arena.slab(model, 8, 3, 32, 32)
    # fit: no growth
    large, small = (arena.slab(model, 8, 3, 32, 16), arena.slab(model, 2, 3, 16, 32))
    # rows, capacity, sentences, source positions: each axis's largest
    assert arena.size == (24, 32, 8, 32)
    assert (
        large.kv[0].shape == (2, 2, 24, 4, 16, 8)
        and large.kv[0].data_ptr() == arena.kv[0].data_ptr()
    )
    assert (
        small.cross_kv.shape == (2, 2, 2, 4, 16, 8)
        and small.cross_kv.data_ptr() == arena.cross_kv.data_ptr()
    )
    assert arena.slab(model, 2, 3, 16, 32) is small  # made once per bucket
    # more rows than the arena has: it grows, and the old slabs (and graphs) go
    arena.slab(model, 16, 3, 16, 16)
    assert arena.size == (48, 32, 16, 32) and list(arena.slabs) == [(16, 3, 16, 16)]
    # a batch in flight keeps reading its old views
    assert small.kv[0].data_ptr() != arena.kv[0].data_ptr()
