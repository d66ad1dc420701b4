"""Batched beam search (greedy search is beam size 1).

The search only needs a :class:`Scorer`: something that gives next-token
log-probabilities for every hypothesis and can reorder or shrink its state. The
Transformer's cached decoder is one (:class:`TransformerScorer`); tests drive the same
search with scripted scorers whose probabilities are fixed by hand.

Shapes: ``batch`` active sentences, ``beam`` hypotheses each, rows of
``(batch*beam, ...)`` tensors ordered sentence-major (row ``b*beam + k``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from .model import beam_rows
from .tokenizer import BOS, EOS, PAD, UNK


@dataclass(frozen=True)
class Hypothesis:
    """A finished translation: ``tokens`` without BOS/EOS, ``log_prob`` = log P(Y|X) summed
    over the tokens and EOS (nats), ``score`` = ``log_prob / lp(|Y|)``; ``alignment``:
    ``(source piece, target piece)`` index pairs when asked for (:mod:`nmt.align`)."""

    tokens: list[int]
    score: float
    log_prob: float
    alignment: tuple[tuple[int, int], ...] | None = None


class Scorer(Protocol):
    def step(self, prefix: Tensor, state: Any) -> tuple[Tensor, Any]:
        """Log-probabilities ``(batch*beam, vocab)`` of the token after ``prefix`` ``(batch*beam, t)``
        (which starts with BOS), and the state extended by that prefix's last token."""

    def reorder(self, state: Any, index: Tensor) -> Any:
        """Keep hypothesis rows ``index`` ``(batch*beam,)``."""

    def select_sentences(self, state: Any, keep: Tensor) -> Any:
        """Keep sentences ``keep`` ``(new_batch,)`` with all their beams."""


class TransformerScorer:
    """The production path: :meth:`nmt.model.Transformer.decode_step` over a
    :class:`~nmt.model.DecoderCache` whose source side is shared by each sentence's beams."""

    def __init__(self, model):
        self.model = model

    @classmethod
    def start(cls, model, memory: Tensor, src_mask: Tensor, beam: int, capacity: int = 32):
        """The scorer and its first state; ``capacity``: target positions to allocate for."""
        return cls(model), model.start_decoding(memory, src_mask, beam, capacity)

    def step(self, prefix, cache):
        return self.model.decode_step(prefix[:, -1], cache)

    def reorder(self, cache, index):
        return cache.reorder(index)

    def select_sentences(self, cache, keep):
        return cache.select_sentences(keep)


class TiledScorer(TransformerScorer):
    """Reference: the source side copied ``beam`` times, one copy per hypothesis (what most
    toolkits do). Kept to prove, and to measure, what sharing it saves."""

    @classmethod
    def start(cls, model, memory, src_mask, beam, capacity=32):
        scorer = cls(model)
        scorer.beam = beam
        return scorer, model.start_decoding(memory.repeat_interleave(beam, 0), src_mask.repeat_interleave(beam, 0), 1, capacity)

    def select_sentences(self, cache, keep):
        return cache.select_sentences(beam_rows(keep, self.beam))


class RecomputeScorer:
    """Reference: no cache; the whole decoder reruns over the full prefix at every step
    (against a tiled source). Kept to prove the cache exact and to measure what it saves."""

    def __init__(self, model, beam: int):
        self.model, self.beam = model, beam

    @classmethod
    def start(cls, model, memory, src_mask, beam, capacity=0):
        return cls(model, beam), (memory.repeat_interleave(beam, 0), src_mask.repeat_interleave(beam, 0))

    def step(self, prefix, state):
        logits = self.model.decode(prefix, *state)[:, -1]
        return torch.log_softmax(logits.float(), dim=-1), state

    def reorder(self, state, index):
        return state[0].index_select(0, index), state[1].index_select(0, index)

    def select_sentences(self, state, keep):
        return self.reorder(state, beam_rows(keep, self.beam))


