"""Batched beam search (greedy search is beam size 1) and sampling.

The search only needs a :class:`~nmt.core.scorers.Scorer`: something that gives next-token
log-probabilities for every hypothesis and can reorder or shrink its state. The
Transformer's cached decoder is one (:class:`~nmt.core.scorers.TransformerScorer`); tests drive the
same search with scripted scorers whose probabilities are fixed by hand. Its settings travel as
one value, the :class:`~nmt.config.DecodeConfig` built from the config and the flags.

Each step of :func:`beam_search` is named: score, restrict
(:class:`~nmt.core.restrictions.Restrictions`), take the best :class:`Candidates`, finish those that
end, advance the others (the scorer's state follows their back-pointers), keep the sentences not yet
settled. What moves together when sentences leave the batch lives in one record, :class:`Beams`.

Shapes: ``batch`` active sentences, ``beam`` hypotheses each, rows of
``(batch*beam, ...)`` tensors ordered sentence-major (row ``b*beam + k``).
"""

# Size: module at most 410 lines: beam search and sampling with the steps they share, read top to
# bottom as one search.

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..config import DecodeConfig
from .beams import Beams, Candidates, Steering
from .constraints import allocate
from .pieces import EOS, PAD, OutputRules
from .restrictions import Restrictions
from .scorers import SCORERS, EnsembleScorer, Scorer


@dataclass(frozen=True)
class Hypothesis:
    """A finished translation: ``tokens`` without BOS/EOS, ``log_prob`` = log P(Y|X) summed
    over the tokens and EOS (nats), ``score`` = ``log_prob / lp(|Y|)``; ``alignment``:
    ``(source piece, target piece)`` index pairs when asked for (:mod:`nmt.align`); ``unmet``:
    how many of its sentence's constraints it lacks (see :mod:`nmt.core.constraints`)."""

    tokens: list[int]
    score: float
    log_prob: float
    alignment: tuple[tuple[int, int], ...] | None = None
    # constraints the hypothesis does not hold: only when its length limit forced the end
    unmet: int = 0


def _gnmt(length: int, alpha: float) -> float:
    """GNMT's ``((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, §7)."""
    return ((5.0 + length) / 6.0) ** alpha


def _length(length: int, alpha: float) -> float:
    """``|Y| ** alpha``: fairseq's ``--lenpen``, Hugging Face's and CTranslate2's
    ``length_penalty``."""
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


def _settled(
    done: list[Hypothesis], best_running: float, step: int, max_len: int, decode: DecodeConfig
) -> bool:
    """Whether a sentence's result can no longer change.

    Either ``beam_size`` hypotheses have finished (the usual rule), or the ``n_best`` best
    finished ones all score at least what the best running hypothesis could still reach:
    its log-probability can only fall, so its score is at most ``best_running / lp(L)``
    for the most favourable final length ``L`` (EOS counted). Every normalisation is
    monotone in ``L``, so that ``L`` is one of the ends of ``[step + 2, max_len + 1]``.
    This bound is exact: stopping then returns the same n-best list as searching on, in
    fewer steps.
    """
    if len(done) >= decode.beam_size:
        return True
    if len(done) < decode.n_best:
        return False
    alpha, normalization = decode.length_penalty, decode.length_normalization
    lp = max(
        length_penalty(step + 2, alpha, normalization),
        length_penalty(max_len + 1, alpha, normalization),
    )
    bound = best_running / lp if best_running < 0 else best_running
    return min(h.score for h in sorted(done, key=lambda h: -h.score)[: decode.n_best]) >= bound


def _finish(
    top: Candidates, beams: Beams, finished: list[list[Hypothesis]], step: int, decode: DecodeConfig
) -> None:
    """Set aside the hypotheses that end (EOS among the first ``beam`` candidates) while their
    sentence has room."""
    beam = decode.beam_size
    eos_rows, eos_cols = top.is_eos[:, :beam].nonzero(as_tuple=True)
    if not eos_rows.numel():
        return
    penalty = length_penalty(step + 1, decode.length_penalty, decode.length_normalization)
    src_rows = eos_rows * beam + top.beam[eos_rows, eos_cols]
    unmet = (
        beams.progress.unmet(src_rows).tolist()
        if beams.progress is not None
        else [0] * len(src_rows)
    )
    # Each read from a GPU waits for it: the finished hypotheses' tokens are read at once, not one
    # by one.
    tokens = beams.tokens[src_rows, 1:].tolist()
    for r, hyp_tokens, log_prob, lacking in zip(
        eos_rows.tolist(), tokens, top.scores[eos_rows, eos_cols].tolist(), unmet
    ):
        done = finished[beams.sentences[r]]
        if len(done) < beam:
            done.append(Hypothesis(hyp_tokens, log_prob / penalty, log_prob, unmet=lacking))


