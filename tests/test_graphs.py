"""The step of fixed shapes (nmt.graphs) against the dynamic cache: on the CPU it runs eagerly, the
twin of what a GPU replays as CUDA graphs, so these tests check the GPU path's results."""

from dataclasses import replace

import pytest
import torch
from conftest import random_sources, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st

import nmt.graph_search as graph_search
from nmt.config import DecodeConfig
from nmt.core.batching import pad_sources
from nmt.core.beams import Steering
from nmt.core.model import Transformer
from nmt.core.scorers import TransformerScorer
from nmt.core.search import Sampling, translate_batch
from nmt.graph_search import SEARCH_CAPACITY, GraphSearch, searcher
from nmt.graphs import Arena, StaticScorer, round_up, sentence_bucket
from nmt.runtime import decode_scorer
from nmt.tokenizer import BOS


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


def test_the_production_path_is_static_only_on_a_gpu_without_a_shortlist():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decode_scorer(cpu) is TransformerScorer and decode_scorer(cuda) is GraphSearch
    # a shortlist: the dynamic cache
    assert decode_scorer(cuda, columns=torch.arange(5)) is TransformerScorer
    assert (
        decode_scorer(cpu, cache="static") is GraphSearch
        and decode_scorer(cuda, cache="dynamic") is TransformerScorer
    )


@pytest.mark.parametrize("scorer", [GraphSearch, StaticScorer], ids=["device search", "step-wise"])
@pytest.mark.parametrize("beam,n_best,alpha", [(1, 1, 0.0), (4, 1, 0.6), (4, 4, 0.0), (8, 4, 1.0)])
def test_static_search_equals_the_dynamic_cache(model, beam, n_best, alpha, scorer):
    # Nine sentences (a bucket of 16 slots): some finish early, so slots go dead and the batch moves
    # to smaller buckets.
    src = random_sources([1, 2, 7, 19, 33, 60, 4, 5, 9], seed=beam)
    decode = DecodeConfig(
        beam_size=beam, length_penalty=alpha, max_len_a=0.25, max_len_b=6, n_best=n_best
    )
    same_results(
        translate_batch(model, src, decode, scorer=scorer),
        translate_batch(model, src, decode, scorer="cached"),
    )


def test_plain_beam_search_is_held_on_the_device_and_the_rest_is_step_wise(model, monkeypatch):
    """translate_batch gives the static scorer's own search every plain beam search within its
    capacity, and the host's search the rest: sampling, steering, an ensemble, a longer limit."""
    held = []
    whole = GraphSearch.beam_search.__func__
    monkeypatch.setattr(
        GraphSearch, "beam_search", classmethod(lambda *a: held.append(1) or whole(*a))
    )
    src = random_sources([3, 9], seed=2)
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=SEARCH_CAPACITY - 1)
    cases = [
        ({}, 1),
        (dict(decode=replace(decode, max_len_b=SEARCH_CAPACITY)), 0),
        (dict(sampling=Sampling(seed=1)), 0),
        (dict(steering=[Steering(bans=((5,),)), Steering()]), 0),
        (dict(steering=[Steering(), Steering()]), 1),  # no steering in effect
        (dict(model=[model, model]), 0),
    ]
    for kwargs, expected in cases:
        held.clear()
        kwargs = {"model": model, "src": src, "decode": decode, **kwargs}
        translate_batch(scorer=GraphSearch, **kwargs)
        assert len(held) == expected, kwargs


def test_the_search_loop_stops_one_step_late_and_that_step_changes_nothing(model, monkeypatch):
    """The host learns that every sentence has settled one step late (on a GPU it reads the flag
    while the next step runs), so the slab runs one step more than the host's search, masked."""
    steps = []
    step = graph_search.search_step
    monkeypatch.setattr(graph_search, "search_step", lambda *a: steps.append(1) or step(*a))
    src = random_sources([4, 6, 2], seed=4)
    # raw log-probabilities: a sentence settles once its running hypotheses fall below a finished
    decode = DecodeConfig(beam_size=3, n_best=1, length_penalty=0.0, max_len_a=0.0, max_len_b=60)
    counted = []

    class Counting(TransformerScorer):
        def step(self, prefix, state):
            counted.append(1)
            return super().step(prefix, state)

    dynamic = translate_batch(model, src, decode, scorer=Counting)
    same_results(translate_batch(model, src, decode, scorer=GraphSearch), dynamic)
    # every sentence settled well before the limit (13, 14 and 2 pieces), so the late stop is seen
    assert max(len(h.tokens) for hyps in dynamic for h in hyps) < 59
    assert len(steps) == len(counted) + 1


def test_a_held_search_that_fails_on_a_gpu_falls_back_to_the_step_wise_search(
    model, monkeypatch, caplog
):
    """Taken for a GPU on this CPU, the held search's first CUDA call fails: the batch is decoded by
    the step-wise search (the same results), said once, and later batches go there directly."""
    monkeypatch.setattr(graph_search, "_FAILED", [])
    monkeypatch.setattr(graph_search, "_on_gpu", lambda memory: True)
    monkeypatch.setattr(graph_search, "graphs_work", lambda: True)
    src = random_sources([3, 9, 14], seed=6)
    decode = DecodeConfig(beam_size=3, n_best=2, length_penalty=0.6, max_len_a=0.5, max_len_b=5)
    expected = translate_batch(model, src, decode, scorer=StaticScorer)
    with caplog.at_level("WARNING", logger="nmt.graphs"):
        same_results(translate_batch(model, src, decode, scorer=GraphSearch), expected)
        assert not GraphSearch.searches(10)
        same_results(translate_batch(model, src, decode, scorer=GraphSearch), expected)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "beam search held on the GPU failed" in warning and "step-wise" in warning