class EnsembleScorer:
    """Several models decoding as one: at every step their next-token probabilities are
    averaged, ``log (1/M · Σ_m P_m(y | prefix, X))`` (fairseq's ensemble rule), and the
    beam search sees one scorer. Each member keeps its own state (for Transformers, its own
    cache), which follows the same back-pointers; the state is the tuple of members' states.
    """

    def __init__(self, members: list):
        self.members = members

    def step(self, prefix, states):
        outputs = [member.step(prefix, state) for member, state in zip(self.members, states)]
        lprobs = torch.stack([lp for lp, _ in outputs])  # (n_models, batch*beam, vocab)
        return torch.logsumexp(lprobs, dim=0) - math.log(len(outputs)), tuple(state for _, state in outputs)

    def reorder(self, states, index):
        return tuple(member.reorder(state, index) for member, state in zip(self.members, states))

    def select_sentences(self, states, keep):
        return tuple(member.select_sentences(state, keep) for member, state in zip(self.members, states))


SCORERS = {"cached": TransformerScorer, "tiled": TiledScorer, "recompute": RecomputeScorer}


def _gnmt(length: int, alpha: float) -> float:
    """GNMT's ``((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, §7)."""
    return ((5.0 + length) / 6.0) ** alpha


def _length(length: int, alpha: float) -> float:
    """``|Y| ** alpha``: fairseq's ``--lenpen``, Hugging Face's and CTranslate2's ``length_penalty``."""
    return float(length) ** alpha


def _none(length: int, alpha: float) -> float:
    """Raw log-probability: no division."""
    return 1.0


# Each maps (|Y| with EOS counted, alpha) to the positive divisor lp(|Y|) of log P(Y|X), and
# is monotone in |Y| for a fixed alpha: the early-stop bound in `_settled` relies on that.
LENGTH_NORMALIZATIONS = {"gnmt": _gnmt, "length": _length, "none": _none}


def length_penalty(length: int, alpha: float, normalization: str) -> float:
    """The divisor ``lp(|Y|)`` that ranks a finished hypothesis by ``log P(Y|X) / lp(|Y|)``.

    ``length`` counts the hypothesis' pieces and its EOS (fairseq and Hugging Face count
    EOS too; CTranslate2 does not). ``normalization`` is a key of
    :data:`LENGTH_NORMALIZATIONS`; every one is 1 when ``alpha`` is 0.
    """
    return LENGTH_NORMALIZATIONS[normalization](length, alpha)


def _settled(done: list[Hypothesis], best_running: float, beam: int, n_best: int, alpha: float, step: int, max_len: int, normalization: str) -> bool:
    """Whether a sentence's result can no longer change.

    Either ``beam`` hypotheses have finished (the usual rule), or the ``n_best`` best
    finished ones all score at least what the best running hypothesis could still reach:
    its log-probability can only fall, so its score is at most ``best_running / lp(L)``
    for the most favourable final length ``L`` (EOS counted). Every normalisation is
    monotone in ``L``, so that ``L`` is one of the ends of ``[step + 2, max_len + 1]``.
    This bound is exact: stopping then returns the same n-best list as searching on, in
    fewer steps.
    """
    if len(done) >= beam:
        return True
    if len(done) < n_best:
        return False
    lp = max(length_penalty(step + 2, alpha, normalization), length_penalty(max_len + 1, alpha, normalization))
    bound = best_running / lp if best_running < 0 else best_running
    return min(h.score for h in sorted(done, key=lambda h: -h.score)[:n_best]) >= bound


def _restrict(lprobs: Tensor, step: int, min_len: int, at_limit: Tensor, rows_per_sentence: int, allow_unk: bool = False) -> None:
    """Forbid, in place, what no search may generate in ``lprobs`` ``(batch*rows_per_sentence, vocab)``:
    PAD and BOS always, UNK unless ``allow_unk``, EOS before ``min_len`` pieces; the rows of the
    sentences ``at_limit`` ``(batch,)`` (bool) may only end."""
    lprobs[:, PAD] = float("-inf")
    lprobs[:, BOS] = float("-inf")
    if not allow_unk:
        lprobs[:, UNK] = float("-inf")
    if step < min_len:
        lprobs[:, EOS] = float("-inf")
    if bool(at_limit.any()):
        at_limit = at_limit.repeat_interleave(rows_per_sentence)  # (batch*rows_per_sentence,)
        eos = lprobs[at_limit, EOS]
        lprobs[at_limit] = float("-inf")
        lprobs[at_limit, EOS] = eos