def beam_search(
    scorer: Scorer,
    state: Any,
    max_lens: Tensor,
    decode: DecodeConfig,
    rules: OutputRules | None = None,
    steering: list[Steering] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences.

    Each step scores ``beam_size`` hypotheses per sentence over the whole vocabulary and
    keeps the ``2·beam`` best extensions. Those ending in EOS among the first ``beam`` are
    set aside as finished, and the best ``beam`` that do not end in EOS continue, so
    finished hypotheses never starve the beam. A sentence stops once it has ``beam`` finished
    hypotheses, once no running hypothesis can still enter its n-best list (see
    :func:`_settled`), or at its length limit (then EOS is forced); it then leaves the batch.

    Args:
        scorer: see :class:`Scorer`; ``state`` must already hold ``beam_size`` rows per sentence.
        max_lens: ``(batch,)`` most pieces to generate per sentence, EOS not counted.
        decode: the search settings: ``beam_size`` (1 is greedy search), ``n_best`` (at most
            ``beam_size``), ``length_penalty`` (α) and ``length_normalization`` (how finished
            hypotheses are ranked, see :func:`length_penalty`), ``min_len``, ``allow_unk``.
        rules: what the target vocabulary may never generate (:class:`Restrictions`).
        steering: per sentence, a prefix, constraints and banned phrases
            (:class:`~nmt.core.beams.Steering`); a sentence with constraints chooses its beam by
            dynamic beam allocation (:mod:`nmt.core.constraints`).

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    finished: list[list[Hypothesis]] = [[] for _ in range(max_lens.size(0))]
    beams = Beams.start(state, max_lens.tolist(), decode.beam_size, max_lens.device, steering)
    restrict = None
    for step in itertools.count():
        lprobs, beams.state = scorer.step(beams.tokens, beams.state)  # (n*beam, vocab)
        restrict = restrict or Restrictions(decode, rules, lprobs.size(-1), lprobs.device)
        restrict(lprobs, beams, step)
        top = allocate(Candidates.best(beams.scores, lprobs), beams, lprobs)
        _finish(top, beams, finished, step, decode)
        beams.advance(top, scorer)
        # the first column, unless constraints shared the beam out
        best_running = beams.scores.max(1).values.tolist()
        going_on = [
            r
            for r, s in enumerate(beams.sentences)
            if step < beams.max_lens[r]
            and not _settled(finished[s], best_running[r], step, beams.max_lens[r], decode)
        ]
        beams.keep(going_on, scorer)
        if not beams:
            break
    # A hypothesis that misses a constraint (cut by the length limit) ranks below every one that
    # meets them all.
    return [sorted(h, key=lambda hyp: (hyp.unmet, -hyp.score))[: decode.n_best] for h in finished]


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
    # Scaled after subtracting each row's maximum (which stays 0), and what may not follow (-inf)
    # kept as it is: any temperature above 0 gives a distribution (1e-300, 0 in float32: the
    # maximum's pieces;
    # inf: uniform over what may follow), never NaN.
    shifted = lprobs - lprobs.max(-1, keepdim=True).values.clamp(min=torch.finfo(lprobs.dtype).min)
    scaled = torch.where(shifted == 0, 0.0, shifted / sampling.temperature)
    probs = torch.softmax(torch.where(torch.isneginf(lprobs), lprobs, scaled), dim=-1)
    if sampling.top_k <= 0 and sampling.top_p >= 1.0:
        return probs
    # ties: lower id first, as argmax
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    if sampling.top_k > 0:
        sorted_p[:, sampling.top_k :] = 0.0
    if sampling.top_p < 1.0:
        kept = sorted_p / sorted_p.sum(-1, keepdim=True)
        # A piece is in the nucleus if the pieces before it do not reach top_p yet (so the first
        # always is).
        sorted_p = sorted_p * ((kept.cumsum(-1) - kept) < sampling.top_p)
    probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


def sample(
    scorer: Scorer,
    state: Any,
    max_lens: Tensor,
    decode: DecodeConfig,
    sampling: Sampling,
    seeds: list[int],
    rules: OutputRules | None = None,
    steering: list[Steering] | None = None,
) -> list[list[Hypothesis]]:
    """``decode.n_best`` independent samples per sentence (ancestral sampling, see
    :class:`Sampling`).

    Each sentence's rows draw from their own distributions with uniform numbers from a
    generator seeded by ``seeds[sentence]``, so results are reproducible and independent of
    batching (up to floating-point rounding of the model's scores). Length limits and what
    may never be generated are those of :func:`beam_search` (:class:`Restrictions`).

    Args:
        scorer: see :class:`Scorer`; ``state`` must hold ``decode.n_best`` rows per sentence.
        max_lens: ``(batch,)`` most pieces per sample, EOS not counted.
        decode: ``n_best`` samples; ``length_penalty`` and ``length_normalization`` give the
            reported ``score`` (see :func:`length_penalty`); ``min_len``, ``allow_unk``.
        seeds: one per sentence.
        steering: per sentence, a prefix and banned phrases (:class:`~nmt.core.beams.Steering`).

    Returns:
        For each sentence, its samples, best ``score`` first; ``log_prob`` is the
        sample's log-probability under the model (temperature 1, no top-k/top-p).

    Raises:
        ValueError: constraints (sampling cannot promise them: a sample is drawn, not searched for).
    """
    if steering and any(s.constraints for s in steering):
        raise ValueError(
            "constraints need beam search: sampling draws each piece and cannot make a sample hold "
            "a phrase"
        )
    n = decode.n_best
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    beams = Beams.start(state, max_lens.tolist(), n, max_lens.device, steering)
    beams.scores.zero_()  # (batch, n): each sample's log-probability so far
    samples: list[list[Hypothesis]] = [[] for _ in seeds]
    done = torch.zeros_like(beams.scores, dtype=torch.bool)
    restrict = None
    # at its limit a sample ends (below), so this many steps end them all
    for step in range(int(max_lens.max()) + 1):
        lprobs, beams.state = scorer.step(beams.tokens, beams.state)  # (rows, vocab)
        restrict = restrict or Restrictions(decode, rules, lprobs.size(-1), lprobs.device)
        restrict(lprobs, beams, step)
        uniform = torch.cat([torch.rand(n, generator=generators[s]) for s in beams.sentences]).to(
            lprobs.device
        )
        cdf = sampling_probs(lprobs, sampling).cumsum(-1)
        token = (
            torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True)
            .squeeze(1)
            .clamp_(max=cdf.size(1) - 1)
        )
        token[~torch.isfinite(lprobs).any(1)] = (
            # nothing may follow (a shortlist and the restrictions leave no piece): the sample ends
            EOS
        )
        if (limit := beams.at_limit(step, n, token.device)) is not None:
            token[limit] = EOS  # even where the scores are NaN
        flat_done = done.view(-1)
        beams.scores += torch.where(
            flat_done, 0.0, lprobs.gather(1, token.unsqueeze(1)).squeeze(1)
        ).view_as(beams.scores)
        beams.tokens = torch.cat([beams.tokens, token.unsqueeze(1)], dim=1)
        ended = (token == EOS) & ~flat_done
        penalty = length_penalty(step + 1, decode.length_penalty, decode.length_normalization)
        for row in ended.nonzero().view(-1).tolist():
            log_prob = float(beams.scores.view(-1)[row])
            samples[beams.sentences[row // n]].append(
                Hypothesis(beams.tokens[row, 1:-1].tolist(), log_prob / penalty, log_prob)
            )
        done |= ended.view_as(done)
        keep = (~done.all(1)).nonzero().view(-1).tolist()
        done = done[keep]
        beams.keep(keep, scorer)
        if not beams:
            break
    return [sorted(s, key=lambda hyp: -hyp.score) for s in samples]


# target positions a decoder cache starts with; it doubles when a hypothesis needs more
INITIAL_CAPACITY = 64


def output_limits(
    src_lens: Tensor, decode: DecodeConfig, steering: list[Steering] | None = None
) -> Tensor:
    """Each sentence's output limit in pieces (EOS not counted), ``(batch,)`` from source lengths
    ``(batch,)`` (EOS and any tag included): ``max_len_a · src_len + max_len_b``, or with
    ``steering`` at least its prefix and constraints plus ``max_len_b``."""
    max_lens = (decode.max_len_a * src_lens.double() + decode.max_len_b).long()
    if steering:
        needed = torch.tensor(
            [len(s.prefix) + len(s.fragment) + sum(map(len, s.constraints)) for s in steering],
            device=max_lens.device,
        )
        max_lens = torch.maximum(max_lens, needed + decode.max_len_b)
    return max_lens


@torch.inference_mode()
def translate_batch(
    model,
    src: Tensor,
    decode: DecodeConfig,
    *,
    sampling: Sampling | None = None,
    seeds: list[int] | None = None,
    rules: OutputRules | None = None,
    steering: list[Steering] | None = None,
    scorer: str | type = "cached",
    columns: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Encode ``src`` ``(batch, src_len)`` once and beam-search each sentence.

    ``model`` is a :class:`~nmt.core.model.Transformer`, or a list of them that decode as an
    ensemble (:class:`EnsembleScorer`). ``decode`` holds every search setting (see
    :func:`beam_search`); the length limit is ``max_len_a · src_len + max_len_b`` pieces,
    ``src_len`` counting the sentence's non-pad source tokens (EOS included). ``scorer``
    picks the path: a name of :data:`SCORERS` (``"cached"``, the dynamic cache; ``"tiled"``,
    ``"recompute"``: references) or a scorer class (:func:`nmt.runtime.decode_scorer` gives the
    device's fastest). Runs under ``torch.inference_mode()``: a decoder cache refuses to record
    autograd (:data:`nmt.core.cache.RECORDING`). With ``sampling``, each sentence gets
    ``decode.n_best`` independent samples (:func:`sample`) instead, its draws seeded by ``seeds[i]``
    (default: :func:`sample_seed` of ``sampling.seed`` and ``i``). ``rules``: what the
    target vocabulary may never generate (:class:`Restrictions`); ``steering``: each
    sentence's prefix, constraints and banned phrases (:class:`~nmt.core.beams.Steering`), whose
    length limit then leaves room for at least the prefix and the constraints plus ``max_len_b``.
    ``columns``: sorted target ids ``(n,)`` the batch may generate, a vocabulary shortlist
    (:meth:`nmt.shortlist.Shortlist.columns`); None (the default, exact) for the whole vocabulary.
    """
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    scorer = SCORERS[scorer] if isinstance(scorer, str) else scorer
    src_lens = (src != PAD).sum(1)
    max_lens = output_limits(src_lens, decode, steering)
    # A scorer that holds the whole search on the device serves plain beam search with it.
    plain = sampling is None and len(models) == 1 and columns is None and not any(steering or ())
    if plain and hasattr(scorer, "searches") and scorer.searches(int(max_lens.max())):
        return scorer.beam_search(models[0], src, max_lens, decode, rules)
    rows = decode.n_best if sampling is not None else decode.beam_size
    # grown on demand: a generous limit allocates nothing
    capacity = min(int(max_lens.max()) + 1, INITIAL_CAPACITY)
    members, states = [], []
    for m in models:
        memory, src_mask = m.encode(src)
        member, state = scorer.start(m, memory, src_mask, rows, capacity=capacity, columns=columns)
        members.append(member)
        states.append(state)
    step_scorer, state = (
        (members[0], states[0]) if len(members) == 1 else (EnsembleScorer(members), tuple(states))
    )
    if sampling is not None:
        seeds = (
            seeds
            if seeds is not None
            else [sample_seed(sampling.seed, i) for i in range(src.size(0))]
        )
        return sample(step_scorer, state, max_lens, decode, sampling, seeds, rules, steering)
    return beam_search(step_scorer, state, max_lens, decode, rules, steering)
