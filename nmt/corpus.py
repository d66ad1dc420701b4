"""Parallel text on disk: reading, cleaning, and encoding into a memory-mapped id cache.

Text files are streamed line by line and encoded in blocks by several processes
(``datasets.Dataset.map(num_proc=...)``), so memory does not grow with the corpus: a
4.5-million-pair corpus is encoded into Arrow ``list<int32>`` columns that training then
reads, memory-mapped, as NumPy views (see ``docs/performance.md``, "Data at scale").
This module needs no torch; batching lives in :mod:`nmt.data`.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import gzip
import hashlib
import itertools
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
import typing
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .tokenizer import Tokenizer

log = logging.getLogger("nmt.corpus")

CHUNK_LINES = 50_000  # pairs a worker encodes at a time
READ_BYTES = 1 << 16  # read size when streaming standard input
# Part of every cache key: raise it whenever cleaning or encoding rules change, so that no
# run maps a cache an older rule wrote. 2: emptiness by pieces; length-prefixed fingerprints.
CACHE_FORMAT = 2


class DataError(ValueError):
    """Input text cannot be used; the message names the file, the line and what to do."""


# ---------------------------------------------------------------------------- reading


def iter_lines(path: str | Path) -> Iterator[str]:
    """Stream a plain or gzipped UTF-8 text file, one sentence a line.

    Lines are split on ``\\n`` only (never on the Unicode separators that
    ``str.splitlines`` also honours, which would shift the alignment of a parallel
    corpus); a trailing ``\\r`` (CRLF files) and a UTF-8 byte-order mark on the first
    line are removed. Blank lines are kept, so line numbers stay aligned.

    Raises:
        DataError: the file does not exist, cannot be read or decompressed, or a line is
            not valid UTF-8 (the message gives ``file:line``).
    """
    path = check_file(path)
    with _open_bytes(path) as f:
        for number, raw in enumerate(f, start=1):
            yield decode_line(raw, number, path)


@contextlib.contextmanager
def _open_bytes(path: Path) -> Iterator[typing.BinaryIO]:
    """``path`` opened for binary reading, decompressed if its content is gzip (whatever its name).

    Raises:
        DataError: UTF-16 text, or the file cannot be read or decompressed (also while reading).
    """
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic in (b"\xff\xfe", b"\xfe\xff"):
        raise DataError(f"{path}: UTF-16 text; convert it to UTF-8 (e.g. iconv -f utf-16 -t utf-8)")
    opener = gzip.open if magic == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as f:
            yield f
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({exc}); is the file complete and, if .gz, really gzip?") from None


def decode_line(raw: bytes, number: int, name) -> str:
    """Line ``number`` (1-based) of input ``name`` as text, without its ``\\n`` or ``\\r\\n`` (and, on
    line 1, without a UTF-8 byte-order mark).

    Raises:
        DataError: the line is not valid UTF-8 (the message gives ``name:number``).
    """
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}:{number}: invalid UTF-8 at byte {exc.start} of the line; convert the text to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def buffers(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """``lines`` in consecutive lists of ``size`` (the last one shorter)."""
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def stream_buffers(stream: BinaryIO, size: int, name: str = "<stdin>") -> Iterator[list[str]]:
    """The lines of a byte stream (standard input) in buffers of at most ``size`` lines,
    read incrementally: memory holds one buffer and one unfinished line, whatever the input's size.

    A buffer is handed on when it is full, at the end of the input, and whenever a pipe or
    terminal has no more input waiting: so a line typed at a terminal, or written by a
    program that then waits (``tail -f``), is processed at once instead of when ``size``
    lines have gathered. Lines follow :func:`iter_lines`' rules.

    Raises:
        DataError: a line is not valid UTF-8 (lines before it have been yielded).
    """
    fd = _waitable_fd(stream)
    read = getattr(stream, "read1", stream.read)
    pending, lines, number = bytearray(), [], 0
    while chunk := (os.read(fd, READ_BYTES) if fd is not None else read(READ_BYTES)):
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            number += 1
            lines.append(decode_line(bytes(pending[start:end]), number, name))
            start = end + 1
            if len(lines) == size:
                yield lines
                lines = []
        del pending[:start]
        if lines and fd is not None and not select.select([fd], [], [], 0)[0]:
            yield lines
            lines = []
    if pending:
        lines.append(decode_line(bytes(pending), number + 1, name))
    if lines:
        yield lines


def _waitable_fd(stream) -> int | None:
    """``stream``'s file descriptor if it is a pipe, terminal or socket (where input can pause
    and ``select`` tells whether more is waiting); None for regular files and in-memory streams."""
    if os.name == "nt":  # select works on sockets only there
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode) else None


def count_lines(path: str | Path) -> int:
    """The number of lines :func:`iter_lines` yields for ``path``, checking that all of it is
    UTF-8; decodes 1 MiB blocks, not lines, so it reads about as fast as the disk.

    Raises:
        DataError: as :func:`iter_lines` (an invalid byte is named by file and line).
    """
    path = check_file(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines, last = 0, b"\n"
    with _open_bytes(path) as f:
        while block := f.read(1 << 20):
            try:
                decoder.decode(block)
            except UnicodeDecodeError:
                break
            lines += block.count(b"\n")
            last = block[-1:]
        else:
            try:
                decoder.decode(b"", final=True)
                return lines + (last != b"\n")
            except UnicodeDecodeError:
                pass
    for _ in iter_lines(path):  # raises the error that names the line
        pass
    raise DataError(f"{path}: invalid UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def check_file(path: str | Path) -> Path:
    """``path`` as a Path if it is a regular file. Raises :class:`DataError` naming what it is instead."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file")
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file (a pipe?); nmt reads training text more than once, so give a file")
    return path


