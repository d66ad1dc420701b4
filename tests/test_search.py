import math

import pytest
import torch
import torch.nn.functional as F
from conftest import ScriptedScorer, random_sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.config import ConfigError, DecodeConfig
from nmt.core.layers import CrossAttention
from nmt.data.tokenizer import BOS, EOS, NEVER_OUTPUT, PAD, UNK
from nmt.decode.beams import LENGTH_NORMALIZATIONS, length_penalty
from nmt.decode.sampling import Sampling, sample_seed, sampling_probs
from nmt.decode.scorers import EnsembleScorer, TransformerScorer
from nmt.decode.search import beam_search, sample, translate_batch
from nmt.decode.steering import Steering

A, B, C = 4, 5, 6
VOCAB = 7


def search(
    table, beam, alpha=0.0, max_len=10, n_best=1, batch=1, normalization="gnmt", allow_unk=False
):
    decode = DecodeConfig(
        beam_size=beam,
        length_penalty=alpha,
        n_best=n_best,
        length_normalization=normalization,
        allow_unk=allow_unk,
    )
    return beam_search(ScriptedScorer(table), None, torch.full((batch,), max_len), decode)


def test_best_hypothesis_found_after_a_worse_one_finished():
    table = {
        (): {EOS: 0.3, A: 0.6, B: 0.1},
        (A,): {EOS: 0.8, A: 0.1, B: 0.1},
        (B,): {EOS: 0.5, A: 0.5},
    }
    # Step 1: "" ends with 0.3 (finished first); A (0.6) and B (0.1) continue.
    # Step 2: "A" ends with 0.6·0.8 = 0.48, the best; the beam then holds 2 finished.
    (hyps,) = search(table, beam=2, n_best=2)
    assert [h.tokens for h in hyps] == [[A], []]
    assert hyps[0].log_prob == pytest.approx(math.log(0.48), abs=1e-6)
    assert hyps[1].log_prob == pytest.approx(math.log(0.3), abs=1e-6)


def test_length_penalty_ranks_finished_hypotheses():
    table = {
        (): {EOS: 0.45, A: 0.55},
        (A,): {A: 1.0},
        (A, A): {EOS: 0.7, B: 0.3},
    }
    # "" : log 0.45 = -0.799 ; "A A": log(0.55·0.7) = -0.954.
    (plain,) = search(table, beam=2, alpha=0.0)
    assert plain[0].tokens == []
    # With alpha 1: -0.799 / (6/6) vs -0.954 / (8/6) = -0.716, so the longer one wins.
    (penalised,) = search(table, beam=2, alpha=1.0)
    assert penalised[0].tokens == [A, A]
    assert penalised[0].score == pytest.approx(
        math.log(0.55 * 0.7) / length_penalty(3, 1.0, "gnmt"), abs=1e-6
    )
    # |Y| ** alpha, EOS counted: -0.799 / 1 ** 0.2 vs -0.954 / 3 ** 0.2 = -0.766, so the longer one
    # wins.
    (by_length,) = search(table, beam=2, alpha=0.2, normalization="length")
    assert by_length[0].tokens == [A, A]
    assert by_length[0].score == pytest.approx(math.log(0.55 * 0.7) / 3**0.2, abs=1e-6)
    # "none" ignores alpha: raw log-probabilities, the shorter one wins.
    (raw,) = search(table, beam=2, alpha=1.0, normalization="none")
    assert raw[0].tokens == [] and raw[0].score == pytest.approx(math.log(0.45), abs=1e-6)


def test_length_penalty_values():
    assert length_penalty(7, 0.6, "gnmt") == pytest.approx((12 / 6) ** 0.6)
    assert length_penalty(7, 0.6, "length") == pytest.approx(7**0.6)
    assert length_penalty(7, 0.6, "none") == 1.0
    assert {length_penalty(7, 0.0, name) for name in LENGTH_NORMALIZATIONS} == {1.0}
    with pytest.raises(
        ConfigError, match="decode.length_normalization must be gnmt, length or none, got 'average'"
    ):
        # the settings refuse it when they are built
        search({(): {EOS: 1.0}}, beam=2, normalization="average")


def test_beam_beats_greedy_on_garden_path():
    table = {
        (): {A: 0.5, B: 0.4, EOS: 0.1},
        (A,): {A: 0.4, B: 0.3, EOS: 0.3},
        (B,): {EOS: 0.9, A: 0.1},
        (A, A): {EOS: 1.0},
        (A, B): {EOS: 1.0},
    }
    (greedy,) = search(table, beam=1)
    assert greedy[0].tokens == [A, A]  # 0.5 · 0.4 · 1.0 = 0.2
    (beam,) = search(table, beam=3)
    assert beam[0].tokens == [B]  # 0.4 · 0.9 = 0.36
    assert beam[0].log_prob == pytest.approx(math.log(0.36), abs=1e-6)


def test_length_limit_forces_eos():
    table = {(): {A: 0.9, EOS: 0.1}, (A,): {A: 0.9, EOS: 0.1}, (A, A): {A: 0.9, EOS: 0.1}}
    (hyps,) = search(table, beam=1, max_len=2)
    assert hyps[0].tokens == [A, A]


def test_pad_and_bos_never_generated():
    table = {(): {PAD: 0.5, BOS: 0.3, A: 0.2}, (A,): {EOS: 1.0}}
    (hyps,) = search(table, beam=2)
    assert hyps[0].tokens == [A]


