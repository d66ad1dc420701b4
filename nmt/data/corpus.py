"""Parallel text on disk: reading it.

Text files are streamed line by line, so memory does not grow with the corpus. Cleaning
lives in :mod:`nmt.data.clean`, the encoded-ids cache in :mod:`nmt.data.encoded`, batching in
:mod:`nmt.core.batching`. This module needs no torch.
"""

# Size: module at most 580 lines: reading text (files, pipes, compressed, datasets) is one concern;
# split further it would cross-import.

from __future__ import annotations

import bz2
import codecs
import contextlib
import functools
import gzip
import itertools
import logging
import lzma
import os
import select
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nmt.errors import NmtError
from nmt.files import is_stream

CHUNK_LINES = 50_000  # pairs read, cleaned and encoded at a time
READ_BYTES = 1 << 16  # read size when streaming standard input
# 64 MiB: a "line" longer than this is not a sentence (/dev/zero, a file without newlines);
# refused before memory runs out
MAX_LINE_BYTES = 1 << 26


class DataError(NmtError, ValueError):
    """Input text cannot be used; the message names the file, the line and what to do."""


# ---------------------------------------------------------------------------- reading


def iter_lines(path: str | Path, once: bool = False) -> Iterator[str]:
    r"""Stream a plain or gzipped UTF-8 text file, one sentence a line.

    ``once``: the caller reads the text once, so a pipe, a FIFO or a device (``/dev/stdin``,
    ``<(zcat ref.gz)``) will do as well as a regular file (see :func:`check_file`).

    Lines are split on ``\n`` only (never on the Unicode separators that
    ``str.splitlines`` also honours, which would shift the alignment of a parallel
    corpus); a trailing ``\r`` (CRLF files) and a UTF-8 byte-order mark on the first
    line are removed. Blank lines are kept, so line numbers stay aligned.

    Raises:
        DataError: the file does not exist, cannot be read or decompressed, or a line is
            not valid UTF-8 or longer than :data:`MAX_LINE_BYTES` (the message gives ``file:line``).
    """
    path = check_file(path, once)
    with _open_bytes(path) as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise _too_long(path, number)
            yield decode_line(raw, number, path)


def _too_long(name, number: int) -> DataError:
    return DataError(
        f"{name}:{number}: the line is longer than {MAX_LINE_BYTES >> 20} MiB without a newline; "
        "give text with one sentence a line"
    )


