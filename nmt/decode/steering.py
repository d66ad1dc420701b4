"""Steering a search: a prefix the output starts with, phrases it must hold (constraints) and
phrases it must not (bans), per sentence (:class:`Steering`), applied by one hook, :class:`Steer`,
that the search calls only when some sentence of the batch is steered; an unsteered sentence in
the same batch is searched bit for bit as alone.

**Constraints** by dynamic beam allocation (Post and Vilar 2018; vectorised as Hu et al. 2019). A
sentence with constraints chooses its next beam differently from an unconstrained one. Its
candidates are the ``2·beam`` best extensions (as usual), each hypothesis's best extension, and
every extension that spells a constraint further; an end (EOS) is a candidate only as one of the
first two, never merely because a hypothesis could end. Each candidate falls into the bank of how
many constraint pieces it has spelt; the beam is shared out among the banks, one slot per bank in
turn from the fullest bank down (a bank with too few candidates leaves its slots to the others),
and within a bank by score. So hypotheses on their way to meeting the constraints stay in the beam
although the model scores them lower, instead of being pruned by hypotheses that ignore them. A
hypothesis ends only once every constraint is met (EOS is forbidden before), unless its length
limit forces the end; ending candidates are set aside as finished when they rank within the
``beam`` best of the complete bank, and a forced end that misses a constraint ranks after every
hypothesis that has met them all.

Shapes: ``n`` sentences, ``beam`` hypotheses each, rows of ``(n*beam, ...)`` tensors ordered
sentence-major; ``C`` constraints and ``L`` pieces at most per constraint in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.core.cache import beam_rows
from nmt.core.pieces import EOS, PAD

from .beams import Candidates


@dataclass(frozen=True)
class Steering:
    """What one sentence's translation must or must not hold, as target piece ids.

    ``prefix``: the pieces allowed at each of the first steps (one piece: it is forced; several:
    any of them, as for a prefix that ends with a space, after which a word starts).
    ``fragment``: after the prefix, a word the output must begin with but may finish as the
    model spells it (a prefix that ends inside a word, see
    :func:`nmt.translation.steering_text.steering`), as an automaton over pieces: state ``s`` (0
    first) maps each piece allowed there to the next state, or to :data:`FRAGMENT_DONE` once the
    fragment is written (then anything may follow). ``constraints``: phrases that must each appear,
    in any order, exactly as these pieces (a hypothesis may end only once all have; Hu et al. 2019).
    ``bans``: phrases that must never appear as these pieces (beyond the prefix, which the user
    wrote).
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

    def forced_steps(self) -> int:
        """How many first steps the prefix and the fragment may force (a fragment's piece moves its
        automaton on, so it takes at most one step a state)."""
        return len(self.prefix) + len(self.fragment)


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

    def unmet(self, rows: Tensor) -> Tensor:
        """Constraints not met by hypothesis rows ``rows`` ``(m,)``, ``(m,)``."""
        lengths = self.lengths[torch.div(rows, self.beam, rounding_mode="floor")]
        return ((lengths > 0) & ~self.met[rows]).sum(1)

    def keep(self, sentences: Tensor) -> None:
        """Keep sentences ``sentences`` ``(new_n,)``, all their rows."""
        rows = beam_rows(sentences, self.beam)
        self.phrases = self.phrases.index_select(0, sentences)
        self.lengths = self.lengths.index_select(0, sentences)
        self.met, self.current, self.position = (
            t.index_select(0, rows) for t in (self.met, self.current, self.position)
        )