def beam_search(
    scorer: Scorer,
    state: Any,
    max_lens: Tensor,
    beam_size: int,
    alpha: float = 0.0,
    n_best: int = 1,
    min_len: int = 0,
    normalization: str = "length",
    allow_unk: bool = False,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences.

    Each step scores ``beam`` hypotheses per sentence over the whole vocabulary and keeps
    the ``2·beam`` best extensions. Those ending in EOS among the first ``beam`` are set
    aside as finished, and the best ``beam`` that do not end in EOS continue, so finished
    hypotheses never starve the beam. A sentence stops once it has ``beam`` finished
    hypotheses, once no running hypothesis can still enter its n-best list (see
    :func:`_settled`), or at its length limit (then EOS is forced); it then leaves the batch.

    Args:
        scorer: see :class:`Scorer`; ``state`` must already hold ``beam_size`` rows per sentence.
        max_lens: ``(batch,)`` most pieces to generate per sentence, EOS not counted.
        beam_size: hypotheses per sentence; 1 is greedy search.
        alpha: length-penalty exponent for ranking finished hypotheses.
        n_best: hypotheses returned per sentence (at most ``beam_size``).
        min_len: EOS is forbidden before this many pieces (benchmarks force a length).
        normalization: how finished hypotheses are ranked, a key of
            :data:`LENGTH_NORMALIZATIONS` (see :func:`length_penalty`).
        allow_unk: let hypotheses contain UNK; otherwise it is never generated, like PAD and BOS.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.

    Raises:
        ValueError: ``normalization`` is not a known name.
    """
    if normalization not in LENGTH_NORMALIZATIONS:
        raise ValueError(f"unknown length normalization {normalization!r}; choose one of {', '.join(LENGTH_NORMALIZATIONS)}")
    batch, beam = max_lens.size(0), beam_size
    device = max_lens.device
    max_lens_cpu = max_lens.tolist()
    tokens = torch.full((batch * beam, 1), BOS, dtype=torch.long, device=device)
    scores = torch.zeros(batch, beam, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    sentence_ids = list(range(batch))  # original index of each active sentence
    beam_offsets = torch.arange(batch, device=device).unsqueeze(1) * beam
    step = 0
    while sentence_ids:
        n = len(sentence_ids)
        lprobs, state = scorer.step(tokens, state)  # (n*beam, vocab)
        vocab = lprobs.size(-1)
        _restrict(lprobs, step, min_len, step >= max_lens, beam, allow_unk)

        candidates = (scores.unsqueeze(2) + lprobs.view(n, beam, vocab)).view(n, beam * vocab)
        top_scores, top_index = candidates.topk(2 * beam, dim=1)  # (n, 2*beam)
        top_beam, top_token = top_index // vocab, top_index % vocab
        is_eos = (top_token == EOS) & torch.isfinite(top_scores)

        # Finished hypotheses: EOS among the first `beam` candidates.
        eos_rows, eos_cols = is_eos[:, :beam].nonzero(as_tuple=True)
        if eos_rows.numel():
            penalty = length_penalty(step + 1, alpha, normalization)
            src_rows = (eos_rows * beam + top_beam[eos_rows, eos_cols]).tolist()
            for r, src_row, log_prob in zip(eos_rows.tolist(), src_rows, top_scores[eos_rows, eos_cols].tolist()):
                done = finished[sentence_ids[r]]
                if len(done) < beam:
                    done.append(Hypothesis(tokens[src_row, 1:].tolist(), log_prob / penalty, log_prob))

        # Continuing hypotheses: the first `beam` candidates that are not EOS.
        rank = is_eos.long() * (2 * beam) + torch.arange(2 * beam, device=device)
        chosen = rank.topk(beam, dim=1, largest=False).indices  # (n, beam)
        scores = top_scores.gather(1, chosen)
        back = (beam_offsets[:n] + top_beam.gather(1, chosen)).view(-1)  # flat back-pointers
        tokens = torch.cat([tokens.index_select(0, back), top_token.gather(1, chosen).view(-1, 1)], dim=1)
        if beam > 1:
            state = scorer.reorder(state, back)

        best_running = scores[:, 0].tolist()
        keep = [r for r, s in enumerate(sentence_ids) if step < max_lens_cpu[r] and not _settled(finished[s], best_running[r], beam, n_best, alpha, step, max_lens_cpu[r], normalization)]
        if len(keep) < n:
            sentence_ids = [sentence_ids[r] for r in keep]
            max_lens_cpu = [max_lens_cpu[r] for r in keep]
            if not keep:
                break
            keep_t = torch.tensor(keep, device=device)
            max_lens = max_lens.index_select(0, keep_t)
            scores = scores.index_select(0, keep_t)
            tokens = tokens.view(n, beam, -1).index_select(0, keep_t).view(len(keep) * beam, -1)
            state = scorer.select_sentences(state, keep_t)
        step += 1
    return [sorted(h, key=lambda hyp: -hyp.score)[:n_best] for h in finished]


@dataclass(frozen=True)
class Sampling:
    """Random sampling in place of beam search (back-translation, data augmentation).

    Each step draws the next piece from the model's distribution with every log-probability
    divided by ``temperature`` (below 1 sharper, above 1 flatter), then restricted to the
    ``top_k`` most probable pieces (0: no limit; Fan et al. 2018, §5.4) and, within those,
    to the nucleus: the fewest most probable pieces whose probabilities sum to at least
    ``top_p`` (1: no limit; Holtzman et al. 2020, §3.1), renormalised. Draws are seeded per
    sentence from ``seed`` and the sentence's index in the input (:func:`sample_seed`).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


def sample_seed(seed: int, index: int) -> int:
    """The seed of the draws for input sentence ``index``: a hash of both (NumPy's SeedSequence),
    so that a sentence's samples do not depend on which sentences share its batch."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0])


def sampling_probs(lprobs: Tensor, sampling: Sampling) -> Tensor:
    """The distribution a piece is drawn from, ``(rows, vocab)``, from log-probabilities
    ``(rows, vocab)``: temperature, then top-k, then top-p (see :class:`Sampling`), renormalised."""
    probs = torch.softmax(lprobs / sampling.temperature, dim=-1)
    if sampling.top_k <= 0 and sampling.top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # ties: lower id first, as argmax
    if sampling.top_k > 0:
        sorted_p[:, sampling.top_k :] = 0.0
    if sampling.top_p < 1.0:
        kept = sorted_p / sorted_p.sum(-1, keepdim=True)
        # A piece is in the nucleus if the pieces before it do not reach top_p yet (so the first always is).
        sorted_p = sorted_p * ((kept.cumsum(-1) - kept) < sampling.top_p)
    probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


def sample(
    scorer: Scorer, state: Any, max_lens: Tensor, n: int, sampling: Sampling, seeds: list[int], alpha: float = 0.0, min_len: int = 0,
    allow_unk: bool = False, normalization: str = "length",
) -> list[list[Hypothesis]]:
    """``n`` independent samples per sentence (ancestral sampling, see :class:`Sampling`).

    Each sentence's ``n`` rows draw from their own distributions with uniform numbers from a
    generator seeded by ``seeds[sentence]``, so results are reproducible and independent of
    batching (up to floating-point rounding of the model's scores). Length limits and the
    PAD/BOS/UNK/EOS rules are those of :func:`beam_search`.

    Args:
        scorer: see :class:`Scorer`; ``state`` must hold ``n`` rows per sentence.
        max_lens: ``(batch,)`` most pieces per sample, EOS not counted.
        seeds: one per sentence.
        alpha, normalization: the length normalisation of the reported ``score`` (see :func:`length_penalty`).

    Returns:
        For each sentence, its ``n`` samples, best ``score`` first; ``log_prob`` is the
        sample's log-probability under the model (temperature 1, no top-k/top-p).
    """
    batch, device = max_lens.size(0), max_lens.device
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    tokens = torch.full((batch * n, 1), BOS, dtype=torch.long, device=device)
    log_probs = torch.zeros(batch * n, device=device)
    done = torch.zeros(batch * n, dtype=torch.bool, device=device)
    samples: list[list[Hypothesis]] = [[] for _ in range(batch)]
    sentence_ids = list(range(batch))
    step = 0
    while sentence_ids:
        lprobs, state = scorer.step(tokens, state)  # (rows, vocab)
        _restrict(lprobs, step, min_len, step >= max_lens, n, allow_unk)
        uniform = torch.cat([torch.rand(n, generator=generators[s]) for s in sentence_ids]).to(device)
        cdf = sampling_probs(lprobs, sampling).cumsum(-1)
        token = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1).clamp_(max=cdf.size(1) - 1)
        log_probs += torch.where(done, 0.0, lprobs.gather(1, token.unsqueeze(1)).squeeze(1))
        tokens = torch.cat([tokens, token.unsqueeze(1)], dim=1)
        ended = (token == EOS) & ~done
        for row in ended.nonzero().view(-1).tolist():
            log_prob = float(log_probs[row])
            samples[sentence_ids[row // n]].append(Hypothesis(tokens[row, 1:-1].tolist(), log_prob / length_penalty(step + 1, alpha, normalization), log_prob))
        done |= ended
        keep = (~done.view(-1, n).all(1)).nonzero().view(-1)
        if keep.numel() < len(sentence_ids):
            sentence_ids = [sentence_ids[r] for r in keep.tolist()]
            if not sentence_ids:
                break
            rows = beam_rows(keep, n)
            tokens, log_probs, done = tokens.index_select(0, rows), log_probs.index_select(0, rows), done.index_select(0, rows)
            max_lens = max_lens.index_select(0, keep)
            state = scorer.select_sentences(state, keep)
        step += 1
    return [sorted(s, key=lambda hyp: -hyp.score) for s in samples]


@torch.inference_mode()
def translate_batch(
    model,
    src: Tensor,
    beam_size: int,
    alpha: float,
    max_len_a: float,
    max_len_b: int,
    n_best: int = 1,
    min_len: int = 0,
    scorer: str = "cached",
    sampling: Sampling | None = None,
    seeds: list[int] | None = None,
    allow_unk: bool = False,
    normalization: str = "length",
) -> list[list[Hypothesis]]:
    """Encode ``src`` ``(batch, src_len)`` once and beam-search each sentence.

    ``model`` is a :class:`~nmt.model.Transformer`, or a list of them that decode as an
    ensemble (:class:`EnsembleScorer`). The length limit is ``max_len_a · src_len +
    max_len_b`` pieces, ``src_len`` counting the sentence's non-pad source tokens (EOS
    included). ``scorer`` picks the production path (``"cached"``) or a reference
    (``"tiled"``, ``"recompute"``; see :data:`SCORERS`). With ``sampling``, each sentence
    gets ``n_best`` independent samples (:func:`sample`) instead, its draws seeded by
    ``seeds[i]`` (default: :func:`sample_seed` of ``sampling.seed`` and ``i``).
    ``normalization`` ranks finished hypotheses (see :func:`length_penalty`).
    """
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    src_lens = (src != PAD).sum(1)
    max_lens = (max_len_a * src_lens.double() + max_len_b).long()
    rows = n_best if sampling is not None else beam_size
    members, states = [], []
    for m in models:
        memory, src_mask = m.encode(src)
        # Room for the longest possible output (pieces + EOS): the cache never has to grow.
        member, state = SCORERS[scorer].start(m, memory, src_mask, rows, capacity=int(max_lens.max()) + 1)
        members.append(member)
        states.append(state)
    step_scorer, state = (members[0], states[0]) if len(members) == 1 else (EnsembleScorer(members), tuple(states))
    if sampling is not None:
        seeds = seeds if seeds is not None else [sample_seed(sampling.seed, i) for i in range(src.size(0))]
        return sample(step_scorer, state, max_lens, n_best, sampling, seeds, alpha, min_len, allow_unk, normalization)
    return beam_search(step_scorer, state, max_lens, beam_size, alpha, n_best, min_len, normalization=normalization, allow_unk=allow_unk)
