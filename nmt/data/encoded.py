"""The encoded-corpus cache: token ids of a parallel corpus, written once as an Arrow file and
read back memory-mapped.

:func:`encode_corpus` reads the text in blocks of ``chunk_lines`` pairs, cuts each block into
pieces with SentencePiece's own threads (``encode(..., num_threads=N)``), drops pairs by the
rules of :func:`nmt.data.clean.drop_reasons`, and appends the kept pairs to one file,
``CACHE_DIR/KEY/ids.arrow``: ``list<int32>`` columns ``src_ids`` and ``tgt_ids``, one record
batch a block, in the Arrow IPC stream format (the one ``datasets`` writes). ``report.json``,
written last, holds the cleaning counts and the file's CRC-32, checked whenever the cache is
opened. :class:`EncodedCorpus` reads the columns as NumPy views of the mapped file.

All of it runs in the calling process: Ctrl-C, SIGKILL or the kernel's OOM killer stop that
one process, and leave at most a temporary directory, which a later run on the same machine
removes. See ``docs/performance.md``, "Data at scale". This module needs no torch; batching
lives in :mod:`nmt.core.batching`.
"""

# Size: module at most 492 lines: one cache: its key, its Arrow file with a checksum, and the
# encoding that writes it.

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np

from nmt.files import FULL, reason

from .clean import KEPT, CleanReport, Flat, drop_reasons, flatten, report_of
from .corpus import CHUNK_LINES, DataError, ParallelText
from .tokenizer import Tokenizer

log = logging.getLogger("nmt.encoded")

# Part of every cache key: raise it whenever cleaning or encoding rules change, so that no
# run maps a cache an older rule wrote. 2: emptiness by pieces; length-prefixed fingerprints;
# 3: Arrow columns written by datasets; 4: control characters read as spaces; 5: sides of
# unknown pieces only dropped; 6: one Arrow file of the kept pairs, with its CRC-32; 7: sides
# without text (only format, control and space characters) dropped.
CACHE_FORMAT = 7


