"""Beam search held on the device: every step of fixed shapes, with nothing read on the host.

:func:`~nmt.core.search.beam_search` keeps finished hypotheses in Python lists and drops settled
sentences from the batch, so each step reads a few values from the device and runs some Python.
On a GPU each read waits for the step to end and leaves the GPU idle while the host works: at batch
128 the last profile found 46 ms of kernels in a 202 ms batch. Here the same search lives in
tensors of fixed shapes (:class:`DeviceBeams`), so that one step (:meth:`DeviceBeams.update`) only
reads and writes the device, and :mod:`nmt.graphs` captures the model's step and the search's
together as one CUDA graph. Settled sentences stay in the batch, masked, until all have settled.

It is the same search, step for step: the same rules (:meth:`~nmt.core.restrictions.Restrictions.
fixed`), the same ``2·beam`` candidates (:meth:`~nmt.core.beams.Candidates.best`), the same
finishing order, continuation (:meth:`~nmt.core.beams.Candidates.continuing`) and early stop
(``_settled``, in float64 as there), hence the same hypotheses with the same scores: the tests
compare both on generated scores. It serves plain beam search; steering (a prefix, constraints,
bans), sampling, ensembles and shortlists stay with :func:`~nmt.core.search.beam_search`.

Shapes: ``n`` sentence slots, ``beam`` hypotheses each, ``rows = n*beam`` sentence-major, ``width``
token columns (BOS and at most ``width - 1`` pieces).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import DecodeConfig
from .beams import Candidates
from .pieces import BOS, OutputRules
from .restrictions import Restrictions
from .search import Hypothesis, length_penalty


@dataclass
class DeviceBeams:
    """The state of a beam search of fixed shapes, all on one device.

    ``tokens``: ``(rows, width)``, BOS then the pieces (column ``step`` is each hypothesis' last);
    ``scores``: ``(n, beam)`` log-probabilities; ``max_lens``: ``(n,)`` pieces allowed, EOS not
    counted; ``active``: ``(n,)`` not settled; ``step``: ``(1,)`` pieces so far. Finished
    hypotheses, per sentence in the order they ended: ``done`` ``(n,)`` how many; ``done_log_probs``
    ``(n, beam+1)``, ``done_scores`` ``(n, beam+1)`` in float64 (as the host search ranks them),
    ``done_lengths`` ``(n, beam+1)`` and ``done_tokens`` ``(n, beam+1, width)``: column ``beam``
    takes what ends without room, never read. ``penalties``: ``(width+2,)`` ``lp(L)`` in float64
    (``L`` = 0 is never read).
    """

    tokens: Tensor
    scores: Tensor
    max_lens: Tensor
    active: Tensor
    step: Tensor
    done: Tensor
    done_log_probs: Tensor
    done_scores: Tensor
    done_lengths: Tensor
    done_tokens: Tensor
    penalties: Tensor
    decode: DecodeConfig
    rules: OutputRules | None
    restrict: Restrictions | None = None

    @classmethod
    def start(
        cls,
        n: int,
        width: int,
        decode: DecodeConfig,
        rules: OutputRules | None,
        device: torch.device,
    ) -> DeviceBeams:
        """Buffers for ``n`` sentence slots of ``width`` token columns (:meth:`reset_` fills
        them)."""
        beam = decode.beam_size
        # the lengths a search asks for (1 and more, EOS counted); length 0 is never read, and
        # |Y| ** α has no value there for α < 0
        penalties = [1.0] + [
            length_penalty(length, decode.length_penalty, decode.length_normalization)
            for length in range(1, width + 2)
        ]
        done = (n, beam + 1)
        return cls(
            tokens=torch.full((n * beam, width), BOS, dtype=torch.long, device=device),
            scores=torch.zeros(n, beam, device=device),
            max_lens=torch.zeros(n, dtype=torch.long, device=device),
            active=torch.zeros(n, dtype=torch.bool, device=device),
            step=torch.zeros(1, dtype=torch.long, device=device),
            done=torch.zeros(n, dtype=torch.long, device=device),
            done_log_probs=torch.zeros(done, device=device),
            done_scores=torch.zeros(done, dtype=torch.float64, device=device),
            done_lengths=torch.zeros(done, dtype=torch.long, device=device),
            done_tokens=torch.zeros(*done, width, dtype=torch.long, device=device),
            penalties=torch.tensor(penalties, dtype=torch.float64, device=device),
            decode=decode,
            rules=rules,
        )

    def reset_(self, max_lens: Tensor) -> None:
        """A new batch in place: sentences ``0..len(max_lens)-1`` with these limits ``(m,)``, every
        one at BOS; slots past them are settled from the start."""
        m = max_lens.size(0)
        self.max_lens.zero_()
        self.max_lens[:m] = max_lens
        self.active.zero_()
        self.active[:m] = True
        self.scores.fill_(float("-inf"))
        self.scores[:, 0] = 0.0  # the beam's rows are identical at BOS: only the first counts
        self.tokens.fill_(BOS)
        for t in (self.step, self.done, self.done_log_probs, self.done_scores, self.done_lengths):
            t.zero_()

    def update(self, lprobs: Tensor) -> tuple[Tensor, Tensor]:
        """One step from the next-token log-probabilities ``lprobs`` ``(rows, vocab)`` (restricted
        in place): finish the hypotheses that end, continue the best that do not, settle sentences.
        Returns the back-pointers ``(rows,)`` the scorer's state follows and each row's new last
        token ``(rows,)``. Reads nothing on the host."""
        n, beam = self.scores.shape
        if self.restrict is None:
            self.restrict = Restrictions(self.decode, self.rules, lprobs.size(-1), lprobs.device)
        at_limit = (self.step >= self.max_lens).unsqueeze(1).expand(n, beam).reshape(-1)
        last = (self.step + torch.arange(-2, 1, device=self.step.device)).clamp_(min=0)
        self.restrict.fixed(lprobs, self.tokens.index_select(1, last), self.step, at_limit)
        top = Candidates.best(self.scores, lprobs)
        self._finish(top)
        scores, back, new = top.continuing(beam)
        self.scores.copy_(scores)
        self.tokens.copy_(self.tokens.index_select(0, back))
        self.tokens.scatter_(1, (self.step + 1).expand(n * beam, 1), new.unsqueeze(1))
        self._settle()
        self.step.add_(1)
        return back, new

    def _finish(self, top: Candidates) -> None:
        """Set aside the hypotheses that end among each active sentence's first ``beam``
        candidates, in candidate order, while it has room (as ``search._finish``)."""
        n, beam = self.scores.shape
        ends = top.is_eos[:, :beam] & self.active.unsqueeze(1)
        place = self.done.unsqueeze(1) + ends.long().cumsum(1) - 1
        kept = ends & (place < beam)
        place = torch.where(kept, place, beam)  # (n, beam): the column each is written to
        rows = (torch.arange(n, device=place.device).unsqueeze(1) * beam + top.beam[:, :beam]).view(
            -1
        )
        log_probs = top.scores[:, :beam]
        self.done_log_probs.scatter_(1, place, log_probs)
        self.done_scores.scatter_(1, place, log_probs.double() / self.penalties[self.step + 1])
        self.done_lengths.scatter_(1, place, self.step.expand(n, beam))
        width = self.tokens.size(1)
        self.done_tokens.scatter_(
            1,
            place.unsqueeze(2).expand(n, beam, width),
            self.tokens.index_select(0, rows).view(n, beam, width),
        )
        self.done.add_(kept.sum(1))

    def _settle(self) -> None:
        """Sentences whose result can no longer change stop (as ``search._settled``): at the
        limit, with ``beam`` finished, or with ``n_best`` finished that score at least what the best
        running hypothesis could still reach."""
        beam, n_best = self.decode.beam_size, self.decode.n_best
        best = self.scores.max(1).values.double()
        reach = torch.maximum(self.penalties[self.step + 2], self.penalties[self.max_lens + 1])
        bound = torch.where(best < 0, best / reach, best)
        written = torch.arange(beam, device=best.device) < self.done.unsqueeze(1)
        finished = self.done_scores[:, :beam].masked_fill(~written, float("-inf"))
        # the n_best-th best (n_best may exceed beam: never that many finished, as on the host)
        nth = finished.topk(min(n_best, beam), dim=1).values[:, -1]
        settled = (self.done >= beam) | ((self.done >= n_best) & (nth >= bound))
        self.active &= (self.step < self.max_lens) & ~settled

    def results(self, sentences: int) -> list[list[Hypothesis]]:
        """The first ``sentences`` slots' ``n_best`` hypotheses, best first (one read of the
        device). Scores are the float64 ones the search ranked by: the host's division, of the same
        numbers."""
        done, lengths, scores, log_probs, tokens = (
            t[:sentences].tolist()
            for t in (
                self.done,
                self.done_lengths,
                self.done_scores,
                self.done_log_probs,
                self.done_tokens,
            )
        )
        out = []
        for s in range(sentences):
            hyps = [
                Hypothesis(tokens[s][j][1 : 1 + lengths[s][j]], scores[s][j], log_probs[s][j])
                for j in range(done[s])
            ]
            out.append(sorted(hyps, key=lambda h: -h.score)[: self.decode.n_best])
        return out

    def tensors(self) -> list[Tensor]:
        """Every tensor of the state (what a warm-up before a CUDA graph capture saves and puts
        back)."""
        return [v for v in vars(self).values() if isinstance(v, Tensor)]


def device_beam_search(
    scorer, state, max_lens: Tensor, decode: DecodeConfig, rules: OutputRules | None = None
) -> list[list[Hypothesis]]:
    """:func:`~nmt.core.search.beam_search` without steering, held on the device: the same
    arguments and results, each step run by :meth:`DeviceBeams.update` (``scorer`` is asked for
    every slot's rows every step, settled ones too). It reads one flag a step to stop early; the
    GPU's own loop (:meth:`nmt.graph_search.GraphSearch.beam_search`) replays it as CUDA graphs."""
    longest = int(max_lens.max())
    beams = DeviceBeams.start(max_lens.size(0), longest + 2, decode, rules, max_lens.device)
    beams.reset_(max_lens)
    for step in range(longest + 1):
        lprobs, state = scorer.step(beams.tokens[:, : step + 1], state)
        back, _ = beams.update(lprobs)
        if decode.beam_size > 1:
            state = scorer.reorder(state, back)
        if not bool(beams.active.any()):
            break
    return beams.results(max_lens.size(0))