def test_unk_never_generated_unless_allowed():
    # The scorer prefers UNK at every step: "UNK A" has 0.6 · 0.9 = 0.54, "A" only 0.3.
    table = {
        (): {UNK: 0.6, A: 0.3, EOS: 0.1},
        (UNK,): {A: 0.9, EOS: 0.1},
        (UNK, A): {EOS: 1.0},
        (A,): {UNK: 0.7, EOS: 0.3},
    }
    (allowed,) = search(table, beam=2, allow_unk=True)
    assert allowed[0].tokens == [UNK, A] and allowed[0].log_prob == pytest.approx(
        math.log(0.54), abs=1e-6
    )
    (banned,) = search(table, beam=2, n_best=2)
    # Only "A" then EOS (0.3 · 0.3) and "" (0.1) remain; UNK appears in no hypothesis.
    assert [h.tokens for h in banned] == [[], [A]]
    assert [h.log_prob for h in banned] == pytest.approx([math.log(0.1), math.log(0.09)], abs=1e-6)
    (greedy,) = search(table, beam=1)
    assert UNK not in greedy[0].tokens


def test_unk_ban_reaches_the_model_path(model, monkeypatch):
    """A model whose output favours UNK by 100 nats: translate_batch emits it only when allowed."""
    favour_unk = torch.zeros(40)
    favour_unk[UNK] = 100.0
    monkeypatch.setattr(
        model, "project", lambda h: F.linear(h, model.tgt_embed.weight) + favour_unk
    )
    src = random_sources([4, 6])
    for beam in (1, 3):
        allowed = translate_batch(
            model,
            src,
            DecodeConfig(
                beam_size=beam, length_penalty=0.6, max_len_a=1.0, max_len_b=3, allow_unk=True
            ),
        )
        assert all(h.tokens == [UNK] * len(h.tokens) and h.tokens for hyps in allowed for h in hyps)
        banned = translate_batch(
            model, src, DecodeConfig(beam_size=beam, length_penalty=0.6, max_len_a=1.0, max_len_b=3)
        )
        assert all(UNK not in h.tokens for hyps in banned for h in hyps)


def greedy_by_recompute(model, src, max_len):
    """Reference greedy search: argmax over the full-prefix decoder at every step."""
    memory, mask = model.encode(src)
    prefix = torch.tensor([[BOS]])
    for _ in range(max_len):
        lprobs = torch.log_softmax(model.decode(prefix, memory, mask)[:, -1], -1)
        lprobs[:, [PAD, BOS, UNK]] = float("-inf")
        token = int(lprobs.argmax())
        if token == EOS:
            break
        prefix = torch.cat([prefix, torch.tensor([[token]])], 1)
    return prefix[0, 1:].tolist()


def test_beam_one_equals_greedy(model):
    for i, n in enumerate([3, 8, 13]):
        src = random_sources([n], seed=i)
        (hyps,) = translate_batch(
            model, src, DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=1.0, max_len_b=5)
        )
        assert hyps[0].tokens == greedy_by_recompute(model, src, n + 1 + 5)


@pytest.mark.parametrize("beam", [1, 4])
def test_sentence_alone_equals_in_padded_batch(model, beam):
    batch = random_sources([3, 25, 40, 9], seed=3)
    together = translate_batch(
        model,
        batch,
        DecodeConfig(beam_size=beam, length_penalty=0.6, max_len_a=1.2, max_len_b=4, n_best=beam),
    )
    for i in range(4):
        n = int((batch[i] != PAD).sum())
        alone = translate_batch(
            model,
            batch[i : i + 1, :n],
            DecodeConfig(
                beam_size=beam, length_penalty=0.6, max_len_a=1.2, max_len_b=4, n_best=beam
            ),
        )[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        for a, t in zip(alone, together[i]):
            assert a.score == pytest.approx(t.score, abs=1e-4)


def test_cross_attention_keys_values_computed_once_per_layer(model, monkeypatch):
    calls = []
    original = CrossAttention.memory_kv

    def counting(self, memory):
        calls.append(memory.shape)
        return original(self, memory)

    monkeypatch.setattr(CrossAttention, "memory_kv", counting)
    translate_batch(
        model,
        random_sources([5, 9, 2]),
        DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.0, max_len_b=8),
    )
    assert len(calls) == model.cfg.n_decoder_layers
    assert all(shape[0] == 3 for shape in calls)  # per sentence, not per beam


def test_n_best_sorted_and_distinct(model):
    (hyps,) = translate_batch(
        model,
        random_sources([6]),
        DecodeConfig(beam_size=5, length_penalty=0.6, max_len_a=1.0, max_len_b=3, n_best=5),
    )
    assert len(hyps) == 5
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == 5


@pytest.mark.parametrize("beam,n_best,alpha", [(1, 1, 0.0), (4, 1, 0.6), (4, 4, 0.0), (8, 4, 1.0)])
def test_production_search_equals_recompute_and_tiled_references(model, beam, n_best, alpha):
    src = random_sources([1, 2, 7, 19, 33, 60], seed=beam)
    runs = {
        name: translate_batch(
            model,
            src,
            DecodeConfig(
                beam_size=beam, length_penalty=alpha, max_len_a=0.25, max_len_b=6, n_best=n_best
            ),
            step=name,
        )
        for name in ("dynamic", "tiled", "recompute")
    }
    for name in ("tiled", "recompute"):
        for ref_hyps, hyps in zip(runs[name], runs["dynamic"]):
            assert [h.tokens for h in hyps] == [h.tokens for h in ref_hyps], name
            for h, r in zip(hyps, ref_hyps):
                assert h.score == pytest.approx(r.score, abs=1e-5) and h.log_prob == pytest.approx(
                    r.log_prob, abs=1e-5
                )
    lengths = {len(h.tokens) for hyps in runs["dynamic"] for h in hyps}
    assert len(lengths) > 2  # some hypotheses ended early, others ran to the limit


