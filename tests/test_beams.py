"""The search's state and its stopping rule (nmt.decode.beams), for any scores a model could give:
the exact rule changes no result against running every sentence to its limit, a beam that holds
every prefix finds the brute-force optimum, extra rankings are each exact, and ``patience`` is the
cheaper rule of fairseq and CTranslate2."""

import itertools
import math

import pytest
import torch
from conftest import ScriptedScorer
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.config import DecodeConfig
from nmt.data.tokenizer import BOS, EOS, PAD, UNK
from nmt.decode.beams import Beams, Ranking, length_penalty
from nmt.decode.candidates import Best
from nmt.decode.restrictions import Restrictions
from nmt.decode.search import beam_search


class GeneratedScorer:
    """Next-token log-probabilities drawn from a generator seeded by the sentence and the prefix,
    so that a hypothesis gets the same distribution whatever its row and whatever else is in the
    batch. The state is each row's sentence. ``sharp`` scales the logits (large: one piece takes
    nearly all the probability, as a trained model's, so that long hypotheses stay probable);
    ``grain`` rounds them (ties); ``eos`` favours ending; ``dead``: the share of impossible pieces;
    ``nan``: the chance that a row is NaN (a diverged model's)."""

    def __init__(self, seed, vocab, beam, grain=0.0, eos=0.0, dead=0.0, nan=0.0, sharp=3.0):
        self.seed, self.vocab, self.beam, self.sharp = seed, vocab, beam, sharp
        self.grain, self.eos, self.dead, self.nan = grain, eos, dead, nan

    def log_probs(self, sentence: int, prefix: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, sentence, *prefix)) % 2**63)
        logits = torch.randn(self.vocab, generator=g, dtype=torch.float64) * self.sharp
        if self.grain:
            logits = torch.round(logits / self.grain) * self.grain
        logits[EOS] += self.eos
        # some pieces impossible (-inf), as a shortlist or a rule leaves them
        logits[torch.rand(self.vocab, generator=g) < self.dead] = float("-inf")
        if torch.rand(1, generator=g).item() < self.nan:
            logits[0] = float("nan")
        return torch.log_softmax(logits, -1).float()

    def start(self, sentences: int) -> torch.Tensor:
        return torch.arange(sentences).repeat_interleave(self.beam)

    def step(self, prefix, state):
        rows = [
            self.log_probs(s, tuple(row[1:])) for s, row in zip(state.tolist(), prefix.tolist())
        ]
        assert all(row[0] == BOS for row in prefix.tolist())
        return torch.stack(rows), state

    def reorder(self, state, index):
        return state.index_select(0, index)

    def keep_sentences(self, state, keep):
        rows = (keep.unsqueeze(1) * self.beam + torch.arange(self.beam)).view(-1)
        return state.index_select(0, rows)


def run_to_the_limit(monkeypatch):
    """Disable early stopping: every sentence is searched until its length limit."""

    def settle(beams, step=None):
        beams.active &= beams.step < beams.max_lens

    monkeypatch.setattr(Beams, "_settle", settle)


def identical(a, b):
    """The same n-best lists: tokens, scores and log-probabilities to the bit (NaN equal to NaN)."""
    assert [[(h.tokens, repr(h.score), repr(h.log_prob)) for h in hyps] for hyps in a] == [
        [(h.tokens, repr(h.score), repr(h.log_prob)) for h in hyps] for hyps in b
    ]


SETTINGS = dict(
    seed=st.integers(0, 2**31),
    max_lens=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    beam=st.integers(1, 5),
    n_best=st.integers(1, 6),
    alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0, -0.5, -3.0]),
    normalization=st.sampled_from(["gnmt", "length", "none"]),
    min_len=st.integers(0, 4),
    grain=st.sampled_from([0.0, 0.5, 2.0]),
    eos=st.floats(-2, 4),
    dead=st.sampled_from([0.0, 0.3, 0.9]),
    nan=st.sampled_from([0.0, 0.0, 0.2]),
    sharp=st.sampled_from([3.0, 12.0]),
)