def read_lines(path: str | Path) -> list[str]:
    """All lines of ``path`` (rules and errors of :func:`iter_lines`)."""
    return list(iter_lines(path))


@dataclass(frozen=True)
class ParallelText:
    """A parallel corpus that can be read more than once.

    Either two aligned files, streamed (memory independent of their size), or two
    in-memory lists (a Hugging Face dataset, a validation set).
    """

    src_path: Path | None = None
    tgt_path: Path | None = None
    src_lines: list[str] | None = None
    tgt_lines: list[str] | None = None
    name: str = "the in-memory corpus"  # for messages: the two files, or the dataset and split

    @classmethod
    def files(cls, src_path: str | Path, tgt_path: str | Path) -> ParallelText:
        return cls(src_path=Path(src_path), tgt_path=Path(tgt_path), name=f"{src_path} and {tgt_path}")

    @classmethod
    def lists(cls, src: list[str], tgt: list[str], name: str = "the in-memory corpus") -> ParallelText:
        if len(src) != len(tgt):
            raise DataError(f"{name}: {len(src)} source lines but {len(tgt)} target lines: a parallel corpus needs one target line per source line")
        return cls(src_lines=src, tgt_lines=tgt, name=name)

    def _misaligned(self, n_src: int, n_tgt: int) -> DataError:
        return DataError(f"{self.src_path} has {n_src} lines but {self.tgt_path} has {n_tgt}: a parallel corpus needs one target line per source line")

    def check(self) -> int:
        """Read all of the text once and return its number of pairs, without keeping it.

        Raises:
            DataError: as :meth:`pairs`.
        """
        if self.src_path is None:
            return len(self.src_lines)
        n_src, n_tgt = count_lines(self.src_path), count_lines(self.tgt_path)
        if n_src != n_tgt:
            raise self._misaligned(n_src, n_tgt)
        return n_src

    def pairs(self) -> Iterator[tuple[str, str]]:
        """(source, target) lines in order.

        Raises:
            DataError: as :func:`iter_lines`, or the files' line counts differ.
        """
        if self.src_path is None:
            yield from zip(self.src_lines, self.tgt_lines)
            return
        src, tgt = iter_lines(self.src_path), iter_lines(self.tgt_path)
        n = 0
        for s, t in itertools.zip_longest(src, tgt):
            if s is None or t is None:
                n_src = n + (s is not None) + sum(1 for _ in src)
                n_tgt = n + (t is not None) + sum(1 for _ in tgt)
                raise self._misaligned(n_src, n_tgt)
            n += 1
            yield s, t

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        """Consecutive blocks of at most ``size`` pairs, as (source lines, target lines)."""
        pairs = self.pairs()
        while block := list(itertools.islice(pairs, size)):
            src, tgt = zip(*block)
            yield list(src), list(tgt)

    def read(self) -> tuple[list[str], list[str]]:
        """All source and target lines (for small sets: validation, tests)."""
        if self.src_path is None:
            return self.src_lines, self.tgt_lines
        src, tgt = [], []
        for s, t in self.pairs():
            src.append(s)
            tgt.append(t)
        return src, tgt

    def fingerprint(self, digest) -> None:
        """Feed the corpus's content into ``digest`` (a hashlib object): file bytes, or lines.

        Every line and file is preceded by its length in bytes (and the lists by their
        lengths), so no two different corpora feed the same bytes: ``["a\nb"]`` and
        ``["a", "b"]`` differ, as lines may contain any character.
        """
        if self.src_path is None:
            for lines in (self.src_lines, self.tgt_lines):
                digest.update(len(lines).to_bytes(8, "little"))
                for line in lines:
                    data = line.encode("utf-8", "surrogatepass")
                    digest.update(len(data).to_bytes(8, "little"))
                    digest.update(data)
            return
        for path in (self.src_path, self.tgt_path):
            digest.update(path.stat().st_size.to_bytes(8, "little"))  # sizes first: no two file pairs hash alike
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
            digest.update(b"\0")


