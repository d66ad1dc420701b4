"""Writing outputs: atomic replacement, and one-line errors for full disks and read-only places.

Every file nmt writes (checkpoints, ``spm.model``, ``config.yaml``, translations) goes
through :func:`atomic_write`: the bytes go to a hidden temporary file beside the target,
are flushed to disk, and replace the target in one rename; the temporary has the target's
permission bits from its creation, so a private file's new content is never readable by
others. An interruption or a full disk leaves the old file (or none), never a partial one.
Outputs are checked with :func:`check_writable` before the work that produces them starts.
Replacing means a hard link to the old file keeps the old content.

The temporaries themselves, and the sweeping of those a killed writer left, are
:mod:`nmt.temporaries`.

Atomic replacement is for regular files only. A symbolic link is followed and its target
replaced (as ``cp`` and shell redirection write through links); a character device
(``/dev/null``, a terminal) or a FIFO is written to directly, as it comes, since replacing
it would put a regular file where the device or pipe was. A name of one of this process's
open descriptors (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``) is written through
that descriptor, as ``cat`` would: replacing the file behind it would discard what the
shell wrote there before (``>> log``) and its append mode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import NmtError
from .temporaries import held_temporary, remove_abandoned_temporaries, temporary_name

try:  # POSIX
    import fcntl
except ImportError:
    fcntl = None

FULL = (errno.ENOSPC, errno.EDQUOT)  # what a write fails with where the disk is full
_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


class OutputError(NmtError, RuntimeError):
    """An output cannot be written (missing directory, read-only place, full disk); the message
    names the path."""


def os_error(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, or one it was raised from or while handling
    (not one a ``raise ... from None`` disowned, such as an input file's read error that
    :class:`~nmt.data.corpus.DataError` already reports while a streamed output is being
    written)."""
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return exc


def reason(exc: OSError, path: Path | None = None) -> str:
    """A short reason for a failed write of ``path``, in words (``no space left on the device``);
    for a file whose directory is gone, that the directory was removed while nmt ran."""
    if exc.errno == errno.ENOENT and path is not None and not Path(path).parent.is_dir():
        return (
            f"its directory {Path(path).parent} no longer exists (removed while nmt was "
            "writing "
            "to it?); nothing more was written there"
        )
    return _REASONS.get(exc.errno, exc.strerror or str(exc))


