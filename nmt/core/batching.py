"""Batches from encoded corpora: token-budget length bucketing and collation.

Reading, cleaning and encoding text live outside the core (:mod:`nmt.data.corpus`,
:mod:`nmt.data.encoded`). Notation:
``src_len``/``tgt_len`` count pieces plus the one EOS (source) or BOS/EOS (target) that
:func:`collate` adds; every budget in tokens counts padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .pieces import BOS, EOS, PAD


class Pairs(Protocol):
    """Encoded sentence pairs (:class:`nmt.data.encoded.EncodedCorpus` is one): each side's piece
    ids, without EOS."""

    def src(self, i: int) -> np.ndarray:
        """Pair ``i``'s source piece ids."""

    def tgt(self, i: int) -> np.ndarray:
        """Pair ``i``'s target piece ids."""


class Mix(Protocol):
    """How an epoch draws from the corpora of several directions
    (:class:`nmt.data.multilingual.DirectionMix`)."""

    def epoch_examples(self, seed: int, epoch: int) -> np.ndarray:
        """The example indices of ``epoch`` (drawn with replacement), in index order."""


# --------------------------------------------------------------------------- batching


def token_batches(lengths: np.ndarray, max_tokens: int, order: np.ndarray) -> list[np.ndarray]:
    """Greedily cut ``order`` into batches whose padded size ``n · max(lengths)`` fits
    ``max_tokens``.

    ``lengths`` holds one length per example (tokens, the longer side for pairs);
    ``order`` should already sort examples by length so that padding stays small.
    An example longer than ``max_tokens`` on its own gets a batch of its own.
    """
    batches, start, longest = [], 0, 0
    # Python ints: 10x faster than numpy scalars
    for i, n in enumerate(np.asarray(lengths)[order].tolist()):
        if n > longest:
            if i > start and n * (i - start + 1) > max_tokens:
                batches.append(order[start:i])
                start = i
            longest = n
        elif longest * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, longest = i, n
    if len(order) > start:
        batches.append(order[start:])
    return batches


class TokenBatchSampler:
    """Length-bucketed batches under a token budget, reshuffled every epoch by seed.

    Each epoch sorts examples by (source length, target length) with ties broken by a
    seeded permutation, cuts them into batches of at most ``max_tokens`` tokens counting
    padding (``batch_size · max(src_len, tgt_len)``), then shuffles the batch order.
    Every example appears exactly once per epoch. With ``world_size > 1`` each rank takes
    every ``world_size``-th batch and all ranks get the same number of batches (the
    remainder is dropped that epoch), so no rank waits for another at an epoch's end.

    With ``mix`` (the corpora of several directions, one after another) an epoch is the
    examples :meth:`~nmt.data.multilingual.DirectionMix.epoch_examples` draws instead, as many as
    the corpora hold together, each direction's share set by a temperature; they are then
    sorted, cut and shuffled the same way, so batches mix directions of similar lengths.
    Every choice is a function of ``seed`` and the epoch, so a resumed run cuts the same batches.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        mix: Mix | None = None,
    ):
        self.lengths = np.maximum(src_lengths, tgt_lengths)
        self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
        self.max_tokens, self.seed, self.rank, self.world_size, self.mix = (
            max_tokens,
            seed,
            rank,
            world_size,
            mix,
        )

    def epoch_examples(self, epoch: int) -> np.ndarray:
        """The examples of ``epoch`` (indices; with ``mix``, drawn and possibly repeated), in index
        order."""
        return (
            np.arange(len(self.lengths))
            if self.mix is None
            else self.mix.epoch_examples(self.seed, epoch)
        )

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches (arrays of example indices) of ``epoch``, in training order."""
        rng = np.random.default_rng([self.seed, epoch])
        examples = self.epoch_examples(epoch)
        tie = examples[rng.permutation(len(examples))]
        order = tie[np.lexsort((self.tgt_lengths[tie], self.src_lengths[tie]))]
        batches = token_batches(self.lengths, self.max_tokens, order)
        batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.world_size > 1:
            per_rank = len(batches) // self.world_size
            batches = batches[self.rank : per_rank * self.world_size : self.world_size]
        return batches

    def padding_fraction(self, epoch: int = 0, multiple: int = 1) -> float:
        """Share of PAD in the source and target positions of ``epoch``'s batches as
        :func:`collate` builds them (each side one longer for its EOS, its length rounded up to
        ``multiple``, ``train.pad_to_multiple``); 0 = no padding."""
        real = padded = 0
        for b in self.epoch_batches(epoch):
            src, tgt = self.src_lengths[b] + 1, self.tgt_lengths[b] + 1
            real += int(src.sum() + tgt.sum())
            padded += len(b) * (_width(int(src.max()), multiple) + _width(int(tgt.max()), multiple))
        return 1.0 - real / max(1, padded)


@dataclass
class Batch:
    """A padded batch. ``src``: ``(batch, src_len)`` pieces + EOS; ``tgt_in``: BOS + pieces;
    ``tgt_out``: pieces + EOS, both ``(batch, tgt_len)``; PAD fills the rest."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor

    @property
    def n_tgt_tokens(self) -> int:
        """Target tokens in the batch, PAD excluded (EOS counted): the loss's denominator."""
        return int((self.tgt_out != PAD).sum())

    def to(self, device: torch.device) -> "Batch":
        """The batch on ``device`` (copied without blocking where it can be)."""
        return Batch(
            *(t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out))
        )


def _width(longest: int, multiple: int) -> int:
    """``longest`` rounded up to a multiple of ``multiple``."""
    return -(-longest // multiple) * multiple


def pad_sources(
    seqs: list[np.ndarray | list[int]], pin_memory: bool = False, multiple: int = 1
) -> torch.Tensor:
    """Append EOS to each source and right-pad with PAD: ``(batch, src_len)``, ``src_len`` a
    multiple of ``multiple`` (fewer distinct shapes, and a GPU's tensor cores' tiles).

    ``pin_memory`` allocates page-locked host memory, so a later ``.to("cuda",
    non_blocking=True)`` copies asynchronously.
    """
    width = _width(max(len(s) for s in seqs) + 1, multiple)
    out = torch.full((len(seqs), width), PAD, dtype=torch.long, pin_memory=pin_memory)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        out[i, len(s)] = EOS
    return out


def collate(
    corpus: Pairs, indices: np.ndarray, pin_memory: bool = False, multiple: int = 1
) -> Batch:
    """The padded :class:`Batch` of examples ``indices`` (page-locked with ``pin_memory``), both
    lengths rounded up to a multiple of ``multiple`` (``train.pad_to_multiple``)."""
    src = pad_sources([corpus.src(i) for i in indices], pin_memory, multiple)
    tgts = [corpus.tgt(i) for i in indices]
    width = _width(max(len(t) for t in tgts) + 1, multiple)
    tgt_in = torch.full((len(tgts), width), PAD, dtype=torch.long, pin_memory=pin_memory)
    tgt_out = torch.full((len(tgts), width), PAD, dtype=torch.long, pin_memory=pin_memory)
    for i, t in enumerate(tgts):
        t = torch.as_tensor(np.asarray(t, dtype=np.int64))
        tgt_in[i, 0] = BOS
        tgt_in[i, 1 : len(t) + 1] = t
        tgt_out[i, : len(t)] = t
        tgt_out[i, len(t)] = EOS
    return Batch(src, tgt_in, tgt_out)