def check_inputs(train: ParallelText, valid: ParallelText) -> None:
    """Read every input file (both splits, both sides) before a run writes anything.

    Finds in one fast pass what would otherwise stop a run after its tokenizer is trained
    and its training set encoded: missing, unreadable or non-UTF-8 files, line counts that
    differ, a validation set with no pair that has text on both sides.

    Raises:
        DataError: naming the file and line, or the two files of a split.
    """
    train.check()
    valid.check()
    vsrc, _, report = strip_pairs(*valid.read())
    if not vsrc:
        raise DataError(f"the validation set ({valid.name}) has no pair with text on both sides ({report}); check those files")


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Read two aligned files. Raises :class:`DataError` if their line counts differ."""
    return ParallelText.files(src_path, tgt_path).read()


def find_split_file(directory: str | Path, split: str, lang: str) -> Path:
    """``{directory}/{split}.{lang}`` or its ``.gz``. Raises :class:`DataError` if neither exists."""
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        path = Path(directory) / name
        if path.is_file():
            return path
    raise DataError(f"{directory}: neither {split}.{lang} nor {split}.{lang}.gz exists")


def load_hf_split(name: str, config: str | None, data_files: dict[str, str] | None, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Read a split through ``datasets.load_dataset``; rows carry ``translation[lang]``.

    Raises:
        DataError: the dataset has no such split or no ``translation`` column for the languages.
    """
    import datasets

    try:
        ds = datasets.load_dataset(name, config, data_files=data_files, split=split)
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"dataset {name!r} split {split!r}: {exc}") from None
    if "translation" not in ds.column_names:
        raise DataError(f"dataset {name!r} split {split!r}: no 'translation' column (columns: {ds.column_names})")
    rows = ds["translation"]
    try:
        return [r[src_lang] or "" for r in rows], [r[tgt_lang] or "" for r in rows]
    except (KeyError, TypeError):
        raise DataError(f"dataset {name!r} split {split!r}: translation entries need keys {src_lang!r} and {tgt_lang!r}") from None


def load_split(cfg, split: str) -> ParallelText:
    """The ``split`` ("train" or "valid") that ``cfg`` (a DataConfig) names. Files are not read yet.

    Raises:
        DataError: no source is configured, a file is missing, a dataset cannot be loaded.
    """
    explicit = (cfg.train_src, cfg.train_tgt) if split == "train" else (cfg.valid_src, cfg.valid_tgt)
    if explicit[0] and explicit[1]:
        return ParallelText.files(*(check_file(path) for path in explicit))
    if cfg.hf_dataset:
        name = cfg.train_split if split == "train" else cfg.valid_split
        return ParallelText.lists(*load_hf_split(cfg.hf_dataset, cfg.hf_config, cfg.hf_data_files, name, cfg.src_lang, cfg.tgt_lang), name=f"dataset {cfg.hf_dataset!r} split {name!r}")
    if cfg.dir:
        name = cfg.train_split if split == "train" else cfg.valid_split
        return ParallelText.files(find_split_file(cfg.dir, name, cfg.src_lang), find_split_file(cfg.dir, name, cfg.tgt_lang))
    raise DataError(f"no {split} data configured: set data.dir, data.{split}_src/{split}_tgt or data.hf_dataset")


# --------------------------------------------------------------------------- cleaning


@dataclass
class CleanReport:
    total: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long - self.bad_ratio

    def add(self, other: CleanReport) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def __str__(self) -> str:
        return f"{self.kept}/{self.total} pairs kept ({self.empty} with a side of no pieces, {self.too_long} over max_len, {self.bad_ratio} over max_len_ratio)"


