"""Beam search (greedy search is beam size 1) and sampling: one loop over one state, the step the
only thing that varies.

:func:`search` is the loop. Each of its steps is named: the model's step scores every hypothesis
(``step.score``), :class:`~nmt.decode.restrictions.Restrictions` forbid what may not be written,
:meth:`~nmt.decode.beams.Beams.update` takes the candidates, sets aside those that end, continues
the best of the others and settles the sentences whose result can no longer change (the exact rule
of :mod:`nmt.decode.beams`), and the model's state follows the back-pointers (``step.follow``).
What varies is the step, declared here (:data:`STEPS`, chosen by :func:`step_kind`):

* ``dynamic`` (:class:`ScorerStep` over :class:`~nmt.decode.scorers.TransformerScorer`): the cache
  grows as hypotheses do, and settled sentences leave the batch after every step: what pays on a
  CPU, and what an ensemble or a vocabulary shortlist runs;
* ``static`` (:class:`~nmt.decode.static.StaticStep`): fixed shapes, settled sentences masked; on
  a GPU each step is one CUDA graph replay, the model's part and the search's;
* ``tiled`` and ``recompute``: references that prove the cache exact.

Steering (a prefix, constraints, bans; :class:`~nmt.decode.steering.Steer`) and sampling
(:class:`~nmt.decode.sampling.Sampler`) are hooks of the same loop that run only for a batch that
has them; they read the host, so a step with them is never captured whole.

Shapes: ``n`` sentences, ``k`` rows each (``beam_size`` hypotheses or ``n_best`` samples), rows of
``(n*k, ...)`` tensors ordered sentence-major (row ``s*k + j``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from nmt.config import DecodeConfig
from nmt.core.pieces import PAD, OutputRules

from .beams import Beams, Hypothesis, Ranking
from .candidates import Best
from .restrictions import Restrictions
from .sampling import Sampler, Sampling, sample_seed
from .scorers import EnsembleScorer, RecomputeScorer, Scorer, TiledScorer, TransformerScorer
from .static import STATIC_CAPACITY, GraphsFailed, StaticStep, graphs_work
from .steering import Steer, Steering

# target positions a dynamic cache starts with; it doubles when a hypothesis needs more
INITIAL_CAPACITY = 64

#: The steps a search may run: ``dynamic`` and ``static`` (what ``decode.cache`` chooses between),
#: and the references ``tiled`` and ``recompute``.
STEPS = {
    "dynamic": TransformerScorer,
    "static": StaticStep,
    "tiled": TiledScorer,
    "recompute": RecomputeScorer,
}


class ScorerStep:
    """A :class:`~nmt.decode.scorers.Scorer` as the search's step: it is given each hypothesis'
    whole prefix and follows the beams by its own methods; settled sentences leave the batch after
    every step (``compacts``)."""

    compacts = True
    name = "dynamic"

    def __init__(self, scorer: Scorer, state: Any):
        self.scorer, self.state = scorer, state

    def score(self, beams: Beams, step: int) -> Tensor:
        """Log-probabilities ``(rows, vocab)`` after each row's prefix."""
        lprobs, self.state = self.scorer.step(beams.tokens[:, : step + 1], self.state)
        return lprobs

    def follow(self, back: Tensor, step: int) -> None:
        """The state follows the back-pointers ``back`` ``(rows,)``."""
        self.state = self.scorer.reorder(self.state, back)

    def keep(self, sentences: Tensor) -> None:
        """Only sentences ``sentences`` ``(m,)`` go on."""
        self.state = self.scorer.keep_sentences(self.state, sentences)

    def run(self, step: int, fn: Callable, whole: bool, state: Callable):
        """``fn()``: a step by step search captures nothing."""
        return fn()


