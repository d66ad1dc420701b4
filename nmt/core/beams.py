"""What a search carries from step to step: the running hypotheses, the candidates of a step,
what each sentence's output must or must not hold (:class:`Steering`) and how far each
hypothesis has come in meeting its constraints (:class:`ConstraintProgress`).

Shapes: ``n`` active sentences, ``beam`` hypotheses each, rows of ``(n*beam, ...)`` tensors
ordered sentence-major (row ``s*beam + k``); ``C`` constraints and ``L`` pieces at most per
constraint in the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .pieces import BOS, EOS


@dataclass(frozen=True)
class Steering:
    """What one sentence's translation must or must not hold, as target piece ids.

    ``prefix``: the pieces allowed at each of the first steps (one piece: it is forced; several:
    any of them, as for a prefix that ends with a space, after which a word starts).
    ``fragment``: after the prefix, a word the output must begin with but may finish as the
    model spells it (a prefix that ends inside a word, see :func:`nmt.inference.steering`), as
    an automaton over pieces: state ``s`` (0 first) maps each piece allowed there to the next
    state, or to :data:`FRAGMENT_DONE` once the fragment is written (then anything may follow).
    ``constraints``: phrases that must each appear, in any order, exactly as these pieces
    (a hypothesis may end only once all have; Hu et al. 2019). ``bans``: phrases that must
    never appear as these pieces (beyond the prefix, which the user wrote).
    """

    prefix: tuple[tuple[int, ...], ...] = ()
    constraints: tuple[tuple[int, ...], ...] = ()
    bans: tuple[tuple[int, ...], ...] = ()
    fragment: tuple[tuple[tuple[int, int], ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.prefix or self.constraints or self.bans or self.fragment)

    def fragment_state(self, written: list[int]) -> int:
        """Where ``written`` (the pieces after the prefix) leaves the fragment's automaton: a state,
        or :data:`FRAGMENT_DONE` (written, or no fragment)."""
        state = 0 if self.fragment else FRAGMENT_DONE
        for piece in written:
            if state == FRAGMENT_DONE:
                break
            state = dict(self.fragment[state]).get(piece, FRAGMENT_DONE)
        return state


FRAGMENT_DONE = -1  # the state of a hypothesis that has written its fragment (see Steering)


@dataclass
class ConstraintProgress:
    """Per hypothesis, the constraints met so far and the one in progress (Post and Vilar 2018, §3).

    ``phrases``: ``(n, C, L)`` each sentence's constraints, padded with -1; ``lengths``: ``(n, C)``
    (0 where a sentence has fewer). ``met``: ``(rows, C)``; ``current``: ``(rows,)`` the constraint
    being spelt (-1: none) and ``position``: ``(rows,)`` how many of its pieces are spelt. A
    piece that does not continue the constraint in progress abandons it (its pieces no longer
    count); one that starts an unmet constraint starts it (the first unmet one, if several do).
    """

    phrases: Tensor
    lengths: Tensor
    met: Tensor
    current: Tensor
    position: Tensor
    beam: int

    @classmethod
    def start(
        cls, constraints: list[tuple[tuple[int, ...], ...]], beam: int, device: torch.device
    ) -> ConstraintProgress:
        """Nothing met yet, for sentences with ``constraints`` each (piece-id tuples)."""
        n, c = len(constraints), max(1, max(map(len, constraints)))
        longest = max([len(p) for cs in constraints for p in cs] or [1])
        phrases = torch.full((n, c, longest), -1, dtype=torch.long)
        lengths = torch.zeros(n, c, dtype=torch.long)
        for s, cs in enumerate(constraints):
            for j, phrase in enumerate(cs):
                phrases[s, j, : len(phrase)] = torch.tensor(phrase)
                lengths[s, j] = len(phrase)
        rows = n * beam
        return cls(
            phrases.to(device),
            lengths.to(device),
            torch.zeros(rows, c, dtype=torch.bool, device=device),
            torch.full((rows,), -1, dtype=torch.long, device=device),
            torch.zeros(rows, dtype=torch.long, device=device),
            beam,
        )

    def after(self, rows: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(met, current, position)`` of hypothesis rows ``rows`` ``(m,)`` extended by ``tokens``
        ``(m,)``."""
        sentence = torch.div(rows, self.beam, rounding_mode="floor")
        met, current, position = self.met[rows].clone(), self.current[rows], self.position[rows]
        phrases, lengths = self.phrases[sentence], self.lengths[sentence]  # (m, C, L), (m, C)
        spelling = current >= 0
        # (m, L)
        expected = phrases.gather(
            1, current.clamp(min=0).view(-1, 1, 1).expand(-1, 1, phrases.size(2))
        ).squeeze(1)
        goes_on = spelling & (expected.gather(1, position.view(-1, 1)).squeeze(1) == tokens)
        position = torch.where(goes_on, position + 1, 0)
        current = torch.where(goes_on, current, -1)
        starts = (phrases[:, :, 0] == tokens.unsqueeze(1)) & ~met  # (m, C)
        first = starts.float().argmax(1)
        start = ~goes_on & starts.any(1)
        current = torch.where(start, first, current)
        position = torch.where(start, 1, position)
        length = lengths.gather(1, current.clamp(min=0).unsqueeze(1)).squeeze(1)
        done = (current >= 0) & (position >= length)
        met[done, current[done]] = True
        return met, torch.where(done, -1, current), torch.where(done, 0, position)

    def spelt(self, met: Tensor, position: Tensor, rows: Tensor) -> Tensor:
        """Constraint pieces spelt (met constraints' pieces plus the one in progress), ``(m,)``."""
        lengths = self.lengths[torch.div(rows, self.beam, rounding_mode="floor")]
        return (met * lengths).sum(1) + position

    def total(self) -> Tensor:
        """Each sentence's constraint pieces, ``(n,)``."""
        return self.lengths.sum(1)

    def unmet(self, rows: Tensor) -> Tensor:
        """Constraints not met by hypothesis rows ``rows``, ``(m,)``."""
        lengths = self.lengths[torch.div(rows, self.beam, rounding_mode="floor")]
        return ((lengths > 0) & ~self.met[rows]).sum(1)

    def advance(self, back: Tensor, tokens: Tensor) -> None:
        """Follow the back-pointers ``back`` ``(rows,)`` and extend each row by ``tokens``
        ``(rows,)``."""
        self.met, self.current, self.position = self.after(back, tokens)

    def keep(self, sentences: Tensor) -> None:
        """Keep sentences ``sentences`` ``(new_n,)``, all their rows."""
        rows = (
            sentences.unsqueeze(1) * self.beam + torch.arange(self.beam, device=sentences.device)
        ).view(-1)
        self.phrases, self.lengths = (
            self.phrases.index_select(0, sentences),
            self.lengths.index_select(0, sentences),
        )
        self.met, self.current, self.position = (
            self.met.index_select(0, rows),
            self.current.index_select(0, rows),
            self.position.index_select(0, rows),
        )