def strip_pairs(src: list[str], tgt: list[str]) -> tuple[list[str], list[str], CleanReport]:
    """Strip whitespace and drop pairs with a blank side: the rule before a tokenizer exists
    (the text it trains on); with one, :func:`clean_pairs` decides by pieces."""
    report = CleanReport(total=len(src))
    out_src, out_tgt = [], []
    for s, t in zip(src, tgt):
        s, t = s.strip(), t.strip()
        if not s or not t:
            report.empty += 1
            continue
        out_src.append(s)
        out_tgt.append(t)
    return out_src, out_tgt, report


# Why encode_rows dropped a pair (one int8 a pair in the cache: the cleaning counts come from it).
KEPT, EMPTY, TOO_LONG, BAD_RATIO = 0, 1, 2, 3


def encode_rows(tokenizer: Tokenizer, src: list[str], tgt: list[str], max_len: int | None = None, max_len_ratio: float | None = None, threads: int = -1) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    """Piece ids of every pair, and why each pair is dropped (:data:`KEPT` if it is not).

    A pair is :data:`EMPTY` when a side has no pieces. Lines are encoded as they are, as
    ``nmt translate`` encodes them: SentencePiece's normalisation removes leading, trailing
    and repeated whitespace itself, and a line of only U+200B (not blank to ``str.strip``)
    has no pieces either. With ``max_len``, a pair is :data:`TOO_LONG` when a side has more
    than ``max_len`` pieces, and :data:`BAD_RATIO` when the longer side has more than
    ``max_len_ratio`` times the pieces of the shorter.

    Returns:
        source ids, target ids (one list a pair, in order) and the reasons, int8 ``(n,)``.
    """
    src_ids, tgt_ids = tokenizer.encode_src(src, threads), tokenizer.encode_tgt(tgt, threads)
    s = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))
    t = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))
    reason = np.where((s == 0) | (t == 0), EMPTY, KEPT).astype(np.int8)
    if max_len is not None:
        reason[(reason == KEPT) & ((s > max_len) | (t > max_len))] = TOO_LONG
        if max_len_ratio:
            reason[(reason == KEPT) & (np.maximum(s, t) > max_len_ratio * np.maximum(1, np.minimum(s, t)))] = BAD_RATIO
    return src_ids, tgt_ids, reason


def report_of(reason: np.ndarray) -> CleanReport:
    """The cleaning counts of :func:`encode_rows`'s reasons."""
    counts = np.bincount(reason, minlength=4)
    return CleanReport(total=len(reason), empty=int(counts[EMPTY]), too_long=int(counts[TOO_LONG]), bad_ratio=int(counts[BAD_RATIO]))


@dataclass
class CleanPairs:
    """Pairs kept by :func:`clean_pairs`: stripped lines, their piece ids, and the counts."""

    src: list[str]
    tgt: list[str]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    report: CleanReport


def clean_pairs(tokenizer: Tokenizer, src: list[str], tgt: list[str], threads: int = -1) -> CleanPairs:
    """Tokenize, and drop every pair with a side of no pieces (:func:`encode_rows`, no length
    filter). The kept text is stripped; dropped pairs are counted in ``report.empty``."""
    src_ids, tgt_ids, reason = encode_rows(tokenizer, src, tgt, threads=threads)
    keep = (reason == KEPT).tolist()
    src, tgt, src_ids, tgt_ids = (list(itertools.compress(x, keep)) for x in (src, tgt, src_ids, tgt_ids))
    return CleanPairs([s.strip() for s in src], [t.strip() for t in tgt], src_ids, tgt_ids, report_of(reason))


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
        raise DataError("the training data has no pair with text on both sides; check the training files")


# --------------------------------------------------------------------------- encoding


