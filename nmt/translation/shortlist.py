"""A vocabulary shortlist: the target pieces a batch's translations may use, from its source pieces.

Decoding spends a large share of every step on the output projection and log-softmax over the
whole target vocabulary. A shortlist restricts both to the pieces that a translation of the
batch's source pieces plausibly uses (Marian's lexical shortlist, Junczys-Dowmunt et al. 2018,
§4.1; CTranslate2's vocabulary map): the most frequent target pieces of the training data, and
for each source piece the target pieces that co-occur with it most strongly. It is an
approximation, never on by default: the log-softmax is normalised over the shortlist, and a
piece outside it cannot be generated (the search's own restrictions still apply within it).

The file is CTranslate2's vocabulary-map format, so one file serves both engines: one rule a
line, ``SOURCE_PIECE<TAB>TARGET_PIECE TARGET_PIECE ...``; the line whose source is empty lists the
pieces always allowed. nmt reads one-piece sources only (CTranslate2 also reads n-grams).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nmt.data.tokenizer import BOS, EOS, UNK, Tokenizer
from nmt.decode.steering import Steering
from nmt.errors import NmtError
from nmt.files import atomic_write


class ShortlistError(NmtError, ValueError):
    """A shortlist file is unreadable, malformed, or names pieces its model's vocabulary lacks."""


@dataclass(frozen=True)
class Shortlist:
    """``always``: target ids every batch may use; ``by_source``: per source id, the target ids its
    presence allows."""

    always: tuple[int, ...]
    by_source: dict[int, tuple[int, ...]]

    def columns(
        self, sources: Iterable[Iterable[int]], steering: Iterable[Steering] | None = None
    ) -> Tensor:
        """The sorted target ids ``(n,)`` a batch of ``sources`` (source piece ids) may generate:
        :attr:`always`, BOS, EOS, UNK, every source piece's list, and what the batch's steering
        needs to stay possible: every piece of its constraints and of a fragment (the word a prefix
        ends inside, whichever way it is spelt), a prefix's forced pieces, and the choices of a
        prefix step none of whose choices is listed (a word-initial piece after a prefix that ends
        with a space usually is, and then the listed ones are the choice). Banned phrases add
        nothing: a ban only removes."""
        ids = {BOS, EOS, UNK, *self.always}
        for s in {i for line in sources for i in line}:
            ids.update(self.by_source.get(s, ()))
        steering = list(steering or ())
        ids.update(i for steer in steering for phrase in steer.constraints for i in phrase)
        ids.update(i for steer in steering for state in steer.fragment for i, _ in state)
        for step in (step for steer in steering for step in steer.prefix):
            if len(step) == 1 or ids.isdisjoint(step):
                ids.update(step)
        return torch.tensor(sorted(ids), dtype=torch.long)

    def write(self, path: str | Path, tokenizer: Tokenizer) -> None:
        """Write the CTranslate2 vocabulary-map text (see the module docstring), atomically."""
        src, tgt = tokenizer.src, tokenizer.tgt_pieces

        # what the format cannot hold: the separators of pieces, rules and lines
        def ok(piece: str) -> bool:
            return bool(piece) and not any(c in " \t\n\r" for c in piece)

        def targets(ids):
            return " ".join(tgt[i] for i in ids if ok(tgt[i]))

        lines = ["\t" + targets(self.always)]
        lines += [
            f"{src.id_to_piece(s)}\t{targets(ids)}"
            for s, ids in sorted(self.by_source.items())
            if ids and ok(src.id_to_piece(s))
        ]
        atomic_write(path, "".join(line + "\n" for line in lines))

    @classmethod
    def read(cls, path: str | Path, tokenizer: Tokenizer) -> Shortlist:
        """Read a vocabulary map written by :meth:`write` (or CTranslate2's, one-piece sources).

        Raises:
            ShortlistError: the file cannot be read, a line has no tab, a source is an n-gram,
                a piece is not in the model's vocabulary (the message names file and line), or
                the file allows no target piece at all.
        """
        try:
            text = Path(path).read_bytes().decode("utf-8-sig")  # a byte-order mark is no piece
        except (OSError, UnicodeDecodeError) as e:
            raise ShortlistError(f"{path}: cannot read the shortlist ({e})") from None
        src_ids = {tokenizer.src.id_to_piece(i): i for i in range(tokenizer.src.get_piece_size())}
        tgt_ids = {p: i for i, p in enumerate(tokenizer.tgt_pieces)}
        always: tuple[int, ...] = ()
        by_source: dict[int, tuple[int, ...]] = {}
        # lines end at \n only (a piece may hold U+2028 or U+0085)
        for number, line in enumerate(text.split("\n"), 1):
            where, line = f"{path}, line {number}", line.removesuffix("\r")
            if not line.strip():
                continue
            if "\t" not in line:
                raise ShortlistError(
                    f"{where}: no tab between the source piece and its target pieces; write "
                    "'SOURCE<TAB>TARGET TARGET ...'"
                )
            key, values = line.split("\t", 1)
            if " " in key:
                what = (
                    "is only spaces"
                    if not key.strip()
                    else "is an n-gram (pieces separated by spaces)"
                )
                raise ShortlistError(
                    f"{where}: the source {key!r} {what}; nmt reads one piece, or nothing (the "
                    "pieces always allowed), before the tab"
                )
            # spaces only, as CTranslate2 splits: a piece may hold other whitespace
            pieces = [p for p in values.split(" ") if p]
            unknown = [p for p in pieces if p not in tgt_ids]
            if unknown or (key and key not in src_ids):
                missing = f"target piece {unknown[0]!r}" if unknown else f"source piece {key!r}"
                raise ShortlistError(
                    f"{where}: {missing} is not in the model's vocabulary; build the shortlist "
                    "with this model (nmt shortlist)"
                )
            targets = tuple(tgt_ids[p] for p in pieces)
            if key:
                by_source[src_ids[key]] = targets
            else:
                always = targets
        if not always and not any(by_source.values()):
            raise ShortlistError(
                f"{path}: the shortlist allows no target piece (no rule lists one); build it with "
                "nmt shortlist"
            )
        return cls(always, by_source)