class EncodedCorpus:
    """Token ids of the kept pairs of a parallel corpus, read without copying.

    Each side is a list of blocks ``(ids, offsets)``: in a cache, the Arrow record batches of
    a ``list<int32>`` column, memory-mapped; in memory, one block. Example ``i`` is the ``j``-th
    row of the block holding it, with ids ``ids[offsets[j]:offsets[j + 1]]`` (no EOS yet).
    """

    def __init__(self, src_blocks: list[Flat], tgt_blocks: list[Flat], key: str = ""):
        # key: the cache key
        self.src_blocks, self.tgt_blocks, self.key = (src_blocks, tgt_blocks, key)
        # examples of each corpus joined here (see joined)
        self.parts = (sum(len(offsets) - 1 for _, offsets in src_blocks),)
        sizes = [len(offsets) - 1 for _, offsets in src_blocks]
        self.starts = np.zeros(len(sizes) + 1, dtype=np.int64)  # first example of each block
        np.cumsum(sizes, out=self.starts[1:])
        self.src_lengths, self.tgt_lengths = (
            _lengths(blocks) for blocks in (src_blocks, tgt_blocks)
        )
        if len(self.src_lengths) != len(self.tgt_lengths):
            raise ValueError(f"{len(self.src_lengths)} sources but {len(self.tgt_lengths)} targets")

    def __len__(self) -> int:
        return len(self.src_lengths)

    def _ids(self, blocks: list[Flat], i: int) -> np.ndarray:
        block = int(np.searchsorted(self.starts, i, side="right")) - 1
        ids, offsets = blocks[block]
        j = i - int(self.starts[block])
        return ids[offsets[j] : offsets[j + 1]]

    def src(self, i: int) -> np.ndarray:
        """Source piece ids of example ``i``, int32 ``(src_len - 1,)``."""
        return self._ids(self.src_blocks, i)

    def tgt(self, i: int) -> np.ndarray:
        """Target piece ids of example ``i``, int32 ``(tgt_len - 1,)``."""
        return self._ids(self.tgt_blocks, i)

    @classmethod
    def joined(cls, corpora: list[EncodedCorpus]) -> EncodedCorpus:
        """The examples of ``corpora``, one after another, without copying (a model of several
        directions: see :mod:`nmt.data.multilingual`); ``parts`` holds each one's number of
        examples, and the key hashes theirs. One corpus is returned as it is."""
        if len(corpora) == 1:
            return corpora[0]
        key = hashlib.sha1("\0".join(c.key for c in corpora).encode()).hexdigest()[:16]
        out = cls(
            [b for c in corpora for b in c.src_blocks],
            [b for c in corpora for b in c.tgt_blocks],
            key,
        )
        out.parts = tuple(len(c) for c in corpora)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """Each side as one block, ``{side}_ids`` (int32) and ``{side}_offsets`` (int64, ``(n +
        1,)``) for ``side`` src and tgt, and ``parts`` (int64): what :meth:`from_arrays` takes
        back."""
        out = {"parts": np.asarray(self.parts, dtype=np.int64)}
        for side, blocks, lengths in (
            ("src", self.src_blocks, self.src_lengths),
            ("tgt", self.tgt_blocks, self.tgt_lengths),
        ):
            pieces = [ids[offsets[0] : offsets[-1]] for ids, offsets in blocks] or [
                np.zeros(0, np.int32)
            ]
            out[f"{side}_ids"] = np.concatenate(pieces).astype(np.int32, copy=False)
            out[f"{side}_offsets"] = np.zeros(len(self) + 1, dtype=np.int64)
            np.cumsum(lengths - 1, out=out[f"{side}_offsets"][1:])  # lengths count the EOS
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], key: str = "") -> EncodedCorpus:
        """The corpus :meth:`arrays` gave, one in-memory block a side.

        Raises:
            KeyError: an entry is missing.
            ValueError: the entries do not describe a corpus (offsets that do not run from 0 to
                the ids' end, or parts that do not add up to the pairs).
        """
        for side in ("src", "tgt"):
            ids, offsets = arrays[f"{side}_ids"], arrays[f"{side}_offsets"]
            if (
                offsets.ndim != 1
                or len(offsets) == 0
                or offsets[0] != 0
                or offsets[-1] != len(ids)
                or np.any(np.diff(offsets) < 0)
            ):
                raise ValueError(
                    f"{side} offsets do not run from 0 to the end of its {len(ids)} ids"
                )
        out = cls(
            [(arrays["src_ids"], arrays["src_offsets"])],
            [(arrays["tgt_ids"], arrays["tgt_offsets"])],
            key,
        )
        out.parts = tuple(int(n) for n in arrays["parts"])
        if sum(out.parts) != len(out):
            raise ValueError(f"parts {list(out.parts)} do not add up to its {len(out)} pairs")
        return out

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]]) -> EncodedCorpus:
        """One in-memory block of every pair given."""
        return cls([flatten(src)], [flatten(tgt)])

    @classmethod
    def from_table(cls, table, key: str = "") -> EncodedCorpus:
        """The pairs of an Arrow table written by :func:`encode_corpus` (``list<int32>`` columns
        ``src_ids`` and ``tgt_ids``), viewing its buffers.

        Raises:
            ValueError: the table does not hold such columns, or they differ in length (a
                damaged or foreign cache).
        """
        import pyarrow as pa

        def blocks(name: str) -> list[Flat]:
            column = table.column(name)
            if column.type != pa.list_(pa.int32()):
                raise ValueError(f"column {name} is {column.type}, not list<int32>")
            return [
                (chunk.values.to_numpy(), chunk.offsets.to_numpy())
                for chunk in column.chunks
                if len(chunk)
            ]

        return cls(blocks("src_ids"), blocks("tgt_ids"), key)


def _lengths(blocks: list[Flat]) -> np.ndarray:
    """Pieces per example plus one (EOS, or BOS on the decoder input), int64 ``(n,)``."""
    return (
        np.concatenate(
            [np.diff(offsets) for _, offsets in blocks] or [np.zeros(0, np.int64)]
        ).astype(np.int64)
        + 1
    )


def cache_key(
    text: ParallelText,
    tokenizer: Tokenizer,
    max_len: int | None,
    max_len_ratio: float | None,
    src_prefix: tuple[int, ...] = (),
) -> str:
    """16 hex digits hashing :data:`CACHE_FORMAT`, the text (file bytes or lines, length-prefixed),
    the tokenizer, the filter settings and the ids put before each source (a target tag): equal
    keys mean equal encodings. Without such ids the key is what it was before they existed."""
    key = hashlib.sha1(f"nmt encoded corpus, format {CACHE_FORMAT}\0".encode())
    for proto in tokenizer.protos().values():
        key.update(len(proto).to_bytes(8, "little"))
        key.update(proto)
    key.update(repr((max_len, max_len_ratio)).encode())
    if src_prefix:
        key.update(f"source prefix {list(src_prefix)}\0".encode())
    text.fingerprint(key)
    return key.hexdigest()[:16]