class LateFlag:
    """Whether any sentence is still searched, learnt one step late: after each step the flag is
    copied to the host (on a GPU to pinned memory, without waiting) and read after the next step is
    launched, so that the GPU always has a step queued. The loop stops one step late, which changes
    nothing (settled sentences are masked), on a CPU as on a GPU."""

    def __init__(self, device: torch.device):
        self.flags = torch.ones(2, dtype=torch.bool)
        self.events = None
        if device.type == "cuda":
            self.flags = self.flags.pin_memory()
            self.events = [torch.cuda.Event(), torch.cuda.Event()]

    def settled(self, active: Tensor, step: int) -> bool:
        """After step ``step``: whether every sentence had settled after the step before."""
        self.flags[step % 2].copy_(active.any(), non_blocking=self.events is not None)
        if self.events:
            self.events[step % 2].record()
        if not step:
            return False
        if self.events:
            self.events[(step - 1) % 2].synchronize()
        return not bool(self.flags[(step - 1) % 2])


def search(
    step,
    beams: Beams,
    n: int,
    restrict: Restrictions,
    steer: Steer | None = None,
    choose: Best | Sampler | None = None,
) -> list[list[Hypothesis]]:
    """The search, from its ``beams`` (already at BOS) to each of the first ``n`` slots' result.

    Args:
        step: what computes the model's part of a step: a :class:`ScorerStep` or a
            :class:`~nmt.decode.static.StaticStep`.
        restrict: the rules of what may be written (:class:`Restrictions`).
        steer: the hook of a batch with steered sentences (:meth:`Steer.of`), or None.
        choose: beam search's choice (:class:`Best`, the default) or a :class:`Sampler`.

    Returns:
        Each sentence's result, best first: its ``n_best`` hypotheses or samples (see
        :class:`~nmt.decode.beams.Ranking`).
    """
    choose = choose or Best()
    whole = steer is None and isinstance(choose, Best)  # nothing reads the host: capturable
    beam, device = beams.scores.size(1), beams.tokens.device
    sentences, results = list(range(n)), [[] for _ in range(n)]
    flag = None if step.compacts else LateFlag(device)
    longest = int(beams.max_lens.max())  # at its limit a sentence settles

    def advance(lprobs: Tensor, t: int) -> None:
        restrict(lprobs, beams, steer, t)
        back = beams.update(lprobs, choose, steer, t)
        if choose.reorders and beam > 1:
            step.follow(back, t)

    for t in range(longest + 1):
        if whole:
            step.run(t, lambda t=t: advance(step.score(beams, t), t), True, beams.tensors)
        else:
            advance(step.run(t, lambda t=t: step.score(beams, t), False, beams.tensors), t)
        if flag is not None:
            if flag.settled(beams.active, t):
                break
            continue
        active = beams.active.tolist()
        if all(active):
            continue
        gone = [i for i, a in enumerate(active) if not a]
        for i, hyps in zip(gone, beams.results(gone)):
            results[sentences[i]] = hyps
        live = [i for i, a in enumerate(active) if a]
        if not live:
            return results
        keep = torch.tensor(live, device=device)
        for part in (beams, step, choose, steer):
            if part is not None:
                part.keep(keep)
        sentences = [sentences[i] for i in live]
    for i, hyps in enumerate(beams.results(list(range(len(sentences))))):
        results[sentences[i]] = hyps
    return results


def _start(max_lens: Tensor, decode: DecodeConfig, rows: int, sampling: bool, rankings=()) -> Beams:
    """Fresh beams for a step by step search of these limits ``(n,)``."""
    longest = int(max_lens.max())
    ranking = Ranking.of(decode, rows, longest, sampling, rankings)
    beams = Beams.start(max_lens.size(0), rows, longest + 2, ranking, max_lens.device)
    beams.reset_(max_lens, 0.0 if sampling else float("-inf"))
    return beams


