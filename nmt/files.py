"""Writing outputs: atomic replacement, and one-line errors for full disks and read-only places.

Every file nmt writes (checkpoints, ``spm.model``, ``config.yaml``, translations) goes
through :func:`atomic_write`: the bytes go to a hidden temporary file beside the target,
are flushed to disk, and replace the target in one rename. An interruption or a full disk
leaves the old file (or none), never a partial one, and no temporary file. Outputs are
checked with :func:`check_writable` before the work that produces them starts.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import NmtError

_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


class OutputError(NmtError, RuntimeError):
    """An output cannot be written (missing directory, read-only place, full disk); the message names the path."""


def os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, or one it was raised from or while handling
    (not one a ``raise ... from None`` disowned, such as an input file's read error that
    :class:`~nmt.corpus.DataError` already reports while a streamed output is being written)."""
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return exc


def reason(exc: OSError) -> str:
    """A short reason for a failed write, in words (``no space left on the device``)."""
    return _REASONS.get(exc.errno, exc.strerror or str(exc))


def temporary_path(path: Path) -> Path:
    """The hidden temporary name :func:`atomic_write` uses for ``path`` in this process."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def check_writable(path: Path, what: str = "output") -> None:
    """Fail before any work if a file cannot be created at ``path``.

    A probe file is created and removed beside ``path``: this catches read-only mounts and
    missing permissions, which ``os.access`` misses for root.

    Args:
        what: how the message names the output: text, or a :class:`~nmt.errors.Key` (an argument name).

    Raises:
        OutputError: ``path`` is a directory, its directory is missing, or nothing can be created there.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputError(what, f" {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise OutputError(what, f" {path}: directory {path.parent} does not exist; create it first")
    probe = path.with_name(f".{path.name}.probe{os.getpid()}")
    try:
        probe.open("xb").close()
    except OSError as exc:
        raise OutputError("cannot write ", what, f" {path}: {reason(exc)}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def atomic_write(path: Path, content: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` with ``content`` (bytes, UTF-8 text, or a function writing to a binary file) atomically.

    Raises:
        OutputError: the disk is full, the place is read-only, or another OS error; the
            temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as exc:  # torch.save reports a failed write as a RuntimeError raised while handling the OSError
        cause = os_error(exc)
        if cause is None:
            raise
        raise OutputError(f"cannot write {path}: {reason(cause)}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def append_line(path: Path, line: str) -> None:
    """Append one line of text to ``path``.

    Raises:
        OutputError: the disk is full or the place is read-only.
    """
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {reason(exc)}") from None