class Steer:
    """The search's hook for a batch in which some sentence is steered: the rules its
    :class:`Steering` adds to :class:`~nmt.decode.restrictions.Restrictions`, the dynamic beam
    allocation of its constraints, and their progress, which follows the beams. It reads the
    host, so a steered search is run step by step, never captured.

    ``steering``: each active sentence's, in the batch's order; ``progress``: None when no sentence
    has a constraint."""

    def __init__(self, steering: list[Steering], beam: int, device: torch.device):
        self.steering, self.beam = list(steering), beam
        constraints = [s.constraints for s in self.steering]
        self.progress = (
            ConstraintProgress.start(constraints, beam, device) if any(constraints) else None
        )

    @classmethod
    def of(cls, steering, beam: int, device: torch.device) -> Steer | None:
        """The hook for these sentences' ``steering``, or None when none is steered."""
        return cls(steering, beam, device) if steering and any(steering) else None

    def unrestricted(self, lprobs: Tensor, step: int) -> dict[int, Tensor]:
        """The rows, before any rule, of the sentences whose prefix or fragment may force this
        ``step``'s piece (the model's own scores of the pieces the user wrote)."""
        k = self.beam
        return {
            i: lprobs[i * k : (i + 1) * k].clone()
            for i, s in enumerate(self.steering)
            if step < s.forced_steps()
        }

    def restrict(self, lprobs: Tensor, prefixes: Tensor, step: int, written: dict) -> None:
        """Prefixes, fragments, banned phrases and unmet constraints on ``lprobs`` ``(rows,
        vocab)`` of the hypotheses ``prefixes`` ``(rows, step + 1)`` (BOS first); ``written``: from
        :meth:`unrestricted`."""
        k, device = self.beam, lprobs.device
        for i, steering in enumerate(self.steering):
            rows = slice(i * k, (i + 1) * k)
            if i in written and step < len(steering.prefix):
                allowed = torch.tensor(steering.prefix[step], device=device)
                lprobs[rows] = float("-inf")
                lprobs[rows, allowed] = written[i][:, allowed]
                continue
            if i in written:
                self._follow_fragment(lprobs, prefixes, i, steering, written[i])
            for phrase in steering.bans:
                if len(phrase) == 1:
                    lprobs[rows, phrase[0]] = float("-inf")
                elif prefixes.size(1) > len(phrase) - 1:  # the prefixes hold BOS too
                    tail = torch.tensor(phrase[:-1], device=device)
                    ends_with = (prefixes[rows, 1 - len(phrase) :] == tail).all(1)
                    lprobs[rows][ends_with, phrase[-1]] = float("-inf")
        if self.progress is not None:
            lprobs[self.unmet(torch.arange(lprobs.size(0), device=device)) > 0, EOS] = float("-inf")

    def _follow_fragment(
        self, lprobs: Tensor, prefixes: Tensor, i: int, steering: Steering, written: Tensor
    ) -> None:
        """Sentence ``i``, whose prefix is written: each row still spelling the fragment may only
        take the pieces its state allows, at the model's own scores (as a prefix's)."""
        first = i * self.beam
        after = prefixes[first : first + self.beam, 1 + len(steering.prefix) :].tolist()
        for row, pieces in enumerate(after):
            state = steering.fragment_state(pieces)
            if state != FRAGMENT_DONE:
                allowed = torch.tensor(
                    [piece for piece, _ in steering.fragment[state]], device=lprobs.device
                )
                lprobs[first + row] = float("-inf")
                lprobs[first + row, allowed] = written[row, allowed]

    def allocate(self, top: Candidates, scores: Tensor, lprobs: Tensor) -> Candidates:
        """``top`` (the ordinary candidates, ``(n, 2*beam)`` each) with the rows of the sentences
        that have constraints chosen by dynamic beam allocation; ``scores`` ``(n, beam)`` the
        running hypotheses' log-probabilities, ``lprobs`` ``(n*beam, vocab)`` this step's restricted
        log-probabilities."""
        progress = self.progress
        if progress is None:
            return top
        constrained = (progress.lengths.sum(1) > 0).nonzero().squeeze(1).tolist()
        top = Candidates(*(t.clone() for t in (top.scores, top.parent, top.token, top.is_eos)))
        for s in constrained:
            row = self._sentence_candidates(s, scores, lprobs)
            width = row[0].numel()
            top.scores[s], top.parent[s], top.token[s], top.is_eos[s] = float("-inf"), 0, PAD, False
            for t, value in zip((top.scores, top.parent, top.token, top.is_eos), row):
                t[s, :width] = value
        return top

    def _sentence_candidates(
        self, s: int, scores: Tensor, lprobs: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Sentence ``s``'s candidates in the order the search reads them: those that end
        (finished), then the ``beam`` that go on; as (scores, hypothesis within the sentence, token,
        ends)."""
        progress, beam, vocab, device = self.progress, self.beam, lprobs.size(1), lprobs.device
        rows = torch.arange(s * beam, (s + 1) * beam, device=device)
        extended = scores[s].unsqueeze(1) + lprobs[rows]  # (beam, vocab)
        flat = extended.view(-1)
        pool = [
            flat.topk(min(2 * beam, flat.numel())).indices,
            extended.argmax(1) + torch.arange(beam, device=device) * vocab,
        ]
        phrases, current, position, met = (
            progress.phrases[s],
            progress.current[rows],
            progress.position[rows],
            progress.met[rows],
        )
        # (beam,)
        goes_on = torch.where(
            current >= 0,
            phrases[current.clamp(min=0), position.clamp(max=phrases.size(1) - 1)],
            -1,
        )
        starts = torch.where(met, -1, phrases[:, 0].unsqueeze(0))  # (beam, C)
        # (beam, C + 1) pieces that spell a constraint further
        spelling = torch.cat([goes_on.unsqueeze(1), starts], 1)
        pool.append(
            (spelling + torch.arange(beam, device=device).unsqueeze(1) * vocab)[spelling >= 0]
        )
        # An end is a candidate only as any other piece is (among the 2k best, or its hypothesis's
        # best): offering every hypothesis's EOS let improbable ends of the few complete hypotheses
        # fill the finished list within steps.
        index = torch.unique(torch.cat(pool))
        index = index[torch.isfinite(flat[index])]
        candidate_scores, hyp, tok = (
            flat[index],
            torch.div(index, vocab, rounding_mode="floor"),
            index % vocab,
        )
        new_met, _, new_position = progress.after(rows[hyp], tok)
        spelt = progress.spelt(new_met, new_position, rows[hyp]).tolist()
        total, ends = int(progress.lengths[s].sum()), (tok == EOS).tolist()
        order = sorted(range(len(index)), key=lambda i: -float(candidate_scores[i]))
        # The complete bank's best; an end that misses a constraint (only the length limit allows
        # one) ranks after them all.
        complete = (
            [i for i in order if spelt[i] >= total]
            + [i for i in order if ends[i] and spelt[i] < total]
        )[:beam]
        finished = [i for i in complete if ends[i]]
        banks: dict[int, list[int]] = {}
        for i in order:
            if not ends[i]:
                banks.setdefault(spelt[i], []).append(i)
        going_on = _round_robin([banks[b] for b in sorted(banks, reverse=True)], beam)
        chosen = torch.tensor(finished + going_on, dtype=torch.long, device=device)
        return candidate_scores[chosen], hyp[chosen], tok[chosen], tok[chosen] == EOS

    def unmet(self, rows: Tensor) -> Tensor:
        """Constraints hypothesis rows ``rows`` ``(m,)`` lack, ``(m,)`` (zeros without
        constraints)."""
        if self.progress is None:
            return torch.zeros_like(rows)
        return self.progress.unmet(rows)

    def advance(self, back: Tensor, tokens: Tensor) -> None:
        """Follow the back-pointers ``back`` ``(rows,)`` and extend each row by ``tokens``
        ``(rows,)``."""
        if self.progress is not None:
            progress = self.progress
            progress.met, progress.current, progress.position = progress.after(back, tokens)

    def keep(self, sentences: Tensor) -> None:
        """Only sentences ``sentences`` ``(new_n,)`` go on."""
        self.steering = [self.steering[i] for i in sentences.tolist()]
        if self.progress is not None:
            self.progress.keep(sentences)


def _round_robin(banks: list[list[int]], size: int) -> list[int]:
    """``size`` items taken one per bank in turn (banks in the order given, each in its own
    order)."""
    out, depth = [], 0
    while len(out) < size and any(depth < len(bank) for bank in banks):
        out += [bank[depth] for bank in banks if depth < len(bank)][: size - len(out)]
        depth += 1
    return out