def beam_search(
    scorer: Scorer,
    state: Any,
    max_lens: Tensor,
    decode: DecodeConfig,
    rules: OutputRules | None = None,
    steering: list[Steering] | None = None,
    rankings: tuple[tuple[str, float], ...] = (),
) -> list[list[Hypothesis]]:
    """Beam search over a batch with ``scorer`` step by step (:func:`search`).

    Each step scores ``beam_size`` hypotheses per sentence over the whole vocabulary and
    keeps the ``2·beam`` best extensions. Those ending in EOS among the first ``beam`` are
    set aside as finished, and the best ``beam`` that do not end in EOS continue, so
    finished hypotheses never starve the beam. A sentence stops once no running hypothesis can
    still enter its n-best list, or at its length limit (then EOS is forced); see
    :mod:`nmt.decode.beams`.

    Args:
        scorer: see :class:`Scorer`; ``state`` must already hold ``beam_size`` rows per sentence.
        max_lens: ``(batch,)`` most pieces to generate per sentence, EOS not counted.
        decode: the search settings: ``beam_size`` (1 is greedy search), ``n_best`` (at most
            ``beam_size``), ``length_penalty`` (α) and ``length_normalization`` (how finished
            hypotheses are ranked, see :func:`~nmt.decode.beams.length_penalty`), ``patience``,
            ``min_len``, ``allow_unk``.
        rules: what the target vocabulary may never generate (:class:`Restrictions`).
        steering: per sentence, a prefix, constraints and banned phrases (:class:`Steering`).
        rankings: more ``(normalisation, α)`` pairs the result must be exact for; then every
            finished hypothesis is returned (what ``nmt tune-decode`` re-ranks).

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    beams = _start(max_lens, decode, decode.beam_size, False, rankings)
    restrict = Restrictions(decode, rules, max_lens.device)
    steer = Steer.of(steering, decode.beam_size, max_lens.device)
    return search(ScorerStep(scorer, state), beams, max_lens.size(0), restrict, steer)


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
    :class:`Sampling`), by the same loop as :func:`beam_search`.

    Args:
        scorer: see :class:`Scorer`; ``state`` must hold ``decode.n_best`` rows per sentence.
        max_lens: ``(batch,)`` most pieces per sample, EOS not counted.
        decode: ``n_best`` samples; ``length_penalty`` and ``length_normalization`` give the
            reported ``score``; ``min_len``, ``allow_unk``.
        seeds: one per sentence.
        steering: per sentence, a prefix and banned phrases (:class:`Steering`).

    Returns:
        For each sentence, its samples, best ``score`` first; ``log_prob`` is the sample's
        log-probability under the model (temperature 1, no top-k/top-p).

    Raises:
        ValueError: constraints (sampling cannot promise them: a sample is drawn, not searched for).
    """
    _refuse_constraints(steering)
    beams = _start(max_lens, decode, decode.n_best, True)
    restrict = Restrictions(decode, rules, max_lens.device)
    steer = Steer.of(steering, decode.n_best, max_lens.device)
    choose = Sampler(sampling, seeds, decode.n_best, max_lens.device)
    return search(ScorerStep(scorer, state), beams, max_lens.size(0), restrict, steer, choose)


def _refuse_constraints(steering: list[Steering] | None) -> None:
    if steering and any(s.constraints for s in steering):
        raise ValueError(
            "constraints need beam search: sampling draws each piece and cannot make a sample hold "
            "a phrase"
        )


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