@contextlib.contextmanager
def _open_bytes(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for binary reading, decompressed if its content is gzip (whatever its name).

    Raises:
        DataError: UTF-16 text, or the file cannot be read or decompressed (also while reading).
    """
    try:
        # opened once and peeked at, so that a pipe's first bytes are not lost
        with open(path, "rb") as raw:
            head = raw.peek(64)[:64]
            magic = head[:2]
            if magic in (b"\xff\xfe", b"\xfe\xff") or _utf16_without_bom(head):
                raise DataError(
                    f"{path}: UTF-16 text; convert it to UTF-8 (e.g. iconv -f utf-16 -t utf-8)"
                )
            kind = compression(head)
            if kind in DECOMPRESSORS:
                with DECOMPRESSORS[kind](raw) as f:
                    yield f
            elif kind is not None:
                raise DataError(
                    f"{path}: {kind}-compressed data, which nmt does not read; decompress it first "
                    f"({kind} -d), or compress it with gzip"
                )
            else:
                yield raw
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise DataError(
            f"{path}: cannot read ({exc}); is the file complete and, if compressed, really what "
            "its first bytes say?"
        ) from None


#: A compressed file's first bytes, by the program that made it (what ``file(1)`` reads).
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
    b"7z\xbc\xaf\x27\x1c": "7z",
}
#: The ones read as they are (the standard library's decompressors); the others are named in an
#: error.
DECOMPRESSORS = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "bzip2": lambda raw: bz2.BZ2File(raw, mode="rb"),
    "xz": lambda raw: lzma.LZMAFile(raw, mode="rb"),
}


def compression(head: bytes) -> str | None:
    """The compression whose magic bytes start ``head`` (:data:`MAGIC`), or None for other data."""
    return next((kind for magic, kind in MAGIC.items() if head.startswith(magic)), None)


def _utf16_without_bom(head: bytes) -> bool:
    """Whether the first bytes look like UTF-16 without a byte-order mark: a NUL in every other
    byte (the high half of Latin text's code units), which UTF-8 text has nowhere."""
    pairs = len(head) // 2
    halves = [head[start : 2 * pairs : 2] for start in (0, 1)]
    # NULs only: no text at all
    return pairs >= 4 and any(
        not any(zeros) and any(other) for zeros, other in (halves, halves[::-1])
    )


def decode_line(raw: bytes, number: int, name) -> str:
    r"""Line ``number`` (1-based) of input ``name`` as text, without its ``\n`` or ``\r\n`` (and, on
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
        raise DataError(
            f"{name}:{number}: invalid UTF-8 at byte {exc.start} of the line; convert the text to "
            "UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


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
    lines have gathered. Lines follow :func:`iter_lines`' rules; gzip data (``nmt translate <
    test.en.gz``) is decompressed as it arrives, as files are.

    Raises:
        DataError: a line is not valid UTF-8 or longer than :data:`MAX_LINE_BYTES` (lines before
            it have been yielded), or gzip data that is damaged.
    """
    fd = _waitable_fd(stream)
    read = getattr(stream, "read1", stream.read)
    pending, lines, number, gunzip = bytearray(), [], 0, None
    while chunk := (os.read(fd, READ_BYTES) if fd is not None else read(READ_BYTES)):
        if (
            number == 0
            and not pending
            and gunzip is None
            and (kind := compression(chunk)) is not None
        ):
            if kind != "gzip":
                raise DataError(
                    f"{name}: {kind}-compressed data; decompress it on the way in ({kind} -dc FILE "
                    "| ...), as gzip is read itself"
                )
            gunzip = _Gunzip(name)
        pending += gunzip(chunk) if gunzip is not None else chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            number += 1
            if end - start > MAX_LINE_BYTES:
                raise _too_long(name, number)
            lines.append(decode_line(bytes(pending[start:end]), number, name))
            start = end + 1
            if len(lines) == size:
                yield lines
                lines = []
        del pending[:start]
        if len(pending) > MAX_LINE_BYTES:
            raise _too_long(name, number + 1)
        if lines and fd is not None and not select.select([fd], [], [], 0)[0]:
            yield lines
            lines = []
    if gunzip is not None:
        gunzip.finish()
    if pending:
        lines.append(decode_line(bytes(pending), number + 1, name))
    if lines:
        yield lines


class _Gunzip:
    """Incremental gzip decompression of a stream, member after member (``cat a.gz b.gz`` is gzip
    too)."""

    def __init__(self, name: str):
        self.name, self.inflate, self.padding = (
            name,
            zlib.decompressobj(wbits=16 + zlib.MAX_WBITS),
            False,
        )

    def __call__(self, data: bytes) -> bytes:
        out = bytearray()
        if self.padding:
            data = self._zeros(data)
        while data:
            try:
                out += self.inflate.decompress(data)
            except zlib.error as exc:
                raise DataError(f"{self.name}: damaged gzip data ({exc})") from None
            data = self.inflate.unused_data
            # zeros after a member (tape blocks, a padded image): gzip -d ignores them too
            if data[:1] == b"\0":
                self.padding = True
                data = self._zeros(data)
            elif data:  # the next member begins
                self.inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        return bytes(out)

    def _zeros(self, data: bytes) -> bytes:
        if data.strip(b"\0"):
            raise DataError(f"{self.name}: damaged gzip data (bytes after the zeros that end it)")
        return b""

    def finish(self) -> None:
        """Raise if the data ended in the middle of a gzip member."""
        if not self.inflate.eof:
            raise DataError(f"{self.name}: the gzip data ends early (a truncated file?)")


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
    raise DataError(
        f"{path}: invalid UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    )


def check_file(path: str | Path, once: bool = False) -> Path:
    """``path`` as a Path if it can be read as text: a regular file, or, when the caller reads it
    ``once``, also a pipe, FIFO, socket or character device (``/dev/stdin``, ``<(zcat f.gz)``).

    Raises:
        DataError: naming what ``path`` is instead (a directory, nothing, a link to nothing, or a
            pipe where the text is read more than once, as training reads it).
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file")
    if not path.exists():
        raise DataError(
            f"{path}: a link to nothing (or a loop of links); give the file it should name"
            if path.is_symlink()
            else f"{path}: file not found"
        )
    if not path.is_file() and not (once and is_stream(path)):
        raise DataError(
            f"{path}: not a regular file (a pipe?); nmt train reads its text more than once (to "
            "check it, train the tokenizer and "
            "encode it), so give a file, e.g. zcat f.gz > f"
        )
    return path


def read_lines(path: str | Path) -> list[str]:
    """All lines of ``path``, read once (a pipe will do; rules and errors of :func:`iter_lines`)."""
    return list(iter_lines(path, once=True))


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
        """The pairs of two aligned text files (not read yet)."""
        return cls(
            src_path=Path(src_path), tgt_path=Path(tgt_path), name=f"{src_path} and {tgt_path}"
        )

    @classmethod
    def lists(
        cls, src: list[str], tgt: list[str], name: str = "the in-memory corpus"
    ) -> ParallelText:
        """The pairs of two lists of lines. Raises :class:`DataError` if their lengths differ."""
        if len(src) != len(tgt):
            raise DataError(
                f"{name}: {len(src)} source lines but {len(tgt)} target lines: a parallel corpus "
                "needs one target line per source line"
            )
        return cls(src_lines=src, tgt_lines=tgt, name=name)

    def _misaligned(self, n_src: int, n_tgt: int) -> DataError:
        return DataError(
            f"{self.src_path} has {n_src} lines but {self.tgt_path} has {n_tgt}: a parallel corpus "
            "needs one target line per source line"
        )

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
        pairs = list(self.pairs())
        return [s for s, _ in pairs], [t for _, t in pairs]

    def fingerprint(self, digest) -> None:
        r"""Feed the corpus's content into ``digest`` (a hashlib object): file bytes, or lines.

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
            # sizes first: no two file pairs hash alike
            digest.update(path.stat().st_size.to_bytes(8, "little"))
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
    n = valid.check()
    if not any(s.strip() and t.strip() for s, t in valid.pairs()):
        raise DataError(
            f"the validation set ({valid.name}) has no pair with text on both sides (all {n} have "
            "a blank side); check those files"
        )


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Read two aligned files. Raises :class:`DataError` if their line counts differ."""
    return ParallelText.files(src_path, tgt_path).read()


@functools.cache
def _warn_once(message: str) -> None:
    logging.getLogger("nmt.data").warning("warning: %s", message)


def find_split_file(directory: str | Path, split: str, lang: str) -> Path:
    """``{directory}/{split}.{lang}`` or its ``.gz``.

    Raises:
        DataError: ``directory`` is not a directory, neither file exists, or the one there cannot be
            read more than once (a FIFO, a directory, a link to nothing or a loop of links:
            :func:`check_file`).
    """
    if not Path(directory).is_dir():
        what = "not a directory" if os.path.lexists(directory) else "no such directory"
        raise DataError(f"data.dir {directory}: {what}; give the directory of the split files")
    candidates = [Path(directory) / f"{split}.{lang}", Path(directory) / f"{split}.{lang}.gz"]
    if all(path.is_file() for path in candidates):
        _warn_once(
            f"{directory} holds both {candidates[0].name} and {candidates[1].name}; "
            f"reading {candidates[0].name} (remove the one not meant)"
        )
    for path in candidates:
        if path.is_file():
            return path
    for path in candidates:
        if os.path.lexists(path):  # a FIFO, a directory, a link to nothing: named for what it is
            return check_file(path)
    splits = sorted(
        {
            p.name.removesuffix(".gz").removesuffix(f".{lang}")
            for p in Path(directory).glob(f"*.{lang}*")
            if p.name.removesuffix(".gz").endswith(f".{lang}")
        }
    )
    there = (
        f" ({lang} files there are of the splits {', '.join(splits)}: choose with data.train_split "
        "and data.valid_split)"
        if splits
        else ""
    )
    raise DataError(f"{directory}: neither {split}.{lang} nor {split}.{lang}.gz exists{there}")


def load_hf_split(
    name: str,
    config: str | None,
    data_files: dict[str, str] | None,
    split: str,
    src_lang: str,
    tgt_lang: str,
) -> tuple[list[str], list[str]]:
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
        raise DataError(
            f"dataset {name!r} split {split!r}: no 'translation' column (columns: "
            f"{ds.column_names})"
        )
    rows = ds["translation"]
    try:
        return [r[src_lang] or "" for r in rows], [r[tgt_lang] or "" for r in rows]
    except (KeyError, TypeError):
        raise DataError(
            f"dataset {name!r} split {split!r}: translation entries need keys {src_lang!r} and "
            f"{tgt_lang!r}"
        ) from None


def load_split(cfg, split: str) -> ParallelText:
    """The ``split`` ("train" or "valid") that ``cfg`` (a DataConfig) names. Files are not read yet.

    Raises:
        DataError: no source is configured, a file is missing, a dataset cannot be loaded.
    """
    explicit = (
        (cfg.train_src, cfg.train_tgt) if split == "train" else (cfg.valid_src, cfg.valid_tgt)
    )
    if explicit[0] and explicit[1]:
        return ParallelText.files(*(check_file(path) for path in explicit))
    if cfg.hf_dataset:
        name = cfg.train_split if split == "train" else cfg.valid_split
        lines = load_hf_split(
            cfg.hf_dataset, cfg.hf_config, cfg.hf_data_files, name, cfg.src_lang, cfg.tgt_lang
        )
        return ParallelText.lists(*lines, name=f"dataset {cfg.hf_dataset!r} split {name!r}")
    if cfg.dir:
        name = cfg.train_split if split == "train" else cfg.valid_split
        return ParallelText.files(
            find_split_file(cfg.dir, name, cfg.src_lang),
            find_split_file(cfg.dir, name, cfg.tgt_lang),
        )
    raise DataError(
        f"no {split} data configured: set data.dir, data.{split}_src/{split}_tgt or data.hf_dataset"
    )