def encode_corpus(
    text: ParallelText,
    tokenizer: Tokenizer,
    cache_dir: Path | None,
    max_len: int | None = None,
    max_len_ratio: float | None = None,
    write: bool = True,
    threads: int = 1,
    chunk_lines: int = CHUNK_LINES,
    src_prefix: tuple[int, ...] = (),
) -> tuple[EncodedCorpus, CleanReport]:
    """Encode and clean a parallel corpus (:func:`nmt.data.clean.drop_reasons`, length filters with
    ``max_len``) into the Arrow cache, or open the cache already there.

    The text is read and encoded ``chunk_lines`` pairs at a time, SentencePiece using
    ``threads`` threads (:func:`encoding_threads`); the result does not depend on either.

    The cache directory ``cache_dir/KEY`` (:func:`cache_key`) appears only when complete
    (written under a temporary name, then renamed); a later run on the same input checks
    its CRC-32 and maps it read-only without tokenizing, or, if it is damaged, says so in
    one line and encodes again. ``write=False`` reads the cache but never writes it;
    without a cache (or with ``write=False`` on a miss) the ids are held in memory.
    ``src_prefix`` (a multilingual model's target tag) is put before every kept source, after
    cleaning: the filters count the text's own pieces.

    Raises:
        DataError: unreadable text or line counts that differ (nothing is left behind), or
            the cache cannot be written.
    """
    name = cache_key(text, tokenizer, max_len, max_len_ratio, src_prefix)
    path = cache_dir / name if cache_dir is not None else None
    if cache_dir is not None and cache_dir.is_dir():
        _remove_stale_temporaries(cache_dir)
    _remove_stale_temporaries(Path(tempfile.gettempdir()), f"{_UNCACHED}.tmp-*")
    if path is not None and (path.is_dir() or path.is_symlink() or path.exists()):
        cached = _load_cache(path)
        if cached is not None:
            return cached
    keep = path is not None and write
    tmp = _temporary_directory(path if keep else None, name)
    try:
        try:
            report = _write_ids(
                tmp, text, tokenizer, max_len, max_len_ratio, threads, chunk_lines, src_prefix
            )
        except OSError as exc:
            raise _unwritable(tmp.parent, exc) from None
        if not keep:
            return _open(tmp, name, mapped=False), report
        try:
            os.replace(tmp, path)
        # another process finished the same cache first (theirs is identical), or path is not a
        # cache
        except OSError:
            cached = _load_cache(path)  # moves anything but a complete cache aside
            if cached is not None:
                return cached
            os.replace(tmp, path)
        return _open(path, name), report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _temporary_directory(path: Path | None, name: str) -> Path:
    """A new directory to encode into: beside the cache entry ``path``, or (no cache kept) in
    the system's temporary directory. Both are named ``….tmp-HOST-PID-*``, so that a killed
    run's leftovers are swept (:func:`_remove_stale_temporaries`).

    Raises:
        DataError: the directory cannot be created (a full or read-only disk).
    """
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=_temporary_prefix(name), dir=path.parent))
        return Path(tempfile.mkdtemp(prefix=_temporary_prefix(_UNCACHED)))
    except OSError as exc:
        raise _unwritable(path.parent if path is not None else tempfile.gettempdir(), exc) from None


def _unwritable(where, exc: OSError) -> DataError:
    """The one-line error for a cache not writable under ``where``; what to do follows why."""
    advice = "free some space or set data.cache_dir elsewhere"
    if exc.errno not in FULL:
        advice = "set data.cache_dir to a directory nmt can write"
    return DataError(f"cannot write the encoded corpus under {where} ({reason(exc)}); {advice}")


