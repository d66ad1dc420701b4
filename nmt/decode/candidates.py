"""A step's candidates and beam search's choice of them: each sentence's ``2·beam`` best extensions
(:meth:`Candidates.best`), those that end set aside, the best ``beam`` others continued
(:class:`Best`). A sampler chooses differently (:class:`~nmt.decode.sampling.Sampler`); both give
:class:`Candidates` to the same :meth:`~nmt.decode.beams.Beams.update`.

Shapes: ``n`` sentences, ``beam`` hypotheses each, rows of ``(n*beam, ...)`` tensors ordered
sentence-major (row ``s*beam + k``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.core.pieces import EOS


@dataclass(frozen=True)
class Candidates:
    """A step's candidate extensions of each sentence, each ``(n, width)``: ``scores``
    (log-probabilities), ``parent`` (which of the sentence's ``beam`` hypotheses it extends, in
    ``[0, beam)``), ``token``, ``is_eos`` (ends, and may be set aside as finished)."""

    scores: Tensor
    parent: Tensor
    token: Tensor
    is_eos: Tensor

    @classmethod
    def best(cls, scores: Tensor, lprobs: Tensor) -> Candidates:
        """The ``2·beam`` best extensions of every hypothesis (``scores`` ``(n, beam)``) by every
        token (``lprobs`` ``(n*beam, vocab)``), best first, so that finished ones never starve the
        beam (fairseq's rule).

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
        back = torch.arange(n, device=chosen.device).unsqueeze(1) * beam + self.parent.gather(
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


class Best:
    """Beam search's choice: each sentence's ``2·beam`` best extensions
    (:meth:`Candidates.best`), continued by the best ``beam`` that do not end. Holds nothing and
    reads nothing on the host."""

    reorders = True  # the rows follow back-pointers

    @staticmethod
    def candidates(beams, lprobs: Tensor) -> Candidates:
        """See :meth:`Candidates.best`."""
        return Candidates.best(beams.scores, lprobs)

    @staticmethod
    def continuing(top: Candidates, beam: int) -> tuple[Tensor, Tensor, Tensor]:
        """See :meth:`Candidates.continuing`."""
        return top.continuing(beam)

    def keep(self, sentences: Tensor) -> None:
        """Nothing to drop."""