@settings(max_examples=150, deadline=None)
@given(**SETTINGS)
def test_the_exact_stop_gives_what_running_every_sentence_to_its_limit_gives(
    seed, max_lens, beam, n_best, alpha, normalization, min_len, grain, eos, dead, nan, sharp
):
    """Ties, impossible pieces, NaN rows, negative length penalties, n_best past the beam (at most
    beam_size hypotheses come back): the same hypotheses, in the same order, to the bit."""
    decode = DecodeConfig(
        beam_size=beam,
        n_best=min(n_best, 10),
        length_penalty=alpha,
        length_normalization=normalization,
        min_len=min_len,
    )
    scorer = GeneratedScorer(seed, 12, beam, grain, eos, dead, nan, sharp)
    limits = torch.tensor(max_lens)
    stopped = beam_search(scorer, scorer.start(len(max_lens)), limits, decode)
    with pytest.MonkeyPatch.context() as patch:
        run_to_the_limit(patch)
        searched_on = beam_search(scorer, scorer.start(len(max_lens)), limits, decode)
    identical(stopped, searched_on)
    assert all(len(hyps) <= min(n_best, beam) for hyps in stopped)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    limit=st.integers(6, 12),
    beam=st.integers(2, 4),
    alpha=st.sampled_from([1.0, 2.0, 3.0]),
    normalization=st.sampled_from(["gnmt", "length"]),
    sharp=st.sampled_from([3.0, 12.0]),
)
def test_the_stop_waits_while_a_longer_hypothesis_can_still_win(
    seed, limit, beam, alpha, normalization, sharp
):
    """Where the length penalty favours long outputs, the bound must be taken at the longest length
    still allowed: taken at the current one (Hugging Face's ``early_stopping=False``) it stops
    before a longer hypothesis that scores better has ended, in about one case in five here."""
    decode = DecodeConfig(beam_size=beam, length_penalty=alpha, length_normalization=normalization)
    scorer = GeneratedScorer(seed, 12, beam, sharp=sharp)
    limits = torch.tensor([limit, limit // 2])
    stopped = beam_search(scorer, scorer.start(2), limits, decode)
    with pytest.MonkeyPatch.context() as patch:
        run_to_the_limit(patch)
        identical(stopped, beam_search(scorer, scorer.start(2), limits, decode))


def reference_search(scorer, sentence, limit, decode, vocab):
    """Beam search as the papers state it, one sentence, in plain Python and without any early stop
    or cap on the finished: each step the ``2·beam`` best extensions, those ending among the first
    ``beam`` finished, the best ``beam`` others go on; at the limit only EOS (at the model's score,
    whatever ``min_len`` says). Returns the
    ``n_best`` best of every finished hypothesis, as (score, tokens), best first."""
    beam, f32 = decode.beam_size, lambda x: torch.tensor(x, dtype=torch.float32)
    running, finished = [((), f32(0.0))], []
    for step in range(limit + 1):
        candidates = []
        for tokens, score in running:
            lp = scorer.log_probs(sentence, tokens).clone()
            if step == limit:  # the limit wins over every rule: only the model's EOS
                lp[torch.arange(vocab) != EOS] = float("-inf")
            else:
                lp[[PAD, UNK, BOS]] = float("-inf")
                if step < decode.min_len:
                    lp[EOS] = float("-inf")
            candidates += [(score + lp[t], tokens, t) for t in range(vocab)]
        candidates = sorted(candidates, key=lambda c: -float(c[0]))[: 2 * beam]
        ends = [c for c in candidates[:beam] if c[2] == EOS and math.isfinite(c[0])]
        for score, tokens, _ in ends:
            lp = length_penalty(len(tokens) + 1, decode.length_penalty, decode.length_normalization)
            finished.append((float(score) / lp, list(tokens)))
        running = [
            (tokens + (t,), score)
            for score, tokens, t in candidates
            if not (t == EOS and math.isfinite(score))
        ][:beam]
    return sorted(finished, key=lambda x: -x[0])[: decode.n_best]


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    limit=st.integers(2, 8),
    beam=st.integers(2, 4),
    n_best=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0, -1.0]),
    normalization=st.sampled_from(["gnmt", "length", "none"]),
    min_len=st.integers(0, 3),
    eos=st.floats(-2, 4),
    sharp=st.sampled_from([3.0, 12.0]),
)
def test_the_search_returns_the_best_of_every_hypothesis_a_beam_search_finishes(
    seed, limit, beam, n_best, alpha, normalization, min_len, eos, sharp
):
    """Against a plain reference that never stops early and keeps every finished hypothesis: no
    stopping rule, cap or order of finishing changes which hypotheses come back."""
    decode = DecodeConfig(
        beam_size=beam,
        n_best=min(n_best, beam),
        length_penalty=alpha,
        length_normalization=normalization,
        min_len=min_len,
    )
    scorer = GeneratedScorer(seed, 9, beam, eos=eos, sharp=sharp)
    (hyps,) = beam_search(scorer, scorer.start(1), torch.tensor([limit]), decode)
    expected = reference_search(scorer, 0, limit, decode, 9)
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected], rel=1e-6, abs=1e-6)
    for h, (score, tokens) in zip(hyps, expected):
        if sum(abs(s - score) < 1e-5 for s, _ in expected) == 1:  # no near tie
            assert h.tokens == tokens