@dataclass
class Beams:
    """The running hypotheses of the sentences still searched: what is re-indexed together.

    ``tokens``: ``(n*beam, t)`` prefixes, BOS first; ``scores``: ``(n, beam)`` their
    log-probabilities (nats); ``sentences``: each active sentence's index in the batch;
    ``max_lens``: its length limit (pieces, EOS not counted); ``state``: the scorer's;
    ``steering``: each active sentence's :class:`Steering` (empty when none has any), and
    ``progress`` towards their constraints (None when none has a constraint).
    """

    tokens: Tensor
    scores: Tensor
    sentences: list[int]
    max_lens: list[int]
    state: Any
    steering: list[Steering] = field(default_factory=list)
    progress: ConstraintProgress | None = None

    @classmethod
    def start(
        cls,
        state: Any,
        max_lens: list[int],
        beam: int,
        device: torch.device,
        steering: list[Steering] | None = None,
    ) -> Beams:
        """Every sentence's ``beam`` rows start as BOS; only the first counts, as all are
        identical."""
        scores = torch.zeros(len(max_lens), beam, device=device)
        scores[:, 1:] = float("-inf")
        steering = list(steering) if steering and any(steering) else []
        progress = (
            ConstraintProgress.start([s.constraints for s in steering], beam, device)
            if any(s.constraints for s in steering)
            else None
        )
        tokens = torch.full((len(max_lens) * beam, 1), BOS, dtype=torch.long, device=device)
        return cls(
            tokens, scores, list(range(len(max_lens))), list(max_lens), state, steering, progress
        )

    def __len__(self) -> int:
        return len(self.sentences)

    def at_limit(self, step: int, rows_per_sentence: int, device) -> Tensor | None:
        """Per row ``(len(self) · rows_per_sentence,)``: whether its sentence has reached the length
        limit at ``step``; None when no sentence has (no tensor is made)."""
        reached = [step >= m for m in self.max_lens]
        return (
            torch.tensor(reached, device=device).repeat_interleave(rows_per_sentence)
            if any(reached)
            else None
        )

    def advance(self, top: Candidates, scorer) -> None:
        """The ``beam`` best candidates that do not end continue; the scorer's state (and the
        constraint progress) follows their back-pointers."""
        beam = self.scores.size(1)
        self.scores, back, new = top.continuing(beam)
        self.tokens = torch.cat([self.tokens.index_select(0, back), new.unsqueeze(1)], dim=1)
        if self.progress is not None:
            self.progress.advance(back, new)
        if beam > 1:
            self.state = scorer.reorder(self.state, back)

    def keep(self, keep: list[int], scorer) -> None:
        """Only the active sentences at positions ``keep`` go on."""
        if len(keep) == len(self.sentences) or not keep:
            self.sentences = [self.sentences[r] for r in keep]
            return
        n, beam = self.scores.shape
        rows = torch.tensor(keep, device=self.scores.device)
        self.sentences, self.max_lens = (
            [self.sentences[r] for r in keep],
            [self.max_lens[r] for r in keep],
        )
        self.steering = [self.steering[r] for r in keep] if self.steering else []
        self.scores = self.scores.index_select(0, rows)
        self.tokens = self.tokens.view(n, beam, -1).index_select(0, rows).view(len(keep) * beam, -1)
        if self.progress is not None:
            self.progress.keep(rows)
        self.state = scorer.keep_sentences(self.state, rows)


