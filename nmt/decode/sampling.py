"""Sampling in place of beam search (back-translation, data augmentation): each row draws its next
piece from the model's distribution, as the :class:`Sampler` choice of the same loop
(:mod:`nmt.decode.candidates` has beam search's).

Shapes: ``n`` sentences, ``k`` samples each, ``rows = n*k``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt.core.pieces import EOS

from .candidates import Candidates


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
    # maximum's pieces; inf: uniform over what may follow), never NaN.
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


class Sampler:
    """Ancestral sampling's choice: each row draws its next piece (see :class:`Sampling`) and keeps
    its place; a row that draws EOS has finished and draws on unread. Each sentence's rows draw with
    uniform numbers from a generator seeded by its seed, so results are reproducible and
    independent of batching (up to floating-point rounding of the model's scores). It reads the
    host (the generators), so a sampling search is run step by step, never captured.

    ``candidates`` are each row's draw, scored by the model's log-probability (temperature 1, no
    top-k or top-p): the sample's log-probability."""

    reorders = False  # each row stays where it is

    def __init__(self, sampling: Sampling, seeds: list[int], k: int, device: torch.device):
        self.sampling, self.k = sampling, k
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.drawing = torch.ones(len(seeds) * k, dtype=torch.bool, device=device)

    def candidates(self, beams, lprobs: Tensor) -> Candidates:
        """Each row's draw from ``lprobs`` ``(rows, vocab)`` (restricted): ``(n, k)`` each."""
        n, k = beams.scores.shape
        uniform = torch.cat([torch.rand(k, generator=g) for g in self.generators])
        cdf = sampling_probs(lprobs, self.sampling).cumsum(-1)
        token = (
            torch.searchsorted(
                cdf, (uniform.to(lprobs.device) * cdf[:, -1]).unsqueeze(1), right=True
            )
            .squeeze(1)
            .clamp_(max=cdf.size(1) - 1)
        )
        # nothing may follow (a shortlist and the restrictions leave no piece), or the limit: the
        # sample ends, even where the scores are NaN
        token[~torch.isfinite(lprobs).any(1) | beams.at_limit()] = EOS
        scores = beams.scores.view(-1) + lprobs.gather(1, token.unsqueeze(1)).squeeze(1)
        ends = (token == EOS) & self.drawing
        self.drawing &= ~ends
        here = torch.arange(k, device=token.device).expand(n, k)
        return Candidates(scores.view(n, k), here, token.view(n, k), ends.view(n, k))

    @staticmethod
    def continuing(top: Candidates, k: int) -> tuple[Tensor, Tensor, Tensor]:
        """Every row goes on in its place; one that has ended with -inf, so that it never ranks."""
        n = top.scores.size(0)
        scores = top.scores.masked_fill(top.is_eos, float("-inf"))
        return scores, torch.arange(n * k, device=scores.device), top.token.view(-1)

    def keep(self, sentences: Tensor) -> None:
        """Only sentences ``sentences`` ``(new_n,)`` go on, their generators with them."""
        self.generators = [self.generators[i] for i in sentences.tolist()]
        rows = sentences.unsqueeze(1) * self.k + torch.arange(self.k, device=sentences.device)
        self.drawing = self.drawing.index_select(0, rows.view(-1))