def is_stream(path: Path) -> bool:
    """Whether ``path`` (after links) is a character device, FIFO or socket: written as it comes,
    never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


_DESCRIPTOR = re.compile(r"/(?:proc/(self|thread-self|\d+)/fd|dev/fd)/(\d+)")


def inherited_fd(path: Path) -> int | None:
    """The open descriptor of this process that ``path`` names, following links (``/dev/stdout`` →
    ``/proc/self/fd/1``: 1), or None for any other path or a descriptor not open here."""
    name = os.path.abspath(path)
    for _ in range(40):  # a loop of links ends here, as the kernel's ELOOP would
        match = _DESCRIPTOR.fullmatch(name)
        if match is not None:
            pid, fd = match[1], int(match[2])
            if pid is not None and pid.isdigit() and int(pid) != os.getpid():
                return None  # another process's descriptor: an ordinary path to what it opened
            try:
                os.fstat(fd)
            except (OSError, OverflowError):
                return None
            return fd
        if not os.path.islink(name):
            return None
        try:
            name = os.path.abspath(os.path.join(os.path.dirname(name), os.readlink(name)))
        except OSError:
            return None
    return None


def resolve_output(path: Path) -> Path:
    """Where writing ``path`` lands: the final target of a symbolic link (which need not exist yet),
    else ``path``.

    Raises:
        OutputError: ``path`` is a loop of symbolic links (it leads nowhere to write).
    """
    path = Path(path)
    if not path.is_symlink():
        return path
    try:
        os.stat(path)
    # a dangling link is written through (its target made), as the shell's > does
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(
                f"cannot write {path}: it is a loop of symbolic links; remove it or give another "
                "name"
            ) from None
    return Path(os.path.realpath(path))


#: What ``nmt train`` keeps in a run directory (:mod:`nmt.runs.rundir`): its records, checkpoints,
#: config, tokenizer, lock and the run it holds. Every writer refuses to replace one
#: (:func:`check_not_a_run_file`).
METRICS = "metrics.jsonl"
RUN_RECORD = "run.json"  # which run the directory holds (nmt.runs.runid)
RUN_FILE = re.compile(
    r"(last|best|step_\d+)\.pt|config\.yaml|metrics\.jsonl|run\.json|spm(\.src|\.tgt)?\.model|spm\.(src|tgt)\.spm|spm\.vocab\.json|\.lock"
)


def check_not_a_run_file(target: Path, given: Path, what: str = "output") -> None:
    """Refuse an output ``given`` (writing to ``target``, a link's target) that would replace a file
    ``nmt train`` keeps in a run directory (one with ``metrics.jsonl`` or ``.lock``): a
    checkpoint that ``--resume`` and ``translate`` read, the run's config, records or tokenizer.

    Raises:
        OutputError: naming the run and another name to write to.
    """
    run = target.parent
    if not RUN_FILE.fullmatch(target.name) or not (
        (run / METRICS).is_file() or (run / ".lock").is_file()
    ):
        return
    kind = "a training checkpoint" if target.suffix == ".pt" else "a file"
    via = "" if target == given else f" (through {given})"
    raise OutputError(
        what,
        f" {given} would replace {kind} of the run in {run}{via} (--resume reads last.pt and "
        "translate best.pt, and both"
        " read the run's config and tokenizer); write to another name, e.g. "
        f"{run / ('average.pt' if target.suffix == '.pt' else 'output.txt')}",
    )


def check_writable(path: Path, what: str = "output") -> None:
    """Fail before any work if a file cannot be created at ``path``.

    A probe file is created and removed beside ``path`` (beside a symbolic link's target):
    this catches read-only mounts and missing permissions, which ``os.access`` misses for
    root. A device or FIFO is checked with ``os.access`` instead, and nothing is created
    beside it.

    Args:
        what: how the message names the output: text, or a :class:`~nmt.errors.Key` (an argument
            name).

    Raises:
        OutputError: ``path`` is a directory, its directory is missing, nothing can be created
            there, or it is a file of a run directory (:func:`check_not_a_run_file`).
    """
    original = path
    fd = inherited_fd(path)
    if fd is not None:
        if fcntl is not None and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OutputError(
                "cannot write ", what, f" {path}: descriptor {fd} is open for reading only"
            )
        return
    path = resolve_output(Path(path))
    if path.is_dir():
        raise OutputError(what, f" {path} is a directory; give a file name")
    check_not_a_run_file(path, Path(original), what)
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise OutputError("cannot write ", what, f" {path}: permission denied")
        return
    if not path.parent.is_dir():
        raise OutputError(what, f" {path}: directory {path.parent} does not exist; create it first")
    probe = temporary_name(path, "probe")
    try:
        probe.open("xb").close()
    except OSError as exc:
        raise OutputError("cannot write ", what, f" {path}: {reason(exc)}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def atomic_write(path: Path, content: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` with ``content`` (bytes, UTF-8 text, or a function writing to a binary file)
    atomically.

    A symbolic link's target is replaced, the link kept; a device or FIFO is written
    directly (see the module docstring). Temporary files that killed writers of the same
    target left behind are removed first.

    Raises:
        OutputError: the disk is full, the place is read-only, or another OS error; the
            temporary file is removed and ``path`` is left as it was.
    """
    fd = inherited_fd(path)
    if fd is not None:
        return _write_to_descriptor(fd, path, content)
    path = resolve_output(Path(path))
    if is_stream(path):
        return _write_through(path, content)
    remove_abandoned_temporaries(path.parent, path.name)
    try:
        with held_temporary(path) as (tmp, fd):
            with os.fdopen(fd, "wb", closefd=False) as f:
                _write(f, content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    # torch.save reports a failed write as a RuntimeError raised while handling the OSError
    except Exception as exc:
        _raise_output_error(exc, path)


def _write(f: BinaryIO, content: bytes | str | Callable[[BinaryIO], None]) -> None:
    if callable(content):
        content(f)
    else:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)


def _write_through(path: Path, content) -> None:
    """Write to a device or FIFO as it comes (opening a FIFO waits for its reader, as ``cat > fifo``
    does)."""
    try:
        with open(path, "wb") as f:
            _write(f, content)
    except Exception as exc:
        _raise_output_error(exc, path)


def _write_to_descriptor(fd: int, path: Path, content) -> None:
    """Write through this process's open descriptor ``fd`` (named by ``path``), in its own mode
    (append stays append)."""
    if fd in (1, 2):
        (sys.stdout if fd == 1 else sys.stderr).flush()  # what was printed before comes first
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            _write(f, content)
    except Exception as exc:
        _raise_output_error(exc, path)


def _raise_output_error(exc: Exception, path: Path):
    cause = os_error(exc)
    if cause is None:
        raise exc
    # the reader of a FIFO left: as a pipe's reader leaving, not an error of ours
    if cause.errno == errno.EPIPE:
        raise BrokenPipeError(errno.EPIPE, f"the reader of {path} left") from None
    raise OutputError(f"cannot write {path}: {reason(cause, path)}") from None


def check_not_an_input(
    output: Path, inputs: list[tuple[str, Path]], what: str = "--output"
) -> None:
    """Refuse an ``output`` that is one of the ``inputs`` (``(flag, path)`` pairs): the same file by
    device and inode, through links and other names too, which writing would destroy before (or
    while) it is read.

    Raises:
        OutputError: naming both flags.
    """
    try:
        out = os.stat(output)
    except OSError:
        return  # a file that does not exist yet is no input
    if not stat.S_ISREG(out.st_mode):
        return  # /dev/null or a FIFO as both input and output is the user's plumbing
    for flag, path in inputs:
        try:
            same = os.path.samestat(out, os.stat(path))
        except OSError:
            continue
        if same:
            raise OutputError(
                f"{what} {output} is the same file as {flag} {path}: writing it would destroy the "
                "input; write to another file"
            )


def append_line(path: Path, line: str) -> None:
    """Append one line of text to ``path``.

    Raises:
        OutputError: the disk is full or the place is read-only.
    """
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {reason(exc, path)}") from None
