"""Parallel text on disk: reading, cleaning, and encoding into a memory-mapped id cache.

Text files are streamed line by line and encoded in chunks by several processes, so
memory does not grow with the corpus: a 4.5-million-pair corpus is encoded into flat
``.npy`` arrays that training then reads through ``numpy.memmap`` (see
``docs/performance.md``, "Data at scale"). This module needs no torch; batching lives in
:mod:`nmt.data`.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import hashlib
import itertools
import json
import logging
import multiprocessing
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
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
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
    def files(cls, src_path: str | Path, tgt_path: str | Path) -> "ParallelText":
        return cls(src_path=Path(src_path), tgt_path=Path(tgt_path), name=f"{src_path} and {tgt_path}")

    @classmethod
    def lists(cls, src: list[str], tgt: list[str], name: str = "the in-memory corpus") -> "ParallelText":
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

    def add(self, other: "CleanReport") -> None:
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


@dataclass
class CleanPairs:
    """Pairs kept by :func:`clean_pairs`: stripped lines, their piece ids, and the counts."""

    src: list[str]
    tgt: list[str]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    report: CleanReport


def clean_pairs(tokenizer: Tokenizer, src: list[str], tgt: list[str], threads: int = -1) -> CleanPairs:
    """Tokenize, and drop every pair with an empty side, where empty means no pieces.

    Lines are encoded as they are, as ``nmt translate`` encodes them: SentencePiece's
    normalisation removes leading, trailing and repeated whitespace itself, and a line of
    only U+200B (not blank to ``str.strip``) has no pieces either. The kept text is
    stripped. Dropped pairs are counted in ``report.empty``.
    """
    src_ids, tgt_ids = tokenizer.encode_src(src, threads), tokenizer.encode_tgt(tgt, threads)
    keep = [bool(s) and bool(t) for s, t in zip(src_ids, tgt_ids)]
    report = CleanReport(total=len(src), empty=keep.count(False))
    if report.empty:
        src, tgt, src_ids, tgt_ids = (list(itertools.compress(x, keep)) for x in (src, tgt, src_ids, tgt_ids))
    return CleanPairs([s.strip() for s in src], [t.strip() for t in tgt], src_ids, tgt_ids, report)


def stripped_side(text: ParallelText, side: int) -> Iterator[str]:
    """The stripped source (``side`` 0) or target (1) line of every pair with text on both sides.

    Raises:
        DataError: as :meth:`ParallelText.pairs`, or no pair has text on both sides.
    """
    kept = 0
    for block in text.chunks(CHUNK_LINES):  # encoding then decides by pieces (clean_pairs)
        lines = strip_pairs(*block)[side]
        kept += len(lines)
        yield from lines
    if kept == 0:
        raise DataError("the training data has no pair with text on both sides; check the training files")


# --------------------------------------------------------------------------- encoding


@dataclass
class EncodedCorpus:
    """Token ids of a parallel corpus in two flat arrays with offsets (memory-mappable).

    Example ``i`` is ``src_ids[src_offsets[i]:src_offsets[i+1]]`` (no EOS yet). Ids are
    int32, offsets int64: 4 bytes a piece plus 16 bytes a pair on disk.
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    key: str = ""  # cache key: a hash of the text, tokenizer and filters

    FILES = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        """Pieces per source sentence plus EOS, shape ``(n,)``."""
        return np.diff(self.src_offsets) + 1

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Pieces per target sentence plus BOS (input) or EOS (output), shape ``(n,)``."""
        return np.diff(self.tgt_offsets) + 1

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]]) -> "EncodedCorpus":
        (src_ids, src_lengths), (tgt_ids, tgt_lengths) = _flatten(src), _flatten(tgt)
        return cls(src_ids, _offsets([src_lengths]), tgt_ids, _offsets([tgt_lengths]))

    @classmethod
    def load(cls, directory: Path, key: str, mmap: bool = True) -> "EncodedCorpus":
        """Open a cache directory; ``mmap`` maps the files instead of reading them into memory."""
        return cls(*(np.load(directory / f"{n}.npy", mmap_mode="r" if mmap else None) for n in cls.FILES), key=key)


def _flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
    return ids, lengths


def _offsets(lengths: list[np.ndarray]) -> np.ndarray:
    total = sum(len(x) for x in lengths)
    offsets = np.zeros(total + 1, dtype=np.int64)
    if total:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    return offsets


@dataclass
class _Chunk:
    """One encoded block: flat ids and per-pair lengths of the kept pairs, and its cleaning counts."""

    src_ids: np.ndarray
    src_lengths: np.ndarray
    tgt_ids: np.ndarray
    tgt_lengths: np.ndarray
    report: CleanReport


def encode_chunk(tokenizer: Tokenizer, src: list[str], tgt: list[str], max_len: int | None, max_len_ratio: float | None, threads: int = -1) -> _Chunk:
    """Clean (:func:`clean_pairs`), encode and length-filter one block of pairs.

    A pair is dropped when a side has more than ``max_len`` pieces, or when the longer
    side exceeds ``max_len_ratio`` times the shorter (both only if ``max_len`` is set).
    """
    cleaned = clean_pairs(tokenizer, src, tgt, threads)
    src_ids, tgt_ids, report = cleaned.src_ids, cleaned.tgt_ids, cleaned.report
    s = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))
    t = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))
    if max_len is not None and len(s):
        too_long = (s > max_len) | (t > max_len)
        bad_ratio = ~too_long & (np.maximum(s, t) > max_len_ratio * np.maximum(1, np.minimum(s, t))) if max_len_ratio else np.zeros_like(too_long)
        report.too_long, report.bad_ratio = int(too_long.sum()), int(bad_ratio.sum())
        keep = ~(too_long | bad_ratio)
        if not keep.all():
            src_ids = list(itertools.compress(src_ids, keep))
            tgt_ids = list(itertools.compress(tgt_ids, keep))
    (si, sl), (ti, tl) = _flatten(src_ids), _flatten(tgt_ids)
    return _Chunk(si, sl, ti, tl, report)


_worker_tokenizer: Tokenizer | None = None


def _start_worker(protos: dict[str, bytes]) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.from_protos(protos)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops the pool
    parent = os.getppid()

    def exit_with_parent() -> None:  # a parent killed with SIGKILL cannot stop its pool
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()


def _encode_in_worker(src: list[str], tgt: list[str], max_len: int | None, max_len_ratio: float | None) -> _Chunk:
    return encode_chunk(_worker_tokenizer, src, tgt, max_len, max_len_ratio, threads=1)


class _ArrayFile:
    """A 1-D ``.npy`` file written by appending, its length set in the header at the end."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype, self.length = path, np.dtype(dtype), 0
        self.file = open(path, "wb")
        self.header_bytes = self._header()

    def _header(self) -> int:
        self.file.seek(0)
        np.lib.format.write_array_header_1_0(self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (self.length,)})
        return self.file.tell()

    def append(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.length += len(values)

    def close(self) -> None:
        # numpy pads the header to a fixed size (room for growth), so rewriting it in place is safe
        if self._header() != self.header_bytes:
            raise RuntimeError(f"{self.path}: .npy header changed size; cannot finalise in place")
        self.file.flush()
        os.fsync(self.file.fileno())  # on disk before the directory is renamed into place
        self.file.close()


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
    """Strip, encode and (with ``max_len``) length-filter a parallel corpus into a cache.

    The text is read in blocks of ``chunk_lines`` pairs; with ``workers > 1`` and more
    than one block, ``workers`` processes encode blocks in parallel (at most two blocks
    a worker in flight, so memory stays flat) and the main process appends their ids, in
    order, to ``.npy`` files. The result does not depend on ``workers``.

    The cache key hashes :data:`CACHE_FORMAT`, the text (file bytes or lines), the
    tokenizer and the filter settings; a later run on the same input maps ``cache_dir/KEY`` read-only without
    tokenizing. A cache directory appears only when complete (written under a temporary
    name, then renamed). ``write=False`` reads the cache but never writes it; without a
    cache (or with ``write=False`` on a miss) the ids are held in memory.

    Raises:
        DataError: unreadable text or line counts that differ (nothing is left behind).
    """
    key = hashlib.sha1(f"nmt encoded corpus, format {CACHE_FORMAT}\0".encode())
    for proto in tokenizer.protos().values():
        key.update(len(proto).to_bytes(8, "little"))
        key.update(proto)
    key.update(repr((max_len, max_len_ratio)).encode())
    text.fingerprint(key)
    name = key.hexdigest()[:16]
    path = cache_dir / name if cache_dir is not None else None
    if cache_dir is not None and cache_dir.is_dir():
        _remove_stale_temporaries(cache_dir)
    if path is not None and path.is_dir():
        cached = _load_cache(path)
        if cached is not None:
            return cached
    keep = path is not None and write
    if keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(name), dir=path.parent))
    else:
        tmp = Path(tempfile.mkdtemp(prefix="nmt-encode-"))
    try:
        try:
            report = _encode_into(tmp, text, tokenizer, max_len, max_len_ratio, workers, chunk_lines)
        except OSError as exc:
            raise DataError(f"cannot write the encoded corpus under {tmp.parent} ({exc.strerror or exc}); free some space or set data.cache_dir elsewhere") from None
        except BrokenProcessPool:
            raise DataError("an encoding worker process died (out of memory?); lower data.workers") from None
        if not keep:
            return EncodedCorpus.load(tmp, name, mmap=False), report
        try:
            os.replace(tmp, path)
        except OSError:  # another process finished the same cache first; theirs is identical
            pass
        return EncodedCorpus.load(path, name), report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_cache(path: Path) -> tuple[EncodedCorpus, CleanReport] | None:
    """The cache at ``path``, or None (after moving it out of the way) if it is incomplete or damaged."""
    try:
        report = CleanReport(**json.loads((path / "report.json").read_text()))
        corpus = EncodedCorpus.load(path, path.name)
        if corpus.src_offsets[-1] != len(corpus.src_ids) or corpus.tgt_offsets[-1] != len(corpus.tgt_ids) or len(corpus.src_offsets) != len(corpus.tgt_offsets):
            raise ValueError("offsets and ids disagree")
    except (OSError, ValueError, TypeError, IndexError, json.JSONDecodeError) as exc:
        log.warning("cache %s is damaged (%s); encoding again", path, exc)
        trash = path.with_name(f"{_temporary_prefix(path.name)}damaged")
        try:
            os.replace(path, trash)
        except OSError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
        return None
    return corpus, report