def cooccurrence(
    pairs: Iterable[tuple[list[int], list[int]]], tgt_vocab: int, block: int = 50_000
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Sentence-level co-occurrence counts of ``pairs`` of (source ids, target ids).

    Returns ``(keys, counts, src_counts, tgt_counts, n)``: ``keys`` ``s * tgt_vocab + t`` of every
    pair of pieces that occur in one sentence pair, sorted, with ``counts`` the sentence pairs
    holding both; ``src_counts``/``tgt_counts``: sentence pairs holding each piece (dicts as
    arrays indexed by id); ``n``: sentence pairs. Counted in blocks of ``block`` pairs, so memory
    follows the distinct piece pairs, not the corpus.
    """
    keys, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    src_counts, tgt_counts, n = {}, np.zeros(tgt_vocab, np.int64), 0
    pending: list[np.ndarray] = []

    def merge(keys, counts, new):
        merged = np.concatenate([keys, new])
        weights = np.concatenate([counts, np.ones(len(new), np.int64)])
        unique, inverse = np.unique(merged, return_inverse=True)
        return unique, np.bincount(inverse, weights=weights).astype(np.int64)

    for src, tgt in pairs:
        s, t = np.unique(np.asarray(src, np.int64)), np.unique(np.asarray(tgt, np.int64))
        pending.append(np.add.outer(s * tgt_vocab, t).ravel())
        for i in s.tolist():
            src_counts[i] = src_counts.get(i, 0) + 1
        tgt_counts[t] += 1
        n += 1
        if len(pending) == block:
            keys, counts = merge(keys, counts, np.concatenate(pending))
            pending = []
    if pending:
        keys, counts = merge(keys, counts, np.concatenate(pending))
    src_array = np.zeros(max(src_counts, default=-1) + 1, np.int64)
    src_array[list(src_counts)] = list(src_counts.values())
    return keys, counts, src_array, tgt_counts, n


def build(
    tokenizer: Tokenizer,
    pairs: Iterable[tuple[str, str]],
    per_source: int = 100,
    frequent: int = 200,
    block: int = 50_000,
) -> Shortlist:
    """A shortlist from parallel training text, by co-occurrence (no word alignment needed).

    ``always``: the ``frequent`` target pieces in the most sentence pairs. For each source piece
    ``s``, the ``per_source`` target pieces ``t`` with the highest Dice coefficient
    ``2·c(s,t) / (c(s) + c(t))`` (Dice 1945; ``c``: sentence pairs holding the pieces), which ranks
    a piece by how consistently it appears with ``s``, not by how common it is everywhere
    (frequent pieces are in ``always`` already). ``pairs``: (source line, target line), encoded
    with the model's tokenizer in blocks of ``block`` pairs.

    Raises:
        ShortlistError: no pair has pieces on both sides (an empty corpus).
    """
    tgt_vocab = len(tokenizer.tgt_pieces)

    def encoded():
        lines = iter(pairs)
        while chunk := list(itertools.islice(lines, block)):
            yield from zip(
                tokenizer.encode_src([s for s, _ in chunk]),
                tokenizer.encode_tgt([t for _, t in chunk]),
            )

    keys, counts, src_counts, tgt_counts, n = cooccurrence(encoded(), tgt_vocab, block)
    if not keys.size:
        raise ShortlistError(
            f"no sentence pair with pieces on both sides among {n} pairs: nothing to build a "
            "shortlist from"
        )
    # no list is longer than the vocabulary
    per_source, frequent = (min(per_source, tgt_vocab), min(frequent, tgt_vocab))
    always = tuple(
        int(i) for i in np.argsort(-tgt_counts, kind="stable")[:frequent] if tgt_counts[i] > 0
    )
    return Shortlist(always, rank(keys, counts, src_counts, tgt_counts, tgt_vocab, per_source))


def rank(
    keys: np.ndarray,
    counts: np.ndarray,
    src_counts: np.ndarray,
    tgt_counts: np.ndarray,
    tgt_vocab: int,
    per_source: int,
) -> dict[int, tuple[int, ...]]:
    """Per source id, its ``per_source`` target ids of highest Dice coefficient, best first (ties:
    the lower id), from :func:`cooccurrence`'s counts."""
    s, t = keys // tgt_vocab, keys % tgt_vocab
    dice = 2 * counts / (src_counts[s] + tgt_counts[t])
    order = np.lexsort((t, -dice, s))  # by source, then best first
    s, t = s[order], t[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, np.int64)
    # a source's list stops at its own group, whatever per_source is
    ends = np.r_[starts[1:], len(s)]
    return {
        int(s[a]): tuple(int(i) for i in t[a : min(b, a + per_source)])
        for a, b in zip(starts, ends)
    }