def test_search_stops_once_no_running_hypothesis_can_win():
    class Counting(ScriptedScorer):
        calls = 0

        def step(self, prefix, state):
            Counting.calls += 1
            return super().step(prefix, state)

    table = {(): {EOS: 0.9, A: 0.1}, (A,): {A: 1.0}, (A, A): {A: 1.0}}
    (hyps,) = beam_search(
        Counting(table), None, torch.tensor([10]), DecodeConfig(beam_size=2, length_penalty=0.0)
    )
    assert hyps[0].tokens == [] and Counting.calls == 1  # "A…" can score at most log 0.1 < log 0.9


@pytest.mark.parametrize("normalization,alpha", [("gnmt", 3.0), ("length", 1.0)])
def test_early_stop_waits_for_a_longer_hypothesis_that_can_still_win(normalization, alpha):
    class Counting(ScriptedScorer):
        calls = 0

        def step(self, prefix, state):
            Counting.calls += 1
            return super().step(prefix, state)

    # "" ends at once with log 0.7 = -0.357; "A A A A A" ends with log 0.3 = -1.204 over |Y| = 6:
    # -1.204 / (11/6)**3 = -0.195 (gnmt) and -1.204 / 6 = -0.201 (length) beat -0.357. A bound
    # taken at the running hypothesis' current length (|Y| = 2: -0.758 and -0.602) would stop
    # after the first step and return "".
    table = {
        (): {EOS: 0.7, A: 0.3},
        **{(A,) * n: {A: 1.0} for n in range(1, 5)},
        (A,) * 5: {EOS: 1.0},
    }
    (hyps,) = beam_search(
        Counting(table),
        None,
        torch.tensor([10]),
        DecodeConfig(beam_size=2, length_penalty=alpha, length_normalization=normalization),
    )
    assert hyps[0].tokens == [A] * 5
    assert hyps[0].score == pytest.approx(
        math.log(0.3) / length_penalty(6, alpha, normalization), abs=1e-6
    )
    assert Counting.calls == 6


@pytest.mark.parametrize("normalization", sorted(LENGTH_NORMALIZATIONS))
@pytest.mark.parametrize("alpha,n_best", [(0.0, 1), (0.6, 1), (1.0, 3), (2.0, 1), (-0.5, 2)])
def test_the_stopping_rule_changes_no_result_of_a_model(
    model, monkeypatch, normalization, alpha, n_best
):
    """A real model's search stopped by the exact rule equals the same search run on to every
    sentence's limit (tests/test_beams.py checks it for any scores)."""
    src = random_sources([3, 9, 14, 22], seed=7)
    decode = DecodeConfig(
        beam_size=4,
        length_penalty=alpha,
        max_len_a=1.0,
        max_len_b=6,
        n_best=n_best,
        length_normalization=normalization,
    )
    fast = translate_batch(model, src, decode)
    run_to_the_limit(monkeypatch)
    slow = translate_batch(model, src, decode)
    for f, s in zip(fast, slow):
        assert [h.tokens for h in f] == [h.tokens for h in s]
        assert [h.score for h in f] == pytest.approx([h.score for h in s], abs=1e-6)


def run_to_the_limit(monkeypatch):
    """Disable early stopping: every sentence is searched until its length limit."""
    from nmt.decode.beams import Beams

    def settle(beams, step=None):
        beams.active &= beams.step < beams.max_lens

    monkeypatch.setattr(Beams, "_settle", settle)


# ---------------------------------------------------------------- ensembles


def test_ensemble_averages_probabilities_not_log_probabilities():
    first = ScriptedScorer({(): {A: 0.9, B: 0.1}, (A,): {EOS: 0.5, A: 0.5}})
    second = ScriptedScorer({(): {A: 0.05, B: 0.5, C: 0.45}, (A,): {EOS: 0.9, B: 0.1}})
    # Averages: step 1 A 0.475, B 0.3, C 0.225 (a geometric mean would prefer B: 0.224 > 0.212);
    # after A: EOS 0.7, A 0.25, B 0.05; after B (unscripted in both): EOS 1.
    ensemble = EnsembleScorer([first, second])
    (hyps,) = beam_search(
        ensemble,
        (None, None),
        torch.tensor([10]),
        DecodeConfig(beam_size=2, length_penalty=0.0, n_best=2),
    )
    assert [h.tokens for h in hyps] == [[A], [B]]
    assert hyps[0].log_prob == pytest.approx(math.log(0.475 * 0.7), abs=1e-6)
    assert hyps[1].log_prob == pytest.approx(math.log(0.3), abs=1e-6)


def test_ensemble_of_one_equals_the_single_model(model):
    src = random_sources([4, 11, 17], seed=5)
    single = translate_batch(
        model,
        src,
        DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.0, max_len_b=5, n_best=2),
    )
    with torch.inference_mode():
        memory, mask = model.encode(src)
        member, state = TransformerScorer.start(model, memory, mask, 4, capacity=8)
        max_lens = ((src != PAD).sum(1).double() + 5).long()
        one = beam_search(
            EnsembleScorer([member]),
            (state,),
            max_lens,
            DecodeConfig(beam_size=4, length_penalty=0.6, n_best=2),
        )
    assert [[h.tokens for h in hyps] for hyps in one] == [
        [h.tokens for h in hyps] for hyps in single
    ]
    assert [[h.score for h in hyps] for hyps in one] == [[h.score for h in hyps] for hyps in single]