def _temporary_prefix(name: str) -> str:
    """``KEY.tmp-HOST-PID-``: a cache directory may be shared between machines (a network
    file system), so a writer is named by host as well as by process."""
    return f"{name}.tmp-{_HOST}-{os.getpid()}-"


_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "unknown"
_TEMPORARY = re.compile(r"\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-[^/]*$")


def _remove_stale_temporaries(cache_dir: Path) -> None:
    """Delete temporary directories that this machine's killed runs left behind.

    Only this host's are judged: a process id means nothing on another machine, whose
    work in progress in a shared ``cache_dir`` must survive.
    """
    for tmp in cache_dir.glob("*.tmp-*"):
        match = _TEMPORARY.search(tmp.name)
        if match is None or match["host"] != _HOST:
            continue
        try:
            os.kill(int(match["pid"]), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def _encode_into(directory: Path, text: ParallelText, tokenizer: Tokenizer, max_len, max_len_ratio, workers: int, chunk_lines: int) -> CleanReport:
    files = {"src_ids": _ArrayFile(directory / "src_ids.npy", np.int32), "tgt_ids": _ArrayFile(directory / "tgt_ids.npy", np.int32)}
    lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    report = CleanReport()

    def add(chunk: _Chunk) -> None:
        files["src_ids"].append(chunk.src_ids)
        files["tgt_ids"].append(chunk.tgt_ids)
        lengths["src"].append(chunk.src_lengths)
        lengths["tgt"].append(chunk.tgt_lengths)
        report.add(chunk.report)

    try:
        blocks = text.chunks(chunk_lines)
        first = next(blocks, None)
        second = next(blocks, None) if first is not None else None
        blocks = itertools.chain([b for b in (first, second) if b is not None], blocks)
        if workers > 1 and second is not None:
            # spawn, not fork: the parent may already run threads (OpenMP, NCCL, CUDA)
            context = multiprocessing.get_context("spawn")
            pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(tokenizer.protos(),))
            try:
                pending = deque()
                for src, tgt in blocks:
                    pending.append(pool.submit(_encode_in_worker, src, tgt, max_len, max_len_ratio))
                    if len(pending) >= 2 * workers:
                        add(pending.popleft().result())
                while pending:
                    add(pending.popleft().result())
            except BaseException:  # an error or an interrupt: drop queued blocks, let running ones end (about a second)
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            pool.shutdown()
        else:
            for src, tgt in blocks:  # one process; SentencePiece's own threads, as many as workers
                add(encode_chunk(tokenizer, src, tgt, max_len, max_len_ratio, threads=max(1, workers)))
    finally:
        for f in files.values():
            f.close()
    for side in ("src", "tgt"):
        with open(directory / f"{side}_offsets.npy", "wb") as f:
            np.save(f, _offsets(lengths[side]))
            f.flush()
            os.fsync(f.fileno())
    (directory / "report.json").write_text(json.dumps(asdict(report)))  # written last: marks a complete cache
    return report


def encoding_workers(requested: int = 0) -> int:
    """Processes for encoding: ``requested`` (``data.workers``) up to the usable CPUs, or for
    0 the usable CPUs, at most 16. More processes than CPUs would only hold more blocks in memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(requested, cpus) if requested else min(16, cpus))