class EncodedCorpus:
    """Token ids of the kept pairs of a parallel corpus, read without copying.

    Each side is a list of blocks ``(ids, offsets)``: in a cache, the Arrow record batches of
    a ``list<int32>`` column, memory-mapped (``datasets`` writes them); in memory, one block.
    Example ``i`` is row ``rows[i]`` (all rows when ``rows`` is None), whose ids are
    ``ids[offsets[j]:offsets[j + 1]]`` of its block, ``j`` its row within the block (no EOS yet).
    """

    def __init__(self, src_blocks: list[tuple[np.ndarray, np.ndarray]], tgt_blocks: list[tuple[np.ndarray, np.ndarray]], rows: np.ndarray | None = None, key: str = ""):
        self.src_blocks, self.tgt_blocks, self.rows, self.key = src_blocks, tgt_blocks, rows, key  # key: the cache key
        sizes = [len(offsets) - 1 for _, offsets in src_blocks]
        self.starts = np.zeros(len(sizes) + 1, dtype=np.int64)  # first row of each block
        np.cumsum(sizes, out=self.starts[1:])
        self.src_lengths, self.tgt_lengths = (self._lengths(blocks) for blocks in (src_blocks, tgt_blocks))

    def _lengths(self, blocks: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Pieces per example plus one (EOS, or BOS on the decoder input), int64 ``(n,)``."""
        lengths = np.concatenate([np.diff(offsets) for _, offsets in blocks] or [np.zeros(0, np.int64)]).astype(np.int64) + 1
        return lengths if self.rows is None else lengths[self.rows]

    def __len__(self) -> int:
        return len(self.src_lengths)

    def _ids(self, blocks: list[tuple[np.ndarray, np.ndarray]], i: int) -> np.ndarray:
        row = int(i if self.rows is None else self.rows[i])
        block = int(np.searchsorted(self.starts, row, side="right")) - 1
        ids, offsets = blocks[block]
        j = row - int(self.starts[block])
        return ids[offsets[j] : offsets[j + 1]]

    def src(self, i: int) -> np.ndarray:
        """Source piece ids of example ``i``, int32 ``(src_len - 1,)``."""
        return self._ids(self.src_blocks, i)

    def tgt(self, i: int) -> np.ndarray:
        """Target piece ids of example ``i``, int32 ``(tgt_len - 1,)``."""
        return self._ids(self.tgt_blocks, i)

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]]) -> EncodedCorpus:
        """One in-memory block of every pair given."""
        return cls([_flatten(src)], [_flatten(tgt)])

    @classmethod
    def from_table(cls, table, key: str = "") -> tuple[EncodedCorpus, CleanReport]:
        """The kept pairs of an Arrow table written by :func:`encode_corpus` (columns
        ``src_ids``, ``tgt_ids``: ``list<int32>``; ``reason``: int8), and its cleaning counts.

        Raises:
            ValueError: the table does not hold such columns (a damaged or foreign cache).
        """
        import pyarrow as pa

        def blocks(name: str) -> list[tuple[np.ndarray, np.ndarray]]:
            column = table.column(name)
            if column.type != pa.list_(pa.int32()):
                raise ValueError(f"column {name} is {column.type}, not list<int32>")
            return [(chunk.values.to_numpy(), chunk.offsets.to_numpy()) for chunk in column.chunks if len(chunk)]

        reason = table.column("reason").to_numpy().astype(np.int8, copy=False)
        kept = reason == KEPT
        corpus = cls(blocks("src_ids"), blocks("tgt_ids"), None if kept.all() else np.flatnonzero(kept), key)
        if len(corpus.starts) - 1 and corpus.starts[-1] != len(reason):
            raise ValueError("columns of different lengths")
        return corpus, report_of(reason)


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, offsets)``: the sequences back to back (int32) and where each starts (int64, ``(n + 1,)``)."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return ids, offsets


_worker_tokenizers: dict[bytes, Tokenizer] = {}
_watched_parent: int | None = None
_encoding_parent: int | None = None  # while encode_corpus maps: its process id, inherited by forked children


def _watch_parent(parent: int) -> None:
    """In a child of ``parent`` (the encoder process, or one of its pool workers): exit when the
    parent is gone, even killed with SIGKILL (a pool worker would otherwise wait on its task
    queue forever: forked siblings keep the queue open). Portable; on Linux
    :func:`_die_with_parent` also asks the kernel."""
    global _watched_parent
    if parent == os.getpid() or _watched_parent == parent:
        return
    _watched_parent = parent

    def exit_with_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()


def _die_with_parent(parent: int | None = None) -> None:
    """In a child of an encoding process (at fork, or at the start of the encoder process):
    ask the kernel (Linux) for SIGKILL when the parent dies. This reaches the processes that
    run none of nmt's code, such as the ``multiprocess`` manager that ``datasets`` starts."""
    parent = parent or _encoding_parent
    if parent is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the workers' own watch remains
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_die_with_parent)