def test_ensemble_of_two_identical_models_equals_one(model):
    src = random_sources([4, 11, 17, 30], seed=6)
    single = translate_batch(
        model,
        src,
        DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.0, max_len_b=5, n_best=3),
    )
    twice = translate_batch(
        [model, model],
        src,
        DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.0, max_len_b=5, n_best=3),
    )
    for s, t in zip(single, twice):
        assert [h.tokens for h in s] == [h.tokens for h in t]
        assert [h.score for h in s] == pytest.approx([h.score for h in t], abs=1e-5)


# ---------------------------------------------------------------- sampling


def test_sampling_distribution_by_hand():
    lprobs = torch.tensor([[0.0, 0.0, 0.0, 0.05, 0.5, 0.3, 0.15]]).log()  # EOS, A, B, C
    assert sampling_probs(lprobs, Sampling()).tolist()[0] == pytest.approx(
        [0, 0, 0, 0.05, 0.5, 0.3, 0.15], abs=1e-6
    )
    # The nucleus for p = 0.7 is {A, B} (0.5 alone falls short, 0.8 reaches it): renormalised 5/8,
    # 3/8.
    assert sampling_probs(lprobs, Sampling(top_p=0.7)).tolist()[0] == pytest.approx(
        [0, 0, 0, 0, 0.625, 0.375, 0], abs=1e-6
    )
    assert sampling_probs(lprobs, Sampling(top_p=0.5)).tolist()[0] == pytest.approx(
        [0, 0, 0, 0, 1, 0, 0], abs=1e-6
    )
    assert sampling_probs(lprobs, Sampling(top_k=3)).tolist()[0] == pytest.approx(
        [0, 0, 0, 0, 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95], abs=1e-6
    )
    # Temperature 0.5 squares the probabilities before renormalising: 0.25, 0.09, 0.0225 (top-k 3),
    # then the nucleus 0.9 of those (0.25 + 0.09 = 0.34 of 0.3625 = 0.938) is {A, B}.
    sharp = sampling_probs(lprobs, Sampling(temperature=0.5, top_k=3, top_p=0.9)).tolist()[0]
    assert sharp == pytest.approx([0, 0, 0, 0, 0.25 / 0.34, 0.09 / 0.34, 0], abs=1e-6)


def test_samples_follow_the_distribution_and_report_model_log_probs():
    table = {(): {A: 0.5, B: 0.3, C: 0.2}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}, (C,): {EOS: 1.0}}
    n = 3000
    (samples,) = sample(
        ScriptedScorer(table),
        None,
        torch.tensor([5]),
        DecodeConfig(n_best=n, length_penalty=0.0),
        Sampling(top_p=0.75),
        seeds=[1],
    )
    counts = {t: sum(h.tokens == [t] for h in samples) for t in (A, B, C)}
    assert counts[C] == 0  # outside the nucleus {A, B}
    assert abs(counts[A] / n - 0.625) < 3 * math.sqrt(0.625 * 0.375 / n)
    # the model's, not the nucleus's
    assert {h.tokens[0]: h.log_prob for h in samples}[B] == pytest.approx(math.log(0.3), abs=1e-6)


def test_top_k_one_is_greedy(model):
    src = random_sources([3, 8, 13, 21], seed=2)
    greedy = translate_batch(
        model, src, DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=1.0, max_len_b=5)
    )
    sampled = translate_batch(
        model,
        src,
        DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=1.0, max_len_b=5),
        sampling=Sampling(top_k=1, temperature=2.0, seed=9),
    )
    assert [h[0].tokens for h in sampled] == [h[0].tokens for h in greedy]
    assert [h[0].log_prob for h in sampled] == pytest.approx(
        [h[0].log_prob for h in greedy], abs=1e-5
    )


def test_sampling_is_seeded_and_independent_of_batching(model):
    src = random_sources([3, 8, 13, 21], seed=2)
    seeds = [sample_seed(7, i) for i in range(4)]
    run = lambda s, seed_list: translate_batch(
        model,
        s,
        DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=1.0, max_len_b=5, n_best=3),
        sampling=Sampling(),
        seeds=seed_list,
    )
    together = run(src, seeds)
    assert [[h.tokens for h in hyps] for hyps in together] == [
        [h.tokens for h in hyps] for hyps in run(src, seeds)
    ]
    for i in range(4):
        n = int((src[i] != PAD).sum())
        assert [h.tokens for h in run(src[i : i + 1, :n], seeds[i : i + 1])[0]] == [
            h.tokens for h in together[i]
        ]
    other = run(src, [sample_seed(8, i) for i in range(4)])
    assert [[h.tokens for h in hyps] for hyps in other] != [
        [h.tokens for h in hyps] for hyps in together
    ]
    assert (
        all(len(hyps) == 3 for hyps in together) and len({tuple(h.tokens) for h in together[3]}) > 1
    )