def test_a_japanese_target_in_byte_pieces_is_held_on_the_device_as_on_the_host(byte_tokenizer):
    """A target vocabulary that is mostly byte pieces (Japanese text spelt byte by byte): the
    whole-character rule, masked on the device, gives the host's hypotheses and valid text."""
    tok = byte_tokenizer
    vocab = tok.tgt.get_piece_size()
    torch.manual_seed(3)
    m = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    src = pad_sources(tok.encode_src(["犬が走る", "a dog runs on the beach", "猫"]))
    decode = DecodeConfig(beam_size=4, n_best=2, length_penalty=1.0, max_len_a=0.0, max_len_b=12)
    rules = tok.output_rules
    held = translate_batch(m, src, decode, scorer=GraphSearch, rules=rules)
    same_results(held, translate_batch(m, src, decode, scorer="cached", rules=rules))
    pieces = [h.tokens for hyps in held for h in hyps]
    assert sum(tok.tgt.is_byte(i) for p in pieces for i in p) > len(pieces)  # bytes were written
    for text, p in zip(tok.decode_tgt(pieces), pieces):
        # cut by the limit, a last character may be incomplete (and is dropped when decoded)
        assert "\ufffd" not in text or len(p) == 12


def test_a_slab_keeps_one_search_state_per_settings(model):
    slab = Arena(model, torch.float32, torch.device("cpu")).slab(model, 2, 3, 16, 32)
    decode = DecodeConfig(beam_size=3, n_best=2)
    first = searcher(slab, decode, None)
    assert searcher(slab, decode, None) is first
    assert first.tokens.shape == (6, 33) and first.done_tokens.shape == (2, 4, 33)
    slab.search_graphs[(0, 16)] = "a graph of these settings"
    # another setting the graph holds as a constant: a new state, the graphs dropped
    assert searcher(slab, replace(decode, min_len=2), None) is not first and not slab.search_graphs


def test_static_search_grows_its_capacity_as_the_dynamic_cache_does(model):
    src = random_sources([3, 8, 21], seed=5)
    # 80 steps: capacity 64, then 128
    decode = DecodeConfig(beam_size=3, n_best=3, min_len=70, max_len_a=0.0, max_len_b=80)
    static, dynamic = (
        translate_batch(model, src, decode, scorer=StaticScorer),
        translate_batch(model, src, decode, scorer="cached"),
    )
    same_results(static, dynamic)
    assert min(len(h.tokens) for hyps in static for h in hyps) >= 70


def test_static_ensemble_sampling_and_steering_equal_the_dynamic_cache(model):
    torch.manual_seed(1)
    other = Transformer(tiny_config(n_decoder_layers=1)).eval()  # members need not share a shape
    src = random_sources([2, 7, 19, 33, 5], seed=11)
    decode = DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=0.5, max_len_b=6, n_best=2)
    cases = {
        "ensemble": dict(model=[model, other]),
        "sampling": dict(model=model, sampling=Sampling(temperature=0.9, top_p=0.95, seed=4)),
        "steering": dict(
            model=model,
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
        m = kwargs.pop("model")
        same_results(
            translate_batch(m, src, decode, scorer=GraphSearch, **kwargs),
            translate_batch(m, src, decode, scorer="cached", **kwargs),
        )


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(1, 9), beam=st.integers(1, 4))
def test_any_reorders_and_departures_give_the_dynamic_caches_log_probs(model, data, n, beam):
    """Drive both scorers through the same random steps: tokens, back-pointers within each
    sentence, sentences leaving (dead slots, moves to smaller buckets, a grown capacity)."""
    src = random_sources(data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)), seed=n)
    with torch.inference_mode():
        memory, mask = model.encode(src)
        dynamic, d_state = TransformerScorer.start(model, memory, mask, beam, capacity=4)
        static, s_state = StaticScorer.start(model, memory, mask, beam, capacity=4)
        live, prefix = n, torch.full((n * beam, 1), BOS)
        for _ in range(data.draw(st.integers(1, 20))):
            a, d_state = dynamic.step(prefix, d_state)
            b, s_state = static.step(prefix, s_state)
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
            new = torch.tensor(
                data.draw(st.lists(st.integers(4, 39), min_size=live * beam, max_size=live * beam))
            ).unsqueeze(1)
            if beam > 1:
                back = torch.tensor(
                    [
                        s * beam + data.draw(st.integers(0, beam - 1))
                        for s in range(live)
                        for _ in range(beam)
                    ]
                )
                d_state, s_state, prefix = (
                    dynamic.reorder(d_state, back),
                    static.reorder(s_state, back),
                    prefix[back],
                )
            prefix = torch.cat([prefix, new], dim=1)
            keep = sorted(data.draw(st.sets(st.integers(0, live - 1), min_size=1, max_size=live)))
            if len(keep) < live:
                rows = torch.tensor([s * beam + k for s in keep for k in range(beam)])
                d_state = dynamic.keep_sentences(d_state, torch.tensor(keep))
                s_state = static.keep_sentences(s_state, torch.tensor(keep))
                live, prefix = len(keep), prefix[rows]
            assert (
                s_state.slab.sentences == sentence_bucket(live)
                or s_state.slab.sentences // 2 < live
            )


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
        out = slab.run(model, 0, graphs=False)
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
