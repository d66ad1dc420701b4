"""The one state of a search, in tensors of fixed shapes: the running hypotheses, the finished
ones, and the rule that settles a sentence.

:meth:`Beams.update` is one step of the search after the model's: take each sentence's best
:class:`Candidates`, set aside those that end, continue the best that do not, and settle the
sentences whose result can no longer change. It reads nothing on the host and no shape depends on
a value, so a GPU can capture it with the model's step as one CUDA graph; on a CPU the loop drops
settled sentences from the batch (:meth:`Beams.keep`) instead of masking them.

**The stopping rule** (:meth:`Beams._settle`). A sentence's result is its ``n_best`` best finished
hypotheses under ``log P(Y|X) / lp(|Y|)``. A running hypothesis' log-probability can only fall, so
its finished score is at most its log-probability now divided by the largest ``lp(L)`` over the
lengths ``L`` it may still reach: every normalisation is monotone in ``L``, so that largest is at
one of the ends of ``[step + 2, max_len + 1]`` (EOS counted). A sentence ends once its ``n_best``-th
best finished hypothesis scores at least that bound for its best running one, or at its length
limit: the result is then exactly what searching on to the limit gives (the tests check it against
exhaustive search and against a search that never stops early). ``decode.patience`` offers the
cheaper rule of CTranslate2 and fairseq as an explicit choice: a sentence also ends once
``round(beam_size · patience)`` hypotheses have finished (1: fairseq's, Hugging Face's
``early_stopping=True``). Greedy search (beam 1) ends at its first EOS.

Shapes: ``n`` sentence slots, ``beam`` hypotheses each, ``rows = n*beam`` sentence-major (row
``s*beam + k``), ``width`` token columns (BOS and at most ``width - 1`` pieces), ``K`` finished
slots per sentence.
"""

# Size: module at most 410 lines: the state, its step and its stopping rule are one record, which
# Ranking says what to keep for.

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.config import DecodeConfig
from nmt.core.pieces import BOS

from .candidates import Candidates


@dataclass(frozen=True)
class Hypothesis:
    """A finished translation: ``tokens`` without BOS/EOS, ``log_prob`` = log P(Y|X) summed
    over the tokens and EOS (nats), ``score`` = ``log_prob / lp(|Y|)``; ``alignment``:
    ``(source piece, target piece)`` index pairs when asked for (:mod:`nmt.translation.align`);
    ``unmet``: how many of its sentence's constraints it lacks (see :mod:`nmt.decode.steering`);
    ``copied``: the source text each of its UNK pieces stands for, in order, when asked for
    (:func:`nmt.translation.align.copy_unknown`)."""

    tokens: list[int]
    score: float
    log_prob: float
    alignment: tuple[tuple[int, int], ...] | None = None
    # constraints the hypothesis does not hold: only when its length limit forced the end
    unmet: int = 0
    copied: tuple[str, ...] = ()


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
# is monotone in |Y| for a fixed alpha: the stopping rule relies on that.
LENGTH_NORMALIZATIONS = {"gnmt": _gnmt, "length": _length, "none": _none}


def length_penalty(length: int, alpha: float, normalization: str) -> float:
    """The divisor ``lp(|Y|)`` that ranks a finished hypothesis by ``log P(Y|X) / lp(|Y|)``.

    ``length`` counts the hypothesis' pieces and its EOS (fairseq and Hugging Face count
    EOS too; CTranslate2 does not). ``normalization`` is a key of
    :data:`LENGTH_NORMALIZATIONS`; every one is 1 when ``alpha`` is 0.
    """
    return LENGTH_NORMALIZATIONS[normalization](length, alpha)