def test_ensemble_of_two_models_cached_equals_recompute_and_tiled(model):
    from conftest import tiny_config

    from nmt.core.model import Transformer

    torch.manual_seed(1)
    other = Transformer(tiny_config(n_decoder_layers=1)).eval()  # members need not share a shape
    src = random_sources([2, 7, 19, 33], seed=11)
    runs = {
        name: translate_batch(
            [model, other],
            src,
            DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=0.5, max_len_b=6, n_best=2),
            step=name,
        )
        for name in ("dynamic", "tiled", "recompute")
    }
    for name in ("tiled", "recompute"):
        for ref_hyps, hyps in zip(runs[name], runs["dynamic"]):
            assert [h.tokens for h in hyps] == [h.tokens for h in ref_hyps], name
            assert [h.score for h in hyps] == pytest.approx([h.score for h in ref_hyps], abs=1e-5)
    alone = translate_batch(
        model,
        src,
        DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=0.5, max_len_b=6, n_best=2),
    )
    # the second model counts
    assert [[h.tokens for h in hyps] for hyps in alone] != [
        [h.tokens for h in hyps] for hyps in runs["dynamic"]
    ]


# ---------------------------------------------------------------- what may never be generated


def _byte(tokenizer, value: int) -> int:
    return tokenizer.tgt.piece_to_id(f"<0x{value:02X}>")


class PreferenceScorer:
    """Next-token scores: ``prefer`` (prefix → {token: logit}) over a flat floor; other tokens get
    -20."""

    def __init__(self, vocab: int, prefer):
        self.vocab, self.prefer = vocab, prefer

    def step(self, prefix, state):
        rows = []
        for row in prefix.tolist():
            logits = torch.full((self.vocab,), -20.0)
            for token, value in self.prefer(tuple(row[1:])).items():
                logits[token] = value
            rows.append(torch.log_softmax(logits, -1))
        return torch.stack(rows), state

    def reorder(self, state, index):
        return state

    def keep_sentences(self, state, keep):
        return state


def test_search_never_writes_line_breaks_controls_or_broken_characters(byte_tokenizer):
    tok = byte_tokenizer
    b = lambda v: _byte(tok, v)
    (dog, *_) = tok.encode_tgt(["dog"])[0]  # a piece of an ordinary word
    vocab = tok.tgt.get_piece_size()

    def prefer(prefix):
        # Tempting at every step, best first: a line feed, NUL, a stray continuation byte,
        # U+2028 (E2 80 A8) and U+0085 (C2 85) byte by byte, EOS right after a lead byte; "▁dog"
        # last.
        last = prefix[-2:]
        if last == (b(0xE2), b(0x80)):
            # U+2014 EM DASH is the one allowed
            return {b(0xA8): 9.0, b(0xA9): 8.5, b(0x94): 1.0, EOS: 9.5}
        if prefix[-1:] == (b(0xE2),):
            return {b(0x80): 9.0, EOS: 9.5}
        if prefix[-1:] == (b(0xC2),):
            return {b(0x85): 9.0, b(0x9F): 8.9, b(0xA9): 1.0, EOS: 9.5}  # U+00A9 © is allowed
        if len(prefix) >= 6:
            return {EOS: 5.0}
        return {
            b(0x0A): 10.0,
            b(0x00): 9.9,
            b(0x0D): 9.8,
            b(0x85): 9.7,
            b(0xE2): 9.6,
            b(0xC2): 9.5,
            dog: 1.0,
        }

    decode = DecodeConfig(beam_size=3, length_penalty=0.0, n_best=3, max_len_b=20)
    scorer = PreferenceScorer(vocab, prefer)
    (beams,) = beam_search(scorer, None, torch.tensor([20]), decode, tok.output_rules)
    (samples,) = sample(scorer, None, torch.tensor([20]), decode, Sampling(), [3], tok.output_rules)
    for h in beams + samples:
        raw = bytes(
            tok.output_rules.byte_values[i]
            for i in h.tokens
            if tok.output_rules.byte_values[i] >= 0
        )
        raw.decode("utf-8")  # valid UTF-8: no stray or unfinished byte
        (text,) = tok.decode_tgt([h.tokens])
        assert (
            not set(text) & NEVER_OUTPUT and "\ufffd" not in text and len(text.splitlines()) <= 1
        ), (h.tokens, text)
    # the allowed character is reachable
    assert any("\u2014" in text for text in tok.decode_tgt([h.tokens for h in beams]))
    # Unrestricted, the same scorer writes a line feed first.
    (free,) = beam_search(scorer, None, torch.tensor([20]), decode)
    assert b(0x0A) in free[0].tokens


def test_decoding_drops_what_the_search_could_not_prevent(byte_tokenizer):
    """A character cut by the length limit, and ids from elsewhere, never break a line."""
    tok = byte_tokenizer
    b = lambda v: _byte(tok, v)
    dog = tok.encode_tgt(["dog"])[0]
    texts = tok.decode_tgt(
        [
            [*dog, b(0xE2)],
            [*dog, b(0x0A), *dog],
            [b(0xE2), b(0x80), b(0xA8)],
            [b(0xC3), b(0xA9), b(0x80)],
            [b(0x80), *dog],
        ]
    )
    # the line feed became a space before " dog"
    assert texts == ["dog", "dog  dog", " ", "é", "dog"]


