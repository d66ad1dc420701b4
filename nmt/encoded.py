"""The encoded-corpus cache: token ids of a parallel corpus, written once by the ``datasets``
library and read back memory-mapped.

``encode_corpus`` streams a :class:`~nmt.corpus.ParallelText` into
``datasets.Dataset.from_generator``, encodes it with ``Dataset.map(num_proc=...)`` by the
rules of :func:`nmt.corpus.encode_rows`, and keeps ``CACHE_DIR/KEY/ids*.arrow`` (``list<int32>``
columns and an int8 ``reason``), with ``report.json`` written last. :class:`EncodedCorpus`
reads those columns as NumPy views without copying. See ``docs/performance.md``, "Data at
scale". This module needs no torch; batching lives in :mod:`nmt.data`.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .clean import KEPT, CleanReport, encode_rows, flatten, report_of
from .corpus import CHUNK_LINES, DataError, ParallelText
from .tokenizer import Tokenizer

log = logging.getLogger("nmt.encoded")

# Part of every cache key: raise it whenever cleaning or encoding rules change, so that no
# run maps a cache an older rule wrote. 2: emptiness by pieces; length-prefixed fingerprints;
# 3: Arrow columns written by datasets; 4: control characters read as spaces; 5: sides of
# unknown pieces only dropped.
CACHE_FORMAT = 5


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
        return cls([flatten(src)], [flatten(tgt)])

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
        ids, offsets = flatten(seqs)
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
    tmp = _temporary_directory(path if keep else None, name)
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
        where = path.parent if path is not None else tempfile.gettempdir()
        raise DataError(f"cannot write the encoded corpus under {where} ({exc.strerror or exc}); free some space or set data.cache_dir elsewhere") from None


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

    import pyarrow as pa

    files = sorted(directory.glob("ids*.arrow"))
    if not files:
        raise ValueError("no Arrow files")
    tables = [datasets.Dataset.from_file(str(f), in_memory=in_memory).data.table for f in files]
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