def _write_ids(
    directory: Path,
    text: ParallelText,
    tokenizer: Tokenizer,
    max_len,
    max_len_ratio,
    threads: int,
    chunk_lines: int,
    src_prefix: tuple[int, ...] = (),
) -> CleanReport:
    """Write the kept pairs' ids to ``directory/ids.arrow`` (each source after ``src_prefix``), a
    record batch a block of text, then ``report.json`` (last: it marks a complete cache) with the
    counts and the CRC-32."""
    import pyarrow as pa

    schema = pa.schema([("src_ids", pa.list_(pa.int32())), ("tgt_ids", pa.list_(pa.int32()))])
    reasons = [np.zeros(0, dtype=np.int8)]
    with (
        pa.OSFile(str(directory / "ids.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, schema) as writer,
    ):
        for _, _, src, tgt, reason in encoded_chunks(
            text, tokenizer, max_len, max_len_ratio, threads, chunk_lines
        ):
            reasons.append(reason)
            writer.write_batch(
                pa.record_batch(
                    [
                        _list_array(side, reason == KEPT)
                        for side in (prefixed(src, src_prefix), tgt)
                    ],
                    schema=schema,
                )
            )
    report = report_of(np.concatenate(reasons))
    _write_synced(
        directory / "report.json",
        json.dumps({**asdict(report), "crc32": _crc32(directory / "ids.arrow")}),
    )
    return report


def encoded_chunks(
    text: ParallelText, tokenizer: Tokenizer, max_len, max_len_ratio, threads: int, chunk_lines: int
):
    """Each block of ``chunk_lines`` pairs of ``text``: its source and target lines, their ids
    (:func:`nmt.data.clean.flatten`) and why each pair is dropped
    (:func:`nmt.data.clean.drop_reasons`)."""
    for src, tgt in text.chunks(chunk_lines):
        flat = (
            flatten(tokenizer.encode_src(src, threads)),
            flatten(tokenizer.encode_tgt(tgt, threads)),
        )
        yield src, tgt, *flat, drop_reasons(tokenizer, (src, tgt), *flat, max_len, max_len_ratio)


def prefixed(flat: Flat, prefix: tuple[int, ...]) -> Flat:
    """``flat`` with the ids ``prefix`` put before every line (``flat`` itself for none)."""
    if not prefix:
        return flat
    ids, offsets = flat
    lines, k = len(offsets) - 1, len(prefix)
    out_offsets = offsets + k * np.arange(lines + 1, dtype=np.int64)
    out = np.empty(int(out_offsets[-1]), dtype=ids.dtype)
    # each line moves by the prefixes before and in it
    out[np.arange(len(ids)) + np.repeat(k * np.arange(1, lines + 1), np.diff(offsets))] = ids
    out[(out_offsets[:-1, None] + np.arange(k)).ravel()] = np.tile(
        np.asarray(prefix, dtype=ids.dtype), lines
    )
    return out, out_offsets


def _list_array(flat: Flat, keep: np.ndarray):
    """The lines of ``flat`` that ``keep`` marks, as an Arrow ``list<int32>`` array."""
    import pyarrow as pa

    ids, offsets = flat
    lengths = np.diff(offsets)
    kept_offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(lengths[keep], out=kept_offsets[1:])
    return pa.ListArray.from_arrays(
        pa.array(kept_offsets.astype(np.int32)),
        pa.array(ids[np.repeat(keep, lengths)], type=pa.int32()),
    )


def _crc32(path: Path) -> int:
    """The CRC-32 of a file's bytes (as zip archives, so checkpoints, carry one per entry)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return crc


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` and flush it, and every Arrow file beside it, to disk (before the rename)."""
    for arrow in path.parent.glob("*.arrow"):
        with open(arrow, "rb") as f:
            os.fsync(f.fileno())
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _open(directory: Path, name: str, mapped: bool = True) -> EncodedCorpus:
    """The corpus in ``directory/ids.arrow``, memory-mapped (or, not ``mapped``, read into
    memory)."""
    import pyarrow as pa

    with (
        pa.memory_map(str(directory / "ids.arrow"))
        if mapped
        else pa.OSFile(str(directory / "ids.arrow")) as source
    ):
        # a mapped table's buffers keep the mapping open
        table = pa.ipc.open_stream(source).read_all()
    return EncodedCorpus.from_table(table, key=name)


def _load_cache(path: Path) -> tuple[EncodedCorpus, CleanReport] | None:
    """The cache at ``path``, or None (after a one-line warning, and moving it out of the way)
    if it is incomplete or damaged: its ids no longer match their CRC-32, or its counts."""
    try:
        record = json.loads((path / "report.json").read_text())
        if _crc32(path / "ids.arrow") != record.pop("crc32"):
            raise ValueError(
                "ids.arrow does not match the CRC-32 written with it: the file changed after it "
                "was written"
            )
        report = CleanReport(**record)
        corpus = _open(path, path.name)
        if len(corpus) != report.kept:
            raise ValueError(f"{len(corpus)} pairs, not the {report.kept} recorded")
    # pyarrow's errors are ValueError or OSError
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("warning: cache %s is damaged (%s); encoding again", path, exc)
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


def encoding_threads(requested: int = 0, torch_threads: int = 0) -> int:
    """SentencePiece threads for encoding: ``requested`` (``data.workers``), else ``torch_threads``
    (``train.threads``), up to the usable CPUs; where both are 0 the usable CPUs, at most 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(requested or torch_threads or 16, cpus))