def test_length_limit_wins_over_an_unfinished_character(byte_tokenizer):
    tok = byte_tokenizer
    lead = _byte(tok, 0xE3)
    scorer = PreferenceScorer(
        tok.tgt.get_piece_size(), lambda prefix: {lead: 5.0, _byte(tok, 0x81): 4.0, EOS: 0.0}
    )
    (hyps,) = beam_search(
        scorer,
        None,
        torch.tensor([2]),
        DecodeConfig(beam_size=2, length_penalty=0.0),
        tok.output_rules,
    )
    # every sentence gets a translation, however cut
    assert hyps and all(len(h.tokens) <= 2 for h in hyps)
    assert all("\ufffd" not in t for t in tok.decode_tgt([h.tokens for h in hyps]))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    beam=st.integers(1, 4),
    bias=st.floats(0.0, 8.0),
    sampling=st.booleans(),
)
def test_any_scores_give_one_valid_line_per_sentence(byte_tokenizer, seed, beam, bias, sampling):
    """Whatever the model prefers (byte pieces made tempting by ``bias``), outputs are valid
    UTF-8 text on one line with no control character."""
    tok = byte_tokenizer
    values = torch.tensor(tok.output_rules.byte_values)
    vocab = len(values)

    class RandomScorer(PreferenceScorer):
        def step(self, prefix, state):
            rows = []
            for row in prefix.tolist():
                g = torch.Generator().manual_seed(hash((seed, *row)) % 2**63)
                rows.append(
                    torch.log_softmax(
                        torch.randn(vocab, generator=g) * 3 + bias * (values >= 0), -1
                    )
                )
            return torch.stack(rows), state

    decode = DecodeConfig(beam_size=beam, n_best=beam, length_penalty=1.0, max_len_b=12)
    scorer = RandomScorer(vocab, None)
    if sampling:
        (hyps,) = sample(
            scorer, None, torch.tensor([12]), decode, Sampling(), [seed], tok.output_rules
        )
    else:
        (hyps,) = beam_search(scorer, None, torch.tensor([12]), decode, tok.output_rules)
    assert hyps
    for h in hyps:
        assert PAD not in h.tokens and BOS not in h.tokens and UNK not in h.tokens
        (text,) = tok.decode_tgt([h.tokens])
        assert "\ufffd" not in text and not set(text) & NEVER_OUTPUT and len(text.splitlines()) <= 1
        # ended by choice, not cut by the limit: every byte piece belongs to a whole character
        if len(h.tokens) < 12:
            bytes(int(values[i]) for i in h.tokens if values[i] >= 0).decode("utf-8")


def test_a_huge_length_limit_allocates_nothing_up_front(model, monkeypatch):
    """``max_len_b`` 10^9 once preallocated a decoder cache of that many positions (a 30 TB
    allocation); the limits are now bounded, and the cache starts small and grows on demand."""
    from nmt.core.model import Transformer

    favour_eos = torch.zeros(40)
    favour_eos[EOS] = 5.0
    monkeypatch.setattr(
        model, "project", lambda h: F.linear(h, model.tgt_embed.weight) + favour_eos
    )
    capacities = []
    start = Transformer.start_decoding

    def recording(self, memory, src_mask, beam, capacity=32, columns=None):
        capacities.append(capacity)
        return start(self, memory, src_mask, beam, capacity, columns)

    monkeypatch.setattr(Transformer, "start_decoding", recording)
    # raw log-probabilities: with α > 0 the exact stop would wait until lp(|Y|) reaches the limit's
    decode = DecodeConfig(beam_size=2, max_len_a=100, max_len_b=10_000, length_penalty=0.0)
    hyps = translate_batch(model, random_sources([4, 6]), decode)
    assert capacities == [64] and all(len(h[0].tokens) < 50 for h in hyps)


# ---------------------------------------------------------------- prefixes, constraints, bans


def steered(table, beam, steering, n_best=1, max_len=10):
    decode = DecodeConfig(
        beam_size=beam, length_penalty=0.0, n_best=n_best, length_normalization="none"
    )
    return beam_search(
        ScriptedScorer(table),
        None,
        torch.full((len(steering),), max_len),
        decode,
        steering=steering,
    )


def test_a_constraint_the_best_hypothesis_omits_is_met_by_the_hand_derived_best():
    table = {
        (): {A: 0.7, B: 0.2, C: 0.1},
        (A,): {EOS: 0.9, A: 0.1},
        (B,): {EOS: 0.9, B: 0.1},
        (C,): {EOS: 0.6, A: 0.4},
        (C, A): {EOS: 1.0},
    }
    (free,) = steered(table, 2, [Steering()])
    assert free[0].tokens == [A] and free[0].log_prob == pytest.approx(math.log(0.63), abs=1e-6)
    # Step 1: C (0.1) is the only candidate in the bank of one constraint piece; dynamic beam
    # allocation keeps it beside A, pruning B (0.2), which a filter over the ordinary beam would
    # have kept instead. Step 2: "C" ends (0.06); "C A" (0.04) and "A A" (0.07, no EOS while the
    # constraint is unmet) go on.
    (hyps,) = steered(table, 2, [Steering(constraints=((C,),))], n_best=2)
    assert [h.tokens for h in hyps] == [[C], [C, A]] and [h.unmet for h in hyps] == [0, 0]
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.06), math.log(0.04)], abs=1e-6)


