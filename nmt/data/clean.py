"""Cleaning a parallel corpus: which pairs are dropped, why, and how many.

Before a tokenizer exists the rule is by text (:func:`strip_pairs`: a side without text,
:func:`has_text`); once one exists it is by pieces as well (:func:`encode_rows`), so that what is
dropped is what the model could not learn from. Every pair dropped is counted under its reason in a
:class:`CleanReport`, which the run logs. This module needs no torch.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from nmt.scoring.text_forms import clusters

from .corpus import CHUNK_LINES, DataError, ParallelText
from .tokenizer import UNK, WORD_BOUNDARY, Tokenizer

# Why a pair is dropped (one int8 a pair); a CleanReport counts them in this order.
KEPT, EMPTY, TOO_LONG, BAD_RATIO, UNKNOWN = 0, 1, 2, 3, 4

# (ids, offsets): int32 pieces back to back, int64 (n + 1,) where each line's start
Flat = tuple[np.ndarray, np.ndarray]

#: Unicode categories of the characters that hold nothing to translate: controls (Cc), format
#: characters (Cf: U+200B, the direction marks U+200E and U+202E, U+FEFF, the soft hyphen ...),
#: surrogates (Cs: read as U+FFFD, a space to SentencePiece) and separators (Zs, Zl, Zp).
NO_TEXT_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})
#: Characters that are text to Unicode (category So) but spaces to SentencePiece: U+FFFD, what
#: undecodable bytes became, and U+2581, its own word-boundary mark. A line of them has no pieces.
SENTENCEPIECE_SPACES = frozenset("\ufffd\u2581")


def has_text(line: str) -> bool:
    """Whether ``line`` holds a character to translate: one outside :data:`NO_TEXT_CATEGORIES`,
    not a space and not one of :data:`SENTENCEPIECE_SPACES`.

    A line without one is empty, whatever a tokenizer makes of it: SentencePiece removes U+200B but
    keeps U+202E, as a piece of its own when its training text held one, and a model given that
    piece invents a sentence. Training drops a pair with such a side (:data:`EMPTY`), and
    translation leaves its line empty.
    """
    # no character of those categories but the ASCII space, nor one of those two: most lines, at
    # C speed
    if line.isprintable() and "\ufffd" not in line and "\u2581" not in line:
        return bool(line.strip(" "))
    return any(
        not ch.isspace()
        and ch not in SENTENCEPIECE_SPACES
        and unicodedata.category(ch) not in NO_TEXT_CATEGORIES
        for ch in line
    )


@dataclass
class CleanReport:
    """How many pairs cleaning saw, and how many it dropped for each reason."""

    total: int = 0
    # a side with no pieces or no text (has_text; before a tokenizer exists, no text)
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0
    unknown: int = 0  # a side of no piece but UNK and the bare word boundary

    @property
    def kept(self) -> int:
        """Pairs left."""
        return self.total - self.empty - self.unknown - self.too_long - self.bad_ratio

    def __str__(self) -> str:
        return (
            f"{self.kept}/{self.total} pairs kept ({self.empty} with a side of no pieces or no "
            f"text, {self.unknown} with a side of unknown pieces only, "
            f"{self.too_long} over max_len, {self.bad_ratio} over max_len_ratio)"
        )


def strip_pairs(src: list[str], tgt: list[str]) -> tuple[list[str], list[str], CleanReport]:
    """Strip whitespace and drop pairs with a side without text (:func:`has_text`): the rule before
    a tokenizer exists (the text it trains on); with one, :func:`clean_pairs` decides by pieces
    too."""
    report = CleanReport(total=len(src))
    out_src, out_tgt = [], []
    for s, t in zip(src, tgt):
        s, t = s.strip(), t.strip()
        if not has_text(s) or not has_text(t):
            report.empty += 1
            continue
        out_src.append(s)
        out_tgt.append(t)
    return out_src, out_tgt, report


def stripped_side(text: ParallelText, side: int) -> Iterator[str]:
    """The stripped source (``side`` 0) or target (1) line of every pair with text on both sides.

    Raises:
        DataError: as :meth:`ParallelText.pairs`, or no pair has text on both sides.
    """
    kept = 0
    for block in text.chunks(CHUNK_LINES):  # encoding then decides by pieces (encode_rows)
        lines = strip_pairs(*block)[side]
        kept += len(lines)
        yield from lines
    if kept == 0:
        raise DataError(
            "the training data has no pair with text on both sides; check the training files"
        )


@dataclass
class Unknowns:
    """How much of some lines a tokenizer encodes to the unknown piece (:func:`unknowns`)."""

    lines: int  # lines measured
    pieces: float  # share of their pieces that are UNK
    holding: float  # share of the lines that hold an UNK
    missing: Counter  # each character that encodes to UNK: its occurrences in the lines


def characters(line: str) -> list[str]:
    """The characters of ``line`` as SentencePiece's ``nmt_nfkc`` reads them: the
    :func:`~nmt.scoring.text_forms.clusters` of its NFKC form (``u`` and U+0308 are ``ü``)."""
    return clusters(unicodedata.normalize("NFKC", line))


def shown(character: str) -> str:
    """``character`` (one of :func:`characters`) for a message: itself and its code points, or only
    the code points where it would not print as itself (U+202E would turn the rest of the line)."""
    codes = " ".join(f"U+{ord(ch):04X}" for ch in character)
    return f"{character} ({codes})" if character.isprintable() else codes


def unknowns(encode: Callable[[list[str]], list[list[int]]], lines: list[str]) -> Unknowns:
    """What ``encode`` (a tokenizer side's ``encode_src`` or ``encode_tgt``) leaves unknown of
    ``lines``: the shares of pieces and lines, and the characters (:func:`characters`) it cannot
    spell (each, alone, encodes to UNK), counted in ``lines``."""
    ids = encode(lines)
    pieces, unknown = sum(map(len, ids)), sum(seq.count(UNK) for seq in ids)
    held = Counter(
        ch
        for line, seq in zip(lines, ids)
        if UNK in seq
        for ch in characters(line)
        if not ch.isspace()
    )
    alone = list(held)
    missing = Counter(
        {ch: held[ch] for ch, seq in zip(alone, encode(alone) if alone else []) if UNK in seq}
    )
    holding = sum(UNK in seq for seq in ids)
    return Unknowns(len(lines), unknown / max(1, pieces), holding / max(1, len(lines)), missing)


def flatten(seqs: list[list[int]]) -> Flat:
    """``(ids, offsets)``: the sequences back to back (int32) and where each starts (int64, ``(n +
    1,)``)."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return ids, offsets


def unknown_only_lines(flat: Flat, boundary: int) -> np.ndarray:
    """:func:`nmt.data.tokenizer.unknown_only` of every line of ``flat`` at once, bool ``(n,)``;
    ``boundary``: the id of the bare word-boundary piece."""
    ids, offsets = flat
    # seen[k]: pieces other than UNK and boundary among the first k
    seen = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum((ids != UNK) & (ids != boundary), out=seen[1:])
    return (offsets[1:] > offsets[:-1]) & (seen[offsets[1:]] == seen[offsets[:-1]])


def drop_reasons(
    tokenizer: Tokenizer,
    lines: tuple[list[str], list[str]],
    src: Flat,
    tgt: Flat,
    max_len: int | None = None,
    max_len_ratio: float | None = None,
) -> np.ndarray:
    """Why each pair of ``lines`` (source and target text) and of ``src`` and ``tgt`` (their ids,
    :func:`flatten`) is dropped, int8 ``(n,)``.

    A pair is :data:`EMPTY` when a side has no pieces or no text (:func:`has_text`), else
    :data:`UNKNOWN` when a side has no piece but UNK and the bare word boundary ``▁``
    (:func:`nmt.data.tokenizer.unknown_only`: both sides, since a model learns as little from a
    target it cannot spell as from a source it cannot read). With ``max_len``, a pair is then
    :data:`TOO_LONG` when a side has more than ``max_len`` pieces, and :data:`BAD_RATIO` when the
    longer side has more than ``max_len_ratio`` times the pieces of the shorter. :data:`KEPT`
    otherwise.
    """
    s, t = np.diff(src[1]), np.diff(tgt[1])
    reason = np.full(len(s), KEPT, dtype=np.int8)
    boundary = tokenizer.src.piece_to_id(WORD_BOUNDARY), tokenizer.tgt.piece_to_id(WORD_BOUNDARY)
    reason[unknown_only_lines(src, boundary[0]) | unknown_only_lines(tgt, boundary[1])] = UNKNOWN
    textless = np.fromiter(
        (not (has_text(a) and has_text(b)) for a, b in zip(*lines)), dtype=bool, count=len(s)
    )
    reason[(s == 0) | (t == 0) | textless] = EMPTY
    if max_len is not None:
        reason[(reason == KEPT) & ((s > max_len) | (t > max_len))] = TOO_LONG
        if max_len_ratio:
            reason[
                (reason == KEPT)
                & (np.maximum(s, t) > max_len_ratio * np.maximum(1, np.minimum(s, t)))
            ] = BAD_RATIO
    return reason


def encode_rows(
    tokenizer: Tokenizer,
    src: list[str],
    tgt: list[str],
    max_len: int | None = None,
    max_len_ratio: float | None = None,
    threads: int = -1,
) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    """Piece ids of every pair, and why each pair is dropped (:func:`drop_reasons`).

    Lines are encoded as ``nmt translate`` encodes them
    (:meth:`~nmt.data.tokenizer.Tokenizer.encode_src`: control characters read as spaces, then
    SentencePiece's normalisation, which removes leading, trailing and repeated whitespace itself; a
    line of only U+200B, not blank to ``str.strip``, has no pieces either).

    Returns:
        source ids, target ids (one list a pair, in order) and the reasons, int8 ``(n,)``.
    """
    src_ids, tgt_ids = tokenizer.encode_src(src, threads), tokenizer.encode_tgt(tgt, threads)
    return (
        src_ids,
        tgt_ids,
        drop_reasons(
            tokenizer, (src, tgt), flatten(src_ids), flatten(tgt_ids), max_len, max_len_ratio
        ),
    )


def report_of(reason: np.ndarray) -> CleanReport:
    """The cleaning counts of :func:`drop_reasons`' reasons."""
    counts = np.bincount(reason, minlength=5)
    return CleanReport(
        len(reason), *(int(counts[r]) for r in (EMPTY, TOO_LONG, BAD_RATIO, UNKNOWN))
    )


@dataclass
class CleanPairs:
    """Pairs kept by :func:`clean_pairs`: stripped lines, their piece ids, and the counts."""

    src: list[str]
    tgt: list[str]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    report: CleanReport


def clean_pairs(
    tokenizer: Tokenizer, src: list[str], tgt: list[str], threads: int = -1
) -> CleanPairs:
    """Tokenize, and drop every pair that :func:`drop_reasons` drops without a length filter
    (a side of no pieces or no text, or of unknown pieces only). The kept text is stripped."""
    src_ids, tgt_ids, reason = encode_rows(tokenizer, src, tgt, threads=threads)
    keep = (reason == KEPT).tolist()
    src, tgt, src_ids, tgt_ids = (
        list(itertools.compress(x, keep)) for x in (src, tgt, src_ids, tgt_ids)
    )
    return CleanPairs(
        [s.strip() for s in src], [t.strip() for t in tgt], src_ids, tgt_ids, report_of(reason)
    )