@dataclass(frozen=True)
class Ranking:
    """What a sentence's result is and when it is settled, from the settings and the search's
    kind.

    ``n_best``: hypotheses in the result; ``slots``: finished hypotheses kept per sentence (the
    ``n_best`` best; with several ``rankings``, each one's ``n_best`` best, or with a patience every
    one that ended in time); ``patience``: finished hypotheses after which a sentence also ends
    (``decode.patience``; None: only the exact rule); ``rankings``: the ``(normalisation, α)``
    pairs the result must be exact for, the first ranking it.
    """

    n_best: int
    slots: int
    patience: int | None
    rankings: tuple[tuple[str, float], ...]

    @property
    def union(self) -> bool:
        """Whether the finished kept are the union of each ranking's ``n_best`` best."""
        return len(self.rankings) > 1 and self.patience is None

    @classmethod
    def of(
        cls,
        decode: DecodeConfig,
        rows: int,
        longest: int,
        sampling: bool = False,
        rankings: tuple[tuple[str, float], ...] = (),
    ) -> Ranking:
        """For ``rows`` hypotheses a sentence and outputs of at most ``longest`` pieces: beam search
        returns at most ``beam_size`` hypotheses, sampling every sample; extra ``rankings`` (tune-
        decode's) keep every finished hypothesis (with ``patience``, the first that many: which
        end first does not depend on the ranking), and the search runs until the result is
        settled under each of them too. Greedy search (one row) ends at its first EOS, as every
        toolkit's does: the path of the most probable pieces, not a beam of one searched on."""
        own = ((decode.length_normalization, decode.length_penalty),)
        rankings = own + tuple(r for r in rankings if r not in own)
        for name, alpha in rankings:
            if name not in LENGTH_NORMALIZATIONS or not math.isfinite(alpha) or abs(alpha) > 10:
                raise ValueError(
                    f"ranking ({name!r}, {alpha}): the normalisation must be one of "
                    f"{', '.join(LENGTH_NORMALIZATIONS)} and α a number in [-10, 10]"
                )
        n_best = rows if sampling else min(decode.n_best, rows)
        patience = None
        if rows == 1 and not sampling:  # greedy search: the first end is its result
            patience = 1
        elif not sampling:
            patience = decode.finished_cap()
        slots = n_best
        if len(rankings) > 1:
            slots = len(rankings) * n_best if patience is None else patience
        return cls(n_best, slots, patience, rankings)