def brute_force(scorer, sentence, max_len, decode, vocab):
    """Every output of at most ``max_len`` pieces (PAD, UNK and BOS never, EOS not before
    ``min_len``, only EOS at the limit), scored in float64 as the search ranks them, best first."""
    out = []
    pieces = [t for t in range(vocab) if t not in (PAD, UNK, BOS, EOS)]
    for length in range(max_len + 1):
        for tokens in itertools.product(pieces, repeat=length):
            total = 0.0
            for i, token in enumerate((*tokens, EOS)):
                lp = float(scorer.log_probs(sentence, tokens[:i])[token])
                if token == EOS and i < decode.min_len and i < max_len:
                    lp = -math.inf
                total += lp
            if math.isfinite(total):
                penalty = length_penalty(
                    length + 1, decode.length_penalty, decode.length_normalization
                )
                out.append((total / penalty, list(tokens)))
    return sorted(out, key=lambda x: -x[0])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    max_lens=st.lists(st.integers(0, 3), min_size=1, max_size=2),
    n_best=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 1.0, 2.0, -1.0]),
    normalization=st.sampled_from(["gnmt", "length"]),
    min_len=st.integers(0, 2),
    eos=st.floats(-3, 3),
    dead=st.sampled_from([0.0, 0.3]),
)
def test_a_beam_that_holds_every_prefix_finds_the_brute_force_optimum(
    seed, max_lens, n_best, alpha, normalization, min_len, eos, dead
):
    """Two pieces besides the special ones and at most 3 of them: at most 8 prefixes, 24
    extensions a step, so a beam of 24 keeps every candidate and the search is exhaustive. Its
    n-best list is the best outputs of all, whatever α and however early the rule stops it."""
    vocab, beam = 6, 24
    decode = DecodeConfig(
        beam_size=beam,
        n_best=n_best,
        length_penalty=alpha,
        length_normalization=normalization,
        min_len=min_len,
    )
    scorer = GeneratedScorer(seed, vocab, beam, eos=eos, dead=dead)
    found = beam_search(scorer, scorer.start(len(max_lens)), torch.tensor(max_lens), decode)
    for sentence, (hyps, limit) in enumerate(zip(found, max_lens)):
        best = brute_force(scorer, sentence, limit, decode, vocab)[:n_best]
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in best], rel=1e-5, abs=1e-5)
        for h, (score, tokens) in zip(hyps, best):
            # the same output unless another scores within float32's rounding of it
            if sum(abs(s - score) < 1e-5 for s, _ in best) == 1:
                assert h.tokens == tokens


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    max_lens=st.lists(st.integers(0, 8), min_size=1, max_size=3),
    beam=st.integers(1, 4),
    eos=st.floats(-2, 3),
    rankings=st.lists(
        st.tuples(st.sampled_from(["gnmt", "length", "none"]), st.sampled_from([0.0, 0.6, 2.0])),
        min_size=1,
        max_size=4,
    ),
)
def test_every_extra_ranking_is_exact(seed, max_lens, beam, eos, rankings):
    """Searched once with several rankings (what tune-decode re-ranks), every finished hypothesis
    comes back, and the best of them under each ranking is what a search with that ranking alone
    returns."""
    scorer = GeneratedScorer(seed, 10, beam, eos=eos)
    limits = torch.tensor(max_lens)
    decode = DecodeConfig(beam_size=beam, length_penalty=1.0, length_normalization="length")
    every = beam_search(
        scorer, scorer.start(len(max_lens)), limits, decode, rankings=tuple(rankings)
    )
    for normalization, alpha in rankings:
        alone = DecodeConfig(
            beam_size=beam, length_penalty=alpha, length_normalization=normalization
        )
        own = beam_search(scorer, scorer.start(len(max_lens)), limits, alone)
        for hyps, (best,) in zip(every, own):
            rescored = max(
                hyps,
                key=lambda h: h.log_prob / length_penalty(len(h.tokens) + 1, alpha, normalization),
            )
            assert rescored.log_prob == best.log_prob and rescored.tokens == best.tokens