def _encode_batch(table, protos: dict[str, bytes], max_len: int | None, max_len_ratio: float | None, parent: int):
    """``datasets.Dataset.map`` function: a block of text pairs (columns ``src``, ``tgt``) as
    ``list<int32>`` id columns and the int8 ``reason`` of :func:`encode_rows`. A dropped pair
    keeps its row, with no ids, so that its reason is counted. ``parent``: the encoding
    process's id (:func:`_watch_parent` in a worker)."""
    import pyarrow as pa

    _watch_parent(parent)
    digest = hashlib.sha1(b"".join(protos[k] for k in sorted(protos))).digest()
    if digest not in _worker_tokenizers:  # one tokenizer a process, loaded once
        _worker_tokenizers.clear()
        _worker_tokenizers[digest] = Tokenizer.from_protos(protos)
    tokenizer = _worker_tokenizers[digest]
    src_ids, tgt_ids, reason = encode_rows(tokenizer, table.column("src").to_pylist(), table.column("tgt").to_pylist(), max_len, max_len_ratio, threads=1)
    dropped = np.flatnonzero(reason != KEPT)
    for i in dropped:
        src_ids[i] = tgt_ids[i] = []

    def column(seqs: list[list[int]]):
        ids, offsets = _flatten(seqs)
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids, type=pa.int32()))

    return pa.table({"src_ids": column(src_ids), "tgt_ids": column(tgt_ids), "reason": pa.array(reason, type=pa.int8())})


def _ids_features():
    """The cache's columns, as ``datasets`` features."""
    import datasets

    ids = datasets.List(datasets.Value("int32")) if hasattr(datasets, "List") else datasets.Sequence(datasets.Value("int32"))
    return datasets.Features({"src_ids": ids, "tgt_ids": ids, "reason": datasets.Value("int8")})


def _text_rows(text: ParallelText) -> Iterator[dict[str, str]]:
    for s, t in text.pairs():
        yield {"src": s, "tgt": t}


def cache_key(text: ParallelText, tokenizer: Tokenizer, max_len: int | None, max_len_ratio: float | None) -> str:
    """16 hex digits hashing :data:`CACHE_FORMAT`, the text (file bytes or lines, length-prefixed),
    the tokenizer and the filter settings: equal keys mean equal encodings."""
    key = hashlib.sha1(f"nmt encoded corpus, format {CACHE_FORMAT}\0".encode())
    for proto in tokenizer.protos().values():
        key.update(len(proto).to_bytes(8, "little"))
        key.update(proto)
    key.update(repr((max_len, max_len_ratio)).encode())
    text.fingerprint(key)
    return key.hexdigest()[:16]