@dataclass(frozen=True)
class Candidates:
    """The ``2·beam`` best extensions of each sentence's hypotheses, each ``(n, 2*beam)``:
    ``scores`` (log-probabilities), ``beam`` (which hypothesis), ``token``, ``is_eos`` (ends,
    finitely)."""

    scores: Tensor
    beam: Tensor
    token: Tensor
    is_eos: Tensor

    @classmethod
    def best(cls, scores: Tensor, lprobs: Tensor) -> Candidates:
        """Of every hypothesis (``scores`` ``(n, beam)``) extended by every token (``lprobs``
        ``(n*beam, vocab)``).

        Each hypothesis' ``2·beam`` best tokens first (:func:`row_top`), then the best of those:
        the sentence's ``2·beam`` best extensions are among them, since a hypothesis' own score
        is one number added to its whole row. This never forms the ``(n, beam·vocab)`` sums.
        """
        n, beam = scores.shape
        each = min(2 * beam, lprobs.size(-1))
        values, tokens = row_top(lprobs, each)  # (n*beam, each)
        top_scores, index = (scores.view(-1, 1) + values).view(n, beam * each).topk(2 * beam, dim=1)
        token = tokens.view(n, beam * each).gather(1, index)
        return cls(
            top_scores,
            torch.div(index, each, rounding_mode="floor"),
            token,
            (token == EOS) & torch.isfinite(top_scores),
        )

    def continuing(self, beam: int) -> tuple[Tensor, Tensor, Tensor]:
        """The ``beam`` best candidates of each sentence that do not end (those that end rank
        last): their scores ``(n, beam)``, flat back-pointers ``(n*beam,)`` to the rows they extend
        and their tokens ``(n*beam,)``."""
        n, width = self.scores.shape
        rank = self.is_eos.long() * width + torch.arange(width, device=self.scores.device)
        chosen = rank.topk(beam, dim=1, largest=False).indices  # (n, beam)
        back = torch.arange(n, device=chosen.device).unsqueeze(1) * beam + self.beam.gather(
            1, chosen
        )
        return self.scores.gather(1, chosen), back.view(-1), self.token.gather(1, chosen).view(-1)


def row_top(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of each row of ``values`` ``(rows, width)`` and their columns,
    each ``(rows, k)``, largest first: ``values.topk(k, dim=1)``'s values (its columns too, but
    where entries tie). Needs ``k <= width``.

    By blocks of about ``sqrt(width)`` columns: the ``k`` largest lie in the ``k`` blocks with
    the largest maxima, so one pass takes every block's maximum and a top-k then reads only
    those blocks (``k`` blocks of 89 columns of 8,000, against all 8,000). Columns past
    ``width`` in the last block count as -inf (at column ``width - 1``). On a CPU this is about half
    the time of ``topk`` over the row (``docs/performance.md``); on a GPU, ``topk`` itself is used.
    """
    # a GPU's top-k is one kernel; the blocks below save a CPU's time, not a GPU's
    if values.is_cuda:
        return values.topk(k, dim=1)
    rows, width = values.shape
    size = max(16, math.isqrt(width))
    whole = width // size
    maxima = values[:, : whole * size].unflatten(1, (whole, size)).amax(-1)  # (rows, whole)
    if whole * size < width:
        maxima = torch.cat([maxima, values[:, whole * size :].amax(-1, keepdim=True)], dim=1)
    blocks = maxima.topk(min(k, maxima.size(1)), dim=1).indices  # (rows, blocks)
    # (rows, blocks*size)
    columns = (blocks.unsqueeze(2) * size + torch.arange(size, device=values.device)).flatten(1)
    outside = columns >= width
    # columns stay valid ids
    candidates = values.gather(1, columns.clamp_(max=width - 1)).masked_fill_(
        outside, float("-inf")
    )
    top, index = candidates.topk(k, dim=1)
    return top, columns.gather(1, index)