def test_a_ranking_that_is_no_setting_is_refused_and_an_empty_batch_is_nothing():
    decode = DecodeConfig(beam_size=2)
    for ranking in (("average", 1.0), ("length", 1e6), ("gnmt", float("nan"))):
        with pytest.raises(ValueError, match="the normalisation must be one of gnmt, length, none"):
            Ranking.of(decode, 2, 5, rankings=(ranking,))
    from nmt.decode.search import translate_batch

    assert translate_batch(None, torch.zeros(0, 3, dtype=torch.long), decode) == []


A, B = 4, 5


def test_patience_one_stops_at_beam_size_finished_and_the_exact_rule_searches_on():
    """Beam 2, |Y|^1 with EOS counted. Step 0 ends "" (log 0.4 = -0.916) and keeps A (0.5), B
    (0.1). Step 1 ends "B" (log 0.1 = -2.303, /2) and A goes on: two have finished, so fairseq's
    rule (patience 1) returns "" at -0.916. But "A A A" (log 0.5 = -0.693 over |Y| = 4: -0.173)
    could still win, and the exact rule finds it."""
    table = {
        (): {EOS: 0.4, A: 0.5, B: 0.1},
        (A,): {A: 1.0},
        (B,): {EOS: 1.0},
        (A, A): {A: 1.0},
        (A, A, A): {EOS: 1.0},
    }
    decode = DecodeConfig(beam_size=2, length_penalty=1.0, length_normalization="length")
    patient = ScriptedScorer(table)
    (early,) = beam_search(
        patient, None, torch.tensor([10]), DecodeConfig(**{**vars(decode), "patience": 1.0})
    )
    assert early[0].tokens == [] and early[0].score == pytest.approx(math.log(0.4))
    assert patient.calls == 2
    exact = ScriptedScorer(table)
    (best,) = beam_search(exact, None, torch.tensor([10]), decode)
    assert best[0].tokens == [A, A, A] and best[0].score == pytest.approx(math.log(0.5) / 4)
    # settled after "A A A" ended (step 3): the running "A A A A..." have probability 0
    assert exact.calls == 4


def test_one_step_by_hand():
    """Beam 2, one sentence, vocabulary of 6 (ids 4 and 5 the pieces): step 0 keeps 4 (-0.1) and 5
    (-0.5); step 1 ends 4 with EOS (-0.1 - 0.2 = -0.3), continues 4 4 (-0.1 - 1.0) and 5 5
    (-0.5 - 0.7); the finished hypothesis scores -0.3 / 2**1 with length normalisation α 1."""
    decode = DecodeConfig(beam_size=2, n_best=1, length_penalty=1.0, length_normalization="length")
    beams = Beams.start(1, 2, 4, Ranking.of(decode, 2, 2), torch.device("cpu"))
    beams.reset_(torch.tensor([2]))
    restrict = Restrictions(decode, None, torch.device("cpu"))
    inf = float("-inf")
    # columns: PAD, UNK, BOS, EOS, 4, 5
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    first = torch.tensor([[0.0, 0.0, 0.0, -3.0, -0.1, -0.5]] * 2)
    restrict(first, beams)
    assert first[0, :3].tolist() == [inf] * 3  # PAD, UNK and BOS never
    back = beams.update(first, Best())
    assert beams.tokens[:, 1].tolist() == [4, 5] and back.tolist() == [0, 0]
    assert beams.scores[0].tolist() == pytest.approx([-0.1, -0.5])
    second = torch.tensor([[inf, inf, inf, -0.2, -1.0, -3.0], [inf, inf, inf, -2.0, -4.0, -0.7]])
    back = beams.update(second, Best())
    assert back.tolist() == [0, 1] and beams.tokens[:, 2].tolist() == [4, 5]
    assert beams.done.tolist() == [1] and beams.done_lengths[0, 0].item() == 1
    assert beams.scores[0].tolist() == pytest.approx([-1.1, -1.2])
    # settled by the bound: the best running hypothesis (-1.1) can reach at best -1.1 / 3 = -0.367
    # (|Y| = 3, EOS counted, at the limit of 2 pieces), below the finished one's -0.15
    assert beams.active.tolist() == [False]
    (best,) = beams.results([0])[0]
    assert best.tokens == [4] and best.score == pytest.approx(-0.15)
    assert best.log_prob == pytest.approx(-0.3)