def encode_corpus(
    text: ParallelText,
    tokenizer: Tokenizer,
    cache_dir: Path | None,
    max_len: int | None = None,
    max_len_ratio: float | None = None,
    write: bool = True,
    workers: int = 1,
    chunk_lines: int = CHUNK_LINES,
) -> tuple[EncodedCorpus, CleanReport]:
    """Encode and (with ``max_len``) length-filter a parallel corpus (:func:`encode_rows`) into
    an Arrow cache written by the ``datasets`` library.

    The text is streamed into a ``datasets.Dataset`` (``Dataset.from_generator``), which
    ``Dataset.map`` encodes in blocks of ``chunk_lines`` pairs, in ``workers`` processes when
    there is more than one block (``num_proc``). The result does not depend on ``workers``.
    The text's own Arrow copy is deleted once the ids are written, so the cache holds only
    ids (4 bytes a piece, 9 bytes a pair).

    The cache directory ``cache_dir/KEY`` (:func:`cache_key`) appears only when complete
    (written under a temporary name, then renamed); a later run on the same input maps its
    files read-only without tokenizing. ``write=False`` reads the cache but never writes
    it; without a cache (or with ``write=False`` on a miss) the ids are held in memory.

    Raises:
        DataError: unreadable text or line counts that differ (nothing is left behind), or
            the cache cannot be written.
    """
    name = cache_key(text, tokenizer, max_len, max_len_ratio)
    path = cache_dir / name if cache_dir is not None else None
    if cache_dir is not None and cache_dir.is_dir():
        _remove_stale_temporaries(cache_dir)
    _remove_stale_temporaries(Path(tempfile.gettempdir()), f"{_UNCACHED}.tmp-*")
    if path is not None and (path.is_dir() or path.is_symlink() or path.exists()):
        cached = _load_cache(path)
        if cached is not None:
            return cached
    keep = path is not None and write
    try:
        if keep:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(name), dir=path.parent))
        else:  # held in memory once read; named like a cache's temporary, so a killed run's copy is swept
            tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(_UNCACHED)))
    except OSError as exc:
        raise DataError(f"cannot write the encoded corpus under {path.parent if keep else tempfile.gettempdir()} ({exc.strerror or exc}); free some space or set data.cache_dir elsewhere") from None
    try:
        try:
            _encode_into(tmp, name, text, tokenizer, max_len, max_len_ratio, workers, chunk_lines)
        except OSError as exc:
            raise DataError(f"cannot write the encoded corpus under {tmp.parent} ({exc.strerror or exc}); free some space or set data.cache_dir elsewhere") from None
        if not keep:
            return _open(tmp, name, in_memory=True)
        try:
            os.replace(tmp, path)
        except OSError:  # another process finished the same cache first (theirs is identical), or path is not a cache
            cached = _load_cache(path)  # moves anything but a complete cache aside
            if cached is not None:
                return cached
            os.replace(tmp, path)
        return _open(path, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _encode_into(directory: Path, name: str, text: ParallelText, tokenizer: Tokenizer, max_len, max_len_ratio, workers: int, chunk_lines: int) -> None:
    """Write ``directory/ids*.arrow`` and, last, ``report.json``.

    With ``workers > 1`` and more than one block of text, the work runs in an encoder
    process (spawned) whose ``map`` forks ``workers`` processes. The encoder and its
    children ignore Ctrl-C: an interrupt reaches this process only, which kills the encoder
    (and the kernel its children). Interrupting ``multiprocess``' pool in the middle of its
    own bookkeeping instead hung it about one time in fourteen.
    """
    protos = tokenizer.protos()
    first_pairs = sum(1 for _ in itertools.islice(text.pairs(), chunk_lines + 1))
    if first_pairs == 0:  # datasets makes no dataset of no rows: write the empty table itself
        from datasets.arrow_writer import ArrowWriter

        with ArrowWriter(features=_ids_features(), path=str(directory / "ids.arrow")) as writer:
            writer.finalize()
    elif workers > 1 and first_pairs > chunk_lines:
        _in_encoder_process(directory, name, text, protos, max_len, max_len_ratio, workers, chunk_lines)
    else:
        _map_to_arrow(directory, name, text, protos, max_len, max_len_ratio, 1, chunk_lines)
    corpus, report = _open(directory, name)
    del corpus
    _write_synced(directory / "report.json", json.dumps(asdict(report)))  # written last: marks a complete cache


def _map_to_arrow(directory: Path, name: str, text: ParallelText, protos: dict[str, bytes], max_len, max_len_ratio, workers: int, chunk_lines: int) -> None:
    """``Dataset.from_generator`` over the text, then ``map`` (``num_proc=workers`` when above 1)
    writing ``directory/ids*.arrow``; the text's own Arrow copy is deleted after."""
    import datasets
    from datasets.exceptions import DatasetGenerationError

    datasets.disable_progress_bars()
    text_dir = directory / "text"
    features = datasets.Features({"src": datasets.Value("string"), "tgt": datasets.Value("string")})
    try:
        rows = datasets.Dataset.from_generator(_text_rows, features=features, gen_kwargs={"text": text}, cache_dir=str(text_dir), fingerprint=f"{name}-text")
    except DatasetGenerationError as exc:  # reading the text failed: report the reader's own error
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (DataError, OSError)):
            raise cause from None
        raise
    global _encoding_parent
    _encoding_parent = os.getpid()
    try:
        rows.with_format("arrow").map(
            _encode_batch,
            batched=True,
            batch_size=chunk_lines,
            writer_batch_size=chunk_lines,
            num_proc=workers if workers > 1 else None,
            remove_columns=["src", "tgt"],
            fn_kwargs={"protos": protos, "max_len": max_len, "max_len_ratio": max_len_ratio, "parent": os.getpid()},
            cache_file_name=str(directory / "ids.arrow"),
            new_fingerprint=name,
            features=_ids_features(),
        )
    finally:
        _encoding_parent = None
    del rows
    shutil.rmtree(text_dir)  # the ids are written; the text's Arrow copy is not needed again