def test_constraints_of_several_pieces_in_any_order():
    table = {
        (): {A: 0.5, B: 0.3, C: 0.2},
        (A,): {B: 0.5, C: 0.3, EOS: 0.2},
        (A, B): {C: 0.6, EOS: 0.4},
        (A, B, C): {EOS: 1.0},
        (C,): {A: 0.7, EOS: 0.3},
        (C, A): {B: 0.9, EOS: 0.1},
        (C, A, B): {EOS: 1.0},
    }
    (hyps,) = steered(table, 3, [Steering(constraints=((A, B), (C,)))], n_best=3)
    assert all(h.unmet == 0 for h in hyps)
    for h in hyps:  # every one holds "A B" as consecutive pieces, and C
        assert C in h.tokens and any(h.tokens[i : i + 2] == [A, B] for i in range(len(h.tokens)))
    # "A B C" 0.5·0.5·0.6 = 0.15 beats "C A B" 0.2·0.7·0.9 = 0.126
    assert [h.tokens for h in hyps[:2]] == [[A, B, C], [C, A, B]]
    assert [h.log_prob for h in hyps[:2]] == pytest.approx(
        [math.log(0.15), math.log(0.126)], abs=1e-6
    )


def test_a_prefix_is_forced_then_the_best_continuations_follow():
    table = {
        (): {A: 0.9, B: 0.1},
        (B,): {EOS: 0.6, A: 0.3, C: 0.1},
        (B, A): {EOS: 1.0},
        (B, C): {EOS: 1.0},
    }
    (hyps,) = steered(table, 3, [Steering(prefix=((B,),))], n_best=3)
    assert [h.tokens for h in hyps] == [[B], [B, A], [B, C]]
    # the prefix's own probability counts
    assert [h.log_prob for h in hyps] == pytest.approx(
        [math.log(0.06), math.log(0.03), math.log(0.01)], abs=1e-6
    )
    # A prefix step with a choice (a word the user has not finished): the best allowed piece.
    (hyps,) = steered(table, 2, [Steering(prefix=((B, C),))])
    assert hyps[0].tokens == [B]


def test_banned_phrases_never_appear():
    table = {(): {A: 0.6, B: 0.4}, (A,): {A: 0.7, EOS: 0.3}, (A, A): {EOS: 1.0}, (B,): {EOS: 1.0}}
    (hyps,) = steered(table, 2, [Steering(bans=((A, A),))], n_best=2)
    assert [h.tokens for h in hyps] == [[B], [A]]  # "A A" (0.42) is banned
    (hyps,) = steered(table, 2, [Steering(bans=((A,),))])
    assert hyps[0].tokens == [B]


def test_a_constraint_the_length_limit_cuts_is_reported():
    table = {(): {A: 0.9, B: 0.1}, (A,): {A: 0.9, EOS: 0.1}, (A, A): {A: 0.9, EOS: 0.1}}
    # C has probability 0: it cannot be met
    (hyps,) = steered(table, 1, [Steering(constraints=((C,),))], max_len=2)
    assert hyps and hyps[0].unmet == 1


def test_no_steering_is_bit_identical_and_a_mixed_batch_equals_each_line_alone(model):
    src = random_sources([5, 9, 14, 3], seed=12)
    decode = DecodeConfig(beam_size=4, length_penalty=1.0, max_len_a=1.0, max_len_b=5, n_best=3)
    plain = translate_batch(model, src, decode)
    assert translate_batch(model, src, decode, steering=[Steering()] * 4) == plain
    steering = [
        Steering(constraints=((7, 8), (9,))),
        Steering(),
        Steering(prefix=((11,), (12,)), bans=((13,),)),
        Steering(bans=((14, 15),)),
    ]
    mixed = translate_batch(model, src, decode, steering=steering)
    for i in range(4):
        n = int((src[i] != PAD).sum())
        (alone,) = translate_batch(model, src[i : i + 1, :n], decode, steering=[steering[i]])
        assert [h.tokens for h in alone] == [h.tokens for h in mixed[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in mixed[i]], abs=1e-5)
    assert mixed[1] == plain[1]
    # The best meets both constraints; a hypothesis the length limit cut short of them ranks after
    # every one that meets them.
    assert mixed[0][0].unmet == 0 and [h.unmet for h in mixed[0]] == sorted(
        h.unmet for h in mixed[0]
    )
    assert all(
        any(h.tokens[j : j + 2] == [7, 8] for j in range(len(h.tokens))) and 9 in h.tokens
        for h in mixed[0]
        if h.unmet == 0
    )
    assert all(h.tokens[:2] == [11, 12] and 13 not in h.tokens[2:] for h in mixed[2])


def _holds(tokens, phrase):
    return any(
        tokens[i : i + len(phrase)] == list(phrase) for i in range(len(tokens) - len(phrase) + 1)
    )


# the model is only read
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), beam=st.integers(1, 5), sampling=st.booleans())
def test_every_output_holds_its_constraints_and_no_banned_phrase(model, data, beam, sampling):
    piece = st.integers(4, 39)
    constraints = tuple(
        data.draw(
            st.lists(
                st.lists(piece, min_size=1, max_size=3).map(tuple),
                max_size=2 if not sampling else 0,
            )
        )
    )
    # A ban a constraint holds, or two constraints written one after the other (a ban of two pieces
    # spans one boundary at most), is left out: with (4,) twice and the ban (4, 4), beam 2 keeps
    # only the best hypothesis that has met one constraint, always a newer "... 36 4", whose next 4
    # is banned, and never meets the second (dynamic beam allocation promises no more).
    spelt = [list(c) for c in constraints] + [list(a + b) for a in constraints for b in constraints]
    bans = tuple(
        p
        for p in data.draw(st.lists(st.lists(piece, min_size=1, max_size=2).map(tuple), max_size=3))
        if not any(_holds(c, p) for c in spelt)
    )
    steering = Steering(constraints=constraints, bans=bans)
    src = random_sources([data.draw(st.integers(2, 12))], seed=data.draw(st.integers(0, 100)))
    decode = DecodeConfig(
        beam_size=beam, length_penalty=1.0, max_len_a=1.0, max_len_b=4, n_best=beam
    )
    hyps = translate_batch(
        model, src, decode, steering=[steering], sampling=Sampling(seed=3) if sampling else None
    )[0]
    assert hyps
    for h in hyps:
        assert not any(_holds(h.tokens, p) for p in bans), (h.tokens, bans)
        if h.unmet == 0:
            assert all(_holds(h.tokens, c) for c in constraints), (h.tokens, constraints)
    assert any(h.unmet == 0 for h in hyps)  # with room for the constraints, the search meets them


