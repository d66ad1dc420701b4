"""What the search scores hypotheses with step by step: the :class:`Scorer` protocol and its
implementations, each run by :class:`~nmt.decode.search.ScorerStep`.

:class:`TransformerScorer` is the dynamic cache (the cached decoder, the source side shared by
each sentence's beams, settled sentences dropped): what a CPU runs; :class:`TiledScorer` and
:class:`RecomputeScorer` are references kept to prove it exact and to measure what it saves;
:class:`EnsembleScorer` averages several models' probabilities. Tests drive the search with
scripted scorers too. A GPU runs the step of fixed shapes instead (:mod:`nmt.decode.static`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import Tensor

from nmt.core.cache import beam_rows


class Scorer(Protocol):
    """What the search needs of a model: next-token log-probabilities, and a state that follows the
    beams."""

    def step(self, prefix: Tensor, state: Any) -> tuple[Tensor, Any]:
        """Log-probabilities ``(batch*beam, vocab)`` of the token after ``prefix`` ``(batch*beam,
        t)`` (which starts with BOS), and the state extended by that prefix's last token."""

    def reorder(self, state: Any, index: Tensor) -> Any:
        """Keep hypothesis rows ``index`` ``(batch*beam,)``."""

    def keep_sentences(self, state: Any, keep: Tensor) -> Any:
        """Keep sentences ``keep`` ``(new_batch,)`` with all their beams."""


class TransformerScorer:
    """The dynamic cache: :meth:`nmt.core.model.Transformer.decode_step` over a
    :class:`~nmt.core.cache.DecoderCache` whose source side is shared by each sentence's beams."""

    def __init__(self, model):
        self.model = model

    @classmethod
    def start(
        cls,
        model,
        memory: Tensor,
        src_mask: Tensor,
        beam: int,
        capacity: int = 32,
        columns: Tensor | None = None,
    ):
        """The scorer and its first state; ``capacity``: target positions to allocate for at first;
        ``columns``: the target ids the batch may generate (a shortlist), None for all."""
        return cls(model), model.start_decoding(memory, src_mask, beam, capacity, columns)

    def step(self, prefix, cache):
        """See :meth:`Scorer.step`; the cache is extended in place."""
        return self.model.decode_step(prefix[:, -1], cache)

    def reorder(self, cache, index):
        """See :meth:`Scorer.reorder`."""
        cache.reorder_(index)
        return cache

    def keep_sentences(self, cache, keep):
        """See :meth:`Scorer.keep_sentences`."""
        cache.keep_sentences_(keep)
        return cache


class TiledScorer(TransformerScorer):
    """Reference: the source side copied ``beam`` times, one copy per hypothesis (what most
    toolkits do). Kept to prove, and to measure, what sharing it saves."""

    @classmethod
    def start(cls, model, memory, src_mask, beam, capacity=32, columns=None):
        """See :meth:`TransformerScorer.start`."""
        scorer = cls(model)
        scorer.beam = beam
        return scorer, model.start_decoding(
            memory.repeat_interleave(beam, 0),
            src_mask.repeat_interleave(beam, 0),
            1,
            capacity,
            columns,
        )

    def keep_sentences(self, cache, keep):
        """See :meth:`Scorer.keep_sentences`: every sentence's ``beam`` rows."""
        return super().keep_sentences(cache, beam_rows(keep, self.beam))


class RecomputeScorer:
    """Reference: no cache; the whole decoder reruns over the full prefix at every step
    (against a tiled source). Kept to prove the cache exact and to measure what it saves."""

    def __init__(self, model, beam: int, columns: Tensor | None = None):
        self.model, self.beam = model, beam
        self.columns = None if columns is None else model.output_columns(columns)

    @classmethod
    def start(cls, model, memory, src_mask, beam, capacity=0, columns=None):
        """The scorer and its state: the source side tiled ``beam`` times."""
        return cls(model, beam, columns), (
            memory.repeat_interleave(beam, 0),
            src_mask.repeat_interleave(beam, 0),
        )

    def step(self, prefix, state):
        """See :meth:`Scorer.step`."""
        h = self.model.decode_states(prefix, *state)[:, -1]
        return (
            self.model.log_probs(h) if self.columns is None else self.columns.log_probs(h)
        ), state

    def reorder(self, state, index):
        """See :meth:`Scorer.reorder`."""
        return state[0].index_select(0, index), state[1].index_select(0, index)

    def keep_sentences(self, state, keep):
        """See :meth:`Scorer.keep_sentences`."""
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
        """See :meth:`Scorer.step`."""
        outputs = [member.step(prefix, state) for member, state in zip(self.members, states)]
        lprobs = torch.stack([lp for lp, _ in outputs])  # (n_models, batch*beam, vocab)
        return torch.logsumexp(lprobs, dim=0) - math.log(len(outputs)), tuple(
            state for _, state in outputs
        )

    def reorder(self, states, index):
        """See :meth:`Scorer.reorder`."""
        return tuple(member.reorder(state, index) for member, state in zip(self.members, states))

    def keep_sentences(self, states, keep):
        """See :meth:`Scorer.keep_sentences`."""
        return tuple(
            member.keep_sentences(state, keep) for member, state in zip(self.members, states)
        )