def step_kind(
    cache: str, device: torch.device, models: int = 1, shortlist: bool = False, longest: int = 0
) -> str:
    """The step to run for ``cache`` (``decode.cache``, or a name of :data:`STEPS`): ``static``
    where it serves (one model, no shortlist, at most :data:`~nmt.decode.static.STATIC_CAPACITY` - 1
    pieces) and is asked for, or under ``auto`` on a GPU whose captures have not failed in this
    process; else ``dynamic``, faster on a CPU. The references are run as asked.

    Raises:
        ValueError: a name that is neither ``auto`` nor one of :data:`STEPS`.
    """
    if cache not in ("auto", *STEPS):
        raise ValueError(f"unknown step {cache!r}; use auto, {', '.join(STEPS)}")
    if cache in ("tiled", "recompute"):
        return cache
    serves = models == 1 and not shortlist and longest + 1 <= STATIC_CAPACITY
    if cache == "dynamic" or not serves:
        return "dynamic"
    return "static" if cache == "static" or (device.type == "cuda" and graphs_work()) else "dynamic"


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
    columns: Tensor | None = None,
    step: str | None = None,
    rankings: tuple[tuple[str, float], ...] = (),
    observe: Callable | None = None,
) -> list[list[Hypothesis]]:
    """Encode ``src`` ``(batch, src_len)`` once and search each sentence: the one way into the
    search.

    ``model`` is a :class:`~nmt.core.model.Transformer`, or a list of them that decode as an
    ensemble (:class:`EnsembleScorer`). ``decode`` holds every search setting (see
    :func:`beam_search`); the length limit is ``max_len_a · src_len + max_len_b`` pieces,
    ``src_len`` counting the sentence's non-pad source tokens (EOS included). ``step``: a name of
    :data:`STEPS` (``static`` only where it serves, see :func:`step_kind`), or None for what
    ``decode.cache`` chooses on this device; a static step whose CUDA graph capture fails is said
    once, and the batch and every later one run the dynamic step. Runs under
    ``torch.inference_mode()``: a decoder cache refuses to record autograd
    (:data:`nmt.core.cache.RECORDING`). With ``sampling``, each sentence gets
    ``decode.n_best`` independent samples (:func:`sample`) instead, its draws seeded by ``seeds[i]``
    (default: :func:`sample_seed` of ``sampling.seed`` and ``i``). ``rules``: what the
    target vocabulary may never generate (:class:`Restrictions`); ``steering``: each
    sentence's prefix, constraints and banned phrases (:class:`Steering`), whose
    length limit then leaves room for at least the prefix and the constraints plus ``max_len_b``.
    ``columns``: sorted target ids ``(n,)`` the batch may generate, a vocabulary shortlist
    (:meth:`nmt.translation.shortlist.Shortlist.columns`); None (the default, exact) for the whole
    vocabulary. ``rankings``: see :func:`beam_search`. ``observe``: wraps the step the search runs
    (``nmt profile``'s timing step).
    """
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not src.size(0):
        return []
    max_lens = output_limits((src != PAD).sum(1), decode, steering)
    longest, device = int(max_lens.max()), src.device
    rows = decode.n_best if sampling is not None else decode.beam_size
    if sampling is not None:
        _refuse_constraints(steering)
        seeds = seeds or [sample_seed(sampling.seed, i) for i in range(src.size(0))]
    kind = step_kind(step or decode.cache, device, len(models), columns is not None, longest)
    ranking = Ranking.of(decode, rows, longest, sampling is not None, rankings)
    wrap = observe or (lambda s: s)

    def hooks(slots: int):
        """Steering and the choice for ``slots`` sentence slots (the batch's, then empty ones),
        made anew for a batch decoded again: they hold the draws and the progress."""
        empty = slots - src.size(0)
        steer = Steer.of(steering and [*steering, *[Steering()] * empty], rows, device)
        if sampling is None:
            return steer, Best()
        return steer, Sampler(sampling, [*seeds, *[0] * empty], rows, device)

    first = 0.0 if sampling is not None else float("-inf")
    if kind == "static":
        static = StaticStep.start(models[0], src, rows, longest, reorders=sampling is None)
        slab = static.slab
        key = (ranking, rules, decode.min_len, decode.allow_unk)
        beams, restrict = slab.state(
            key,
            lambda: (
                Beams.start(slab.sentences, rows, slab.capacity + 1, ranking, device),
                Restrictions(decode, rules, device, static.vocab),
            ),
        )
        beams.reset_(max_lens, first)
        try:
            return search(wrap(static), beams, src.size(0), restrict, *hooks(slab.sentences))
        except GraphsFailed:
            kind = "dynamic"
    scorer = STEPS[kind]
    capacity = min(longest + 1, INITIAL_CAPACITY)
    members, states = [], []
    for m in models:
        memory, src_mask = m.encode(src)
        member, state = scorer.start(m, memory, src_mask, rows, capacity=capacity, columns=columns)
        members.append(member)
        states.append(state)
    if len(members) > 1:
        members, states = [EnsembleScorer(members)], [tuple(states)]
    beams = Beams.start(src.size(0), rows, longest + 2, ranking, device)
    beams.reset_(max_lens, first)
    restrict = Restrictions(decode, rules, device)
    dynamic = wrap(ScorerStep(members[0], states[0]))
    return search(dynamic, beams, src.size(0), restrict, *hooks(src.size(0)))