class EndsLate(ScriptedScorer):
    """A scorer for one sentence: first C 0.2, A 0.45, B 0.35; before C, pieces A and B are likely
    and C rare (0.01), and no end; after C, A (0.98) or an improbable end (0.02) until three pieces
    follow C, then the end."""

    def __init__(self):
        super().__init__({(): {C: 0.2, A: 0.45, B: 0.35}})

    def step(self, prefix, state):
        if prefix.size(1) == 1:
            return super().step(prefix, state)
        rows = []
        for row in prefix.tolist():
            tokens = row[1:]
            probs = torch.zeros(VOCAB)
            if C not in tokens:
                probs[A], probs[B], probs[C] = 0.5, 0.49, 0.01
            elif len(tokens) - tokens.index(C) > 3:
                probs[EOS] = 1.0
            else:
                probs[A], probs[EOS] = 0.98, 0.02
            rows.append(probs.log())
        return torch.stack(rows), state


def test_improbable_ends_of_complete_hypotheses_do_not_fill_the_finished_list():
    """Offering every hypothesis's EOS as a candidate once let the few hypotheses that had met the
    constraint end at each step (0.02) while ranked among the ``beam`` best of the complete bank, so
    three such ends stopped the sentence at [C] (0.2 · 0.02). The probable end comes three pieces
    later."""
    decode = DecodeConfig(beam_size=3, length_penalty=0.0, n_best=1, length_normalization="none")
    ((best,),) = beam_search(
        EndsLate(), None, torch.full((1,), 10), decode, steering=[Steering(constraints=((C,),))]
    )
    assert best.tokens == [C, A, A, A] and best.log_prob == pytest.approx(
        math.log(0.2 * 0.98**3), abs=1e-6
    )


# Values drawn from a few levels, so that rows hold ties, -inf (restricted pieces) and rows with
# fewer finite entries than k.
_LEVELS = st.sampled_from([float("-inf"), -3.0, -1.5, -1.0, -0.25, 0.0])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), rows=st.integers(1, 6), width=st.integers(2, 700))
def test_row_top_gives_topk_values_and_valid_columns(data, rows, width):
    """``row_top`` (block maxima first) returns what ``topk`` over the whole row returns, for any
    width (blocks that do not divide it; fewer blocks than k), ties and -inf: the same values, each
    at a column in range that holds it, and no column twice among the finite ones."""
    from nmt.decode.candidates import row_top

    k = data.draw(st.integers(1, min(width, 24)))  # the search asks for 2·beam
    continuous = data.draw(st.booleans())
    if continuous:
        values = torch.randn(
            rows, width, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
        )
    else:
        values = torch.tensor(
            data.draw(
                st.lists(
                    st.lists(_LEVELS, min_size=width, max_size=width), min_size=rows, max_size=rows
                )
            )
        )
    top, columns = row_top(values, k)
    assert top.shape == columns.shape == (rows, k)
    assert torch.equal(top, values.topk(k, dim=1).values)
    assert ((columns >= 0) & (columns < width)).all()
    held = values.gather(1, columns)
    assert torch.equal(torch.where(torch.isfinite(top), held, top), top)
    for r in range(rows):
        finite = columns[r][torch.isfinite(top[r])].tolist()
        assert len(finite) == len(set(finite))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 4), beam=st.integers(1, 5), vocab=st.integers(2, 300))
def test_candidates_are_the_best_sums_of_hypothesis_and_token(data, n, beam, vocab):
    """``Candidates.best`` (each row's best first) against the ``(n, beam·vocab)`` sums it no
    longer forms: the same ``2·beam`` best scores per sentence, each the sum of its hypothesis'
    score and its token's log-probability; EOS flagged only where it ends finitely."""
    from nmt.decode.candidates import Candidates

    g = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    scores = -torch.rand(n, beam, generator=g) * 5
    # the first step: one live hypothesis
    scores[:, data.draw(st.integers(1, beam)) :] = float("-inf")
    lprobs = torch.log_softmax(torch.randn(n * beam, vocab, generator=g), dim=-1)
    lprobs[:, data.draw(st.lists(st.integers(0, vocab - 1), max_size=vocab - 1))] = float("-inf")
    top = Candidates.best(scores, lprobs)
    flat = (scores.unsqueeze(2) + lprobs.view(n, beam, vocab)).view(n, beam * vocab)
    assert torch.equal(top.scores, flat.topk(2 * beam, dim=1).values)
    finite = torch.isfinite(top.scores)
    rows = torch.arange(n).unsqueeze(1) * beam + top.parent
    assert torch.equal(
        (scores.gather(1, top.parent) + lprobs[rows, top.token])[finite], top.scores[finite]
    )
    assert torch.equal(top.is_eos, (top.token == EOS) & finite)