@dataclass
class Beams:
    """The state of a search over ``n`` sentence slots, all on one device, all of fixed shapes.

    Running: ``tokens`` ``(rows, width)``, BOS then the pieces (column ``step`` is each row's last);
    ``scores`` ``(n, beam)`` their log-probabilities; ``max_lens`` ``(n,)`` pieces allowed, EOS not
    counted; ``active`` ``(n,)`` not settled; ``step`` ``(1,)`` pieces so far. Finished, best first
    (by ``done_unmet``, then ``done_scores``; ties: the one that ended first): ``done`` ``(n,)`` how
    many; ``done_scores`` ``(n, K)`` in float64 under the first ranking, ``done_log_probs``,
    ``done_lengths``, ``done_unmet`` ``(n, K)`` and ``done_tokens`` ``(n, K, width)``; ``arrived``
    ``(n,)`` hypotheses that ended (what ``patience`` counts; kept only with one). ``penalties``:
    ``(rankings, width + 2)`` ``lp(L)`` in float64 (``L`` = 0 is never read). ``first_limit``: on
    the host, the fewest pieces a sentence searched may write, and ``ended``, whether any
    hypothesis has ended yet: before either, a CPU's step knows no sentence can settle.
    """

    tokens: Tensor
    scores: Tensor
    max_lens: Tensor
    active: Tensor
    step: Tensor
    done: Tensor
    done_scores: Tensor
    done_log_probs: Tensor
    done_lengths: Tensor
    done_unmet: Tensor
    done_tokens: Tensor
    arrived: Tensor
    penalties: Tensor
    ranking: Ranking
    first_limit: int = 0
    ended: bool = False

    @classmethod
    def start(cls, n: int, beam: int, width: int, ranking: Ranking, device: torch.device) -> Beams:
        """Buffers for ``n`` sentence slots of ``beam`` rows and ``width`` token columns, every
        slot settled until :meth:`reset_` fills them."""
        # |Y| ** α has no value at length 0 for α < 0, and no search asks for it
        penalties = [
            [1.0] + [length_penalty(length, a, name) for length in range(1, width + 2)]
            for name, a in ranking.rankings
        ]
        k, long = ranking.slots, dict(dtype=torch.long, device=device)
        return cls(
            tokens=torch.full((n * beam, width), BOS, **long),
            scores=torch.zeros(n, beam, device=device),
            max_lens=torch.zeros(n, **long),
            active=torch.zeros(n, dtype=torch.bool, device=device),
            step=torch.zeros(1, **long),
            done=torch.zeros(n, **long),
            done_scores=torch.zeros(n, k, dtype=torch.float64, device=device),
            done_log_probs=torch.zeros(n, k, device=device),
            done_lengths=torch.zeros(n, k, **long),
            done_unmet=torch.zeros(n, k, **long),
            done_tokens=torch.zeros(n, k, width, **long),
            arrived=torch.zeros(n, **long),
            penalties=torch.tensor(penalties, dtype=torch.float64, device=device),
            ranking=ranking,
        )

    def reset_(self, max_lens: Tensor, scores: float = float("-inf")) -> None:
        """A new batch in place: sentences ``0..len(max_lens)-1`` with these limits ``(m,)``, every
        row at BOS with log-probability 0 in its first row and ``scores`` in the others (-inf for
        beam search, whose rows are identical at BOS; 0 for samples); slots past them stay
        settled."""
        m = max_lens.size(0)
        self.max_lens.zero_()
        self.max_lens[:m] = max_lens
        self.active.zero_()
        self.active[:m] = True
        self.scores.fill_(scores)
        self.scores[:, 0] = 0.0
        self.tokens.fill_(BOS)
        for t in (self.step, self.done, self.arrived, self.done_lengths, self.done_unmet):
            t.zero_()
        self.done_scores.fill_(float("-inf"))
        self.first_limit, self.ended = int(max_lens.min()), False

    def tail(self) -> Tensor:
        """Each row's last three tokens ``(rows, 3)``, BOS repeated where it has fewer."""
        last = (self.step + torch.arange(-2, 1, device=self.step.device)).clamp_(min=0)
        return self.tokens.index_select(1, last)

    def at_limit(self, step: int | None = None) -> Tensor | None:
        """Per row ``(rows,)``: whether its sentence has reached its length limit; None where a CPU
        knows from the host's ``step`` that none has (a GPU's step may be captured, and reads no
        host value: it always makes the mask)."""
        if step is not None and step < self.first_limit and not self.tokens.is_cuda:
            return None
        return (self.step >= self.max_lens).repeat_interleave(self.scores.size(1))

    def update(self, lprobs: Tensor, choose, steer=None, step: int | None = None) -> Tensor:
        """One step from the restricted log-probabilities ``lprobs`` ``(rows, vocab)``: candidates
        (``choose``: beam search's :class:`Candidates` or a sampler's draws; ``steer`` reallocates a
        constrained sentence's), the finished set aside, the best that do not end continued,
        sentences settled. Returns the back-pointers ``(rows,)`` the model's state follows. Reads
        nothing on the host unless ``choose`` or ``steer`` does; ``step``, the host's count of
        pieces, lets a CPU skip work that cannot change anything yet."""
        n, beam = self.scores.shape
        top = choose.candidates(self, lprobs)
        if steer is not None:
            top = steer.allocate(top, self.scores, lprobs)
        self._finish(top, steer)
        scores, back, new = choose.continuing(top, beam)
        self.scores.copy_(scores)
        if choose.reorders and beam > 1:  # else each row goes on from itself
            self.tokens.copy_(self.tokens.index_select(0, back))
        self.tokens.index_copy_(1, self.step + 1, new.unsqueeze(1))
        if steer is not None:
            steer.advance(back, new)
        self._settle(step)
        self.step.add_(1)
        return back

    def _finish(self, top: Candidates, steer) -> None:
        """Set aside the candidates that end among each active sentence's first ``beam`` (all the
        arrivals ``patience`` allows), keeping the best ``K`` finished by (unmet constraints,
        score); a stable sort keeps the one that ended first among equals."""
        n, beam = self.scores.shape
        ends = top.is_eos[:, :beam]
        if none_set(ends):
            return
        self.ended = True
        ends = ends & self.active.unsqueeze(1)
        if self.ranking.patience is not None:
            ends &= self.arrived.unsqueeze(1) + ends.long().cumsum(1) <= self.ranking.patience
            self.arrived.add_(ends.sum(1))
        rows = (
            torch.arange(n, device=ends.device).unsqueeze(1) * beam + top.parent[:, :beam]
        ).view(-1)
        log_probs = top.scores[:, :beam]
        unmet = steer.unmet(rows).view(n, beam) if steer is not None else torch.zeros_like(rows)
        k, width = self.done_scores.size(1), self.tokens.size(1)
        valid = torch.cat([torch.arange(k, device=ends.device) < self.done.unsqueeze(1), ends], 1)
        scores = torch.cat(
            [self.done_scores, log_probs.double() / self.penalties[0, self.step + 1]], 1
        )
        # first by score (NaN as -inf), then by unmet constraints, the empty slots last
        key = scores.nan_to_num(nan=float("-inf")).masked_fill_(~valid, float("-inf"))
        order = key.sort(dim=1, descending=True, stable=True).indices
        unmet_all = torch.cat([self.done_unmet, unmet.view(n, beam)], 1)
        key = torch.where(valid, unmet_all, torch.iinfo(torch.long).max).gather(1, order)
        order = order.gather(1, key.sort(dim=1, stable=True).indices)
        log_probs = torch.cat([self.done_log_probs, log_probs], 1)
        lengths = torch.cat([self.done_lengths, self.step.expand(n, beam)], 1)
        kept = valid.sum(1)
        if self.ranking.union:
            order, kept = self._each_rankings_best(order, valid, log_probs, lengths)
        order = order[:, :k]
        self.done_scores.copy_(scores.gather(1, order))
        self.done_log_probs.copy_(log_probs.gather(1, order))
        self.done_lengths.copy_(lengths.gather(1, order))
        self.done_unmet.copy_(unmet_all.gather(1, order))
        tokens = torch.cat(
            [self.done_tokens, self.tokens.index_select(0, rows).view(n, beam, -1)], 1
        )
        self.done_tokens.copy_(tokens.gather(1, order.unsqueeze(2).expand(n, k, width)))
        self.done.copy_(kept.clamp_(max=k))

    def _each_rankings_best(
        self, order: Tensor, valid: Tensor, log_probs: Tensor, lengths: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``order`` ``(n, m)`` (the candidates to keep, best first under the first ranking) with
        those among some ranking's ``n_best`` best first, in that order, and how many they are
        ``(n,)``: no later hypothesis can bring back one that no ranking keeps now."""
        valid, log_probs, lengths = (t.gather(1, order) for t in (valid, log_probs, lengths))
        scores = log_probs.double() / self.penalties[:, lengths + 1]  # (rankings, n, m)
        scores = scores.nan_to_num(nan=float("-inf")).masked_fill(~valid, float("-inf"))
        best = scores.topk(min(self.ranking.n_best, order.size(1)), dim=-1).indices
        keep = torch.zeros_like(valid).scatter_(1, best.transpose(0, 1).flatten(1), True) & valid
        return order.gather(1, (~keep).long().sort(dim=1, stable=True).indices), keep.sum(1)

    def _settle(self, step: int | None = None) -> None:
        """Sentences whose result can no longer change stop: at the limit, once ``patience``
        hypotheses have ended, or once the ``n_best``-th best finished one scores at least what the
        best running one could still reach, under every ranking (see the module docstring)."""
        if step is not None and not self.ended and not self.tokens.is_cuda:
            if step >= self.first_limit:  # nothing has ended: only the limit ends a sentence
                self.active &= self.step < self.max_lens
            return
        rule = self.ranking
        may = self.done >= rule.n_best
        if rule.patience is not None:
            may |= self.arrived >= rule.patience
        if none_set(may):
            self.active &= self.step < self.max_lens  # too few finished: only the limit ends one
            return
        best = self.scores.max(1).values.double()  # (n,); NaN if a row is: never settled by it
        reach = torch.maximum(
            self.penalties[:, self.step + 2], self.penalties[:, self.max_lens + 1]
        )
        bound = torch.where(best < 0, best / reach, best)  # (rankings, n)
        written = torch.arange(rule.slots, device=best.device) < self.done.unsqueeze(1)
        if len(rule.rankings) == 1:
            finished = self.done_scores.unsqueeze(0)
        else:
            finished = self.done_log_probs.double() / self.penalties[:, self.done_lengths + 1]
        finished = finished.nan_to_num(nan=float("-inf")).masked_fill(~written, float("-inf"))
        nth = finished.topk(rule.n_best, dim=-1).values[..., -1]  # (rankings, n)
        settled = (self.done >= rule.n_best) & (nth >= bound).all(0)
        if rule.patience is not None:
            settled |= self.arrived >= rule.patience
        self.active &= (self.step < self.max_lens) & ~settled

    def keep(self, slots: Tensor) -> None:
        """Only the sentence slots ``slots`` ``(m,)`` go on (the others have settled), each with
        all its rows; the tensors become new, smaller ones."""
        beam = self.scores.size(1)
        rows = (slots.unsqueeze(1) * beam + torch.arange(beam, device=slots.device)).view(-1)
        self.tokens = self.tokens.index_select(0, rows)
        for name in ("scores", "max_lens", "active", "done", "done_scores", "done_log_probs"):
            setattr(self, name, getattr(self, name).index_select(0, slots))
        for name in ("done_lengths", "done_unmet", "done_tokens", "arrived"):
            setattr(self, name, getattr(self, name).index_select(0, slots))
        self.first_limit = int(self.max_lens.min())

    def results(self, slots: list[int]) -> list[list[Hypothesis]]:
        """The result of each slot of ``slots``: its ``n_best`` hypotheses, best first (every
        finished one when several rankings are asked for), read from the device at once. Scores are
        the float64 ones the search ranked by."""
        index = torch.tensor(slots, dtype=torch.long, device=self.done.device)
        done, lengths, scores, log_probs, unmet, tokens = (
            t.index_select(0, index).tolist()
            for t in (
                self.done,
                self.done_lengths,
                self.done_scores,
                self.done_log_probs,
                self.done_unmet,
                self.done_tokens,
            )
        )
        shown = self.ranking.slots if len(self.ranking.rankings) > 1 else self.ranking.n_best
        return [
            [
                Hypothesis(
                    tokens[s][j][1 : 1 + lengths[s][j]],
                    scores[s][j],
                    log_probs[s][j],
                    None,
                    unmet[s][j],
                )
                for j in range(min(done[s], shown))
            ]
            for s in range(len(slots))
        ]

    def tensors(self) -> list[Tensor]:
        """Every tensor of the state (what a warm-up before a CUDA graph capture saves and puts
        back)."""
        return [v for v in vars(self).values() if isinstance(v, Tensor)]


def none_set(mask: Tensor) -> bool:
    """Whether ``mask`` is all False, read only on a CPU, where a read costs nothing and spares the
    work the caller then skips; on a GPU the step may be captured as a CUDA graph, which must not
    read the device, so there it is always False and the work (which then changes nothing) is
    done."""
    return not mask.is_cuda and not bool(mask.any())
