"""Exact duplicates and the overlap of validation with training pairs, counted by 64-bit hashes
of the encoded lines: a corpus of millions of pairs is hashed in numpy, a block at a time, without
its text in memory. What is hashed is the pieces (``ids``), so two lines SentencePiece reads alike
count as equal, as they do to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .clean import Flat
from .encoded import EncodedCorpus

# odd 64-bit constants: splitmix64's (Steele et al. 2014), mixing each id before the sum
_MIX = np.array([0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB], dtype=np.uint64)


def _mixed(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of each uint64 (arithmetic modulo 2^64): near values far apart."""
    v = values * _MIX[0]
    v ^= v >> np.uint64(30)
    v *= _MIX[1]
    v ^= v >> np.uint64(27)
    v *= _MIX[2]
    return v ^ (v >> np.uint64(31))


def line_hashes(blocks: list[Flat]) -> np.ndarray:
    """A 64-bit hash of each line of ``blocks`` (an encoded side: ``(ids, offsets)`` each, offsets
    need not start at 0), uint64 ``(lines,)``: equal lines hash equal; unequal ones collide with a
    chance near 2^-64 a pair. Each id, mixed with its position in the line, is summed modulo 2^64,
    and the sum mixed with the length: vectorised, a block at a time."""
    out = [np.zeros(0, dtype=np.uint64)]
    for ids, offsets in blocks:
        lengths = np.diff(offsets)
        rel = (offsets - offsets[0]).astype(np.int64)
        flat = ids[offsets[0] : offsets[-1]].astype(np.uint64)
        position = np.arange(len(flat), dtype=np.uint64) - np.repeat(
            rel[:-1].astype(np.uint64), lengths
        )
        sums = np.zeros(len(flat) + 1, dtype=np.uint64)
        np.cumsum(_mixed(flat + (position << np.uint64(32))), out=sums[1:])
        out.append(_mixed((sums[rel[1:]] - sums[rel[:-1]]) ^ lengths.astype(np.uint64)))
    return np.concatenate(out)


def corpus_hashes(corpus: EncodedCorpus) -> tuple[np.ndarray, np.ndarray]:
    """uint64 ``(n,)`` hashes of each pair's source and of each pair of ``corpus``: duplicates and
    overlaps are counted by them."""
    src = line_hashes(corpus.src_blocks)
    return src, pair_hashes(src, line_hashes(corpus.tgt_blocks))


def pair_hashes(src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """One uint64 hash per pair of the line hashes ``src`` and ``tgt`` (:func:`line_hashes`)."""
    return _mixed(src ^ _mixed(tgt))


@dataclass(frozen=True)
class Overlap:
    """What a validation set shares with its training pairs: ``pairs`` of its pairs are training
    pairs, ``sources`` of its sources are training sources, of ``total`` pairs."""

    pairs: int
    sources: int
    total: int

    # a validation set this much inside the training pairs scores memory, not translation
    MATERIAL = 0.01

    @classmethod
    def of(cls, train: tuple[np.ndarray, np.ndarray], valid: tuple[np.ndarray, np.ndarray]):
        """The overlap of ``valid`` with ``train``, each ``(source hashes, pair hashes)``."""
        return cls(
            int(np.isin(valid[1], train[1]).sum()),
            int(np.isin(valid[0], train[0]).sum()),
            len(valid[1]),
        )

    def __str__(self) -> str:
        return f"in the training pairs: {self.pairs} pairs, {self.sources} sources"

    def worth_saying(self, files: str) -> str | None:
        """What to warn of, in one line, for a validation set read from ``files`` when
        :attr:`MATERIAL` of its pairs are training pairs, else None."""
        if not self.pairs or self.pairs < self.MATERIAL * self.total:
            return None
        return (
            f"{self.pairs} of the {self.total} validation pairs ({files}) are training "
            "pairs too: validation BLEU, best.pt and train.patience would reward remembering them; "
            "hold them out of the training files, or validate on other text"
        )


def duplicate_pairs(pairs: np.ndarray) -> int:
    """How many of the pairs (:func:`pair_hashes`) repeat an earlier one."""
    return len(pairs) - len(np.unique(pairs))