def _encoder_job(connection, parent: int) -> None:
    """The encoder process: receives :func:`_map_to_arrow`'s arguments through ``connection``,
    and sends back ``None`` or the error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C; forked workers inherit this
    _die_with_parent(parent)
    _watch_parent(parent)
    try:
        _map_to_arrow(*connection.recv())
        connection.send(None)
    except BaseException as exc:  # noqa: BLE001 - every error goes to the parent, which raises it
        try:
            connection.send(exc)
        except Exception:  # noqa: BLE001 - an error that does not pickle
            connection.send(RuntimeError(f"{type(exc).__name__}: {exc}"))


def _in_encoder_process(*args) -> None:
    """Run :func:`_map_to_arrow` in a spawned process; its error is raised here.

    The arguments (the tokenizer alone is hundreds of KB) go through a pipe after the start,
    not as the process's start-up data: a child that dies while starting (out of memory, a
    script without an ``if __name__ == "__main__":`` guard) then gives an error here, not a
    parent blocked forever on a full pipe.

    Raises:
        DataError: as :func:`_map_to_arrow`, or the process died.
        KeyboardInterrupt: after killing the encoder (and, through the kernel, its workers).
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # not fork: this process may run threads (OpenMP, CUDA)
    ours, theirs = context.Pipe()
    process = context.Process(target=_encoder_job, args=(theirs, os.getpid()), name="nmt-encoder")
    process.start()
    theirs.close()
    try:
        try:
            ours.send(args)
            message = ours.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            process.join()
            message = DataError(f"the encoding process died (exit code {process.exitcode}): out of memory (lower data.workers), or a script "
                                "that calls nmt without an `if __name__ == \"__main__\":` guard (multiprocessing's spawn imports the script again)")
        process.join()
    except BaseException:
        process.kill()
        process.join()
        raise
    if message is not None:
        raise message


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` and flush it, and every Arrow file beside it, to disk (before the rename)."""
    for arrow in path.parent.glob("*.arrow"):
        with open(arrow, "rb") as f:
            os.fsync(f.fileno())
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _open(directory: Path, name: str, in_memory: bool = False) -> tuple[EncodedCorpus, CleanReport]:
    """The corpus in ``directory``'s Arrow files (memory-mapped unless ``in_memory``), in the
    order ``datasets`` wrote them (``ids.arrow``, or ``ids_00000_of_0000N.arrow``...)."""
    import datasets

    files = sorted(directory.glob("ids*.arrow"))
    if not files:
        raise ValueError("no Arrow files")
    tables = [datasets.Dataset.from_file(str(f), in_memory=in_memory).data.table for f in files]
    import pyarrow as pa

    return EncodedCorpus.from_table(pa.concat_tables(tables) if len(tables) > 1 else tables[0], key=name)


def _load_cache(path: Path) -> tuple[EncodedCorpus, CleanReport] | None:
    """The cache at ``path``, or None (after moving it out of the way) if it is incomplete or damaged."""
    try:
        expected = CleanReport(**json.loads((path / "report.json").read_text()))
        corpus, report = _open(path, path.name)
        if report != expected:
            raise ValueError(f"its counts {report} are not the recorded {expected}")
    except (OSError, ValueError, TypeError, KeyError, IndexError, json.JSONDecodeError) as exc:  # pyarrow's errors are ValueError or OSError
        log.warning("cache %s is damaged (%s); encoding again", path, exc)
        trash = path.with_name(f"{_temporary_prefix(path.name)}damaged")
        try:
            os.replace(path, trash)
        except OSError:
            pass
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)
        return None
    return corpus, report


def _temporary_prefix(name: str) -> str:
    """``KEY.tmp-HOST-PID-``: a cache directory may be shared between machines (a network
    file system), so a writer is named by host as well as by process."""
    return f"{name}.tmp-{_HOST}-{os.getpid()}-"


_UNCACHED = "nmt-encode"  # the temporary directory of an encoding that no cache keeps
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "unknown"
_TEMPORARY = re.compile(r"\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-[^/]*$")


def _remove_stale_temporaries(directory: Path, pattern: str = "*.tmp-*") -> None:
    """Delete the temporary directories matching ``pattern`` in ``directory`` (a cache
    directory, or the system's temporary directory) that this machine's killed runs left.

    Only this host's are judged: a process id means nothing on another machine, whose
    work in progress in a shared cache directory must survive.
    """
    for tmp in directory.glob(pattern):
        match = _TEMPORARY.search(tmp.name)
        if match is None or match["host"] != _HOST:
            continue
        try:
            os.kill(int(match["pid"]), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def encoding_workers(requested: int = 0) -> int:
    """Processes for encoding: ``requested`` (``data.workers``) up to the usable CPUs, or for
    0 the usable CPUs, at most 16. More processes than CPUs would only hold more blocks in memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(requested, cpus) if requested else min(16, cpus))
