"""Temporary files and directories beside an output, held by their writer until renamed into place.

**Temporaries** (:func:`held_temporary`) are named ``.NAME.tmpPID-TOKEN-HOST``, unique even
between processes of one process id (containers sharing a volume); a NAME too long for that to
fit the file system's limit on a name is cut, and a hash of the whole name added. Their writer holds
an exclusive ``flock`` on them until it renames or removes them. A temporary that nobody
holds was left by a writer that was killed (the kernel drops the lock with the process), and
:func:`remove_abandoned_temporaries` removes it; one being written is never touched, whoever
writes it. :func:`nmt.files.atomic_write` writes every output through one.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

try:  # POSIX
    import fcntl
except ImportError:  # Windows: no flock; a temporary is judged by its process id
    fcntl = None

log = logging.getLogger("nmt.files")

_HOST = (re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "unknown")[:64]
# The most a temporary's name adds to NAME: ".", ".probe", a process id of 10 digits, "-", 8 hex
# digits, "-" and a host of 64.
_ADDED = len("..probe") + 10 + 1 + 8 + 1 + 64
_HASH = 16  # hex digits of the hash that stands for a name cut to fit


def _name_max(directory: Path) -> int:
    """The longest name, in bytes, that the file system of ``directory`` takes (255 where it cannot
    say)."""
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    # a directory not made yet, or a system without pathconf
    except (OSError, ValueError, AttributeError):
        limit = -1
    return limit if limit > 0 else 255


def _stem(path: Path) -> str:
    """``path``'s name as its temporaries carry it: the name itself, or, where a temporary's name
    would then be longer than the file system takes, the name's start (whole characters) and ``~``
    and a hash of the whole name, so that every writer and sweeper of ``path`` names it alike and no
    two names share it."""
    room = _name_max(path.parent) - _ADDED
    if len(os.fsencode(path.name)) <= room:
        return path.name
    start = path.name
    while start and len(os.fsencode(start)) > room - 1 - _HASH:
        start = start[:-1]
    return f"{start}~{hashlib.sha256(os.fsencode(path.name)).hexdigest()[:_HASH]}"


def temporary_name(path: Path, kind: str = "tmp") -> Path:
    """A new hidden name beside ``path``: ``.NAME.tmpPID-TOKEN-HOST`` (``kind`` ``probe`` for a
    probe), random past the process id, and naming the machine, whose process ids alone mean
    something. It fits the file system's limit on a name whatever the length of ``path``'s (see
    :func:`_stem`)."""
    return path.with_name(f".{_stem(path)}.{kind}{os.getpid()}-{secrets.token_hex(4)}-{_HOST}")


@contextlib.contextmanager
def held_temporary(path: Path, directory: bool = False) -> Iterator[tuple[Path, int]]:
    """A new temporary beside ``path``, held by this process for the block: yields its path and a
    descriptor (of a file open for writing, or of an empty directory) that holds its ``flock``. A
    file gets the permission bits of ``path`` (when it exists) before anything is written to it.

    A sweeper that took the lock first (and so removes the file) is waited for, and the
    temporary is made anew, so the one yielded is never removed under its writer. If the
    block leaves the temporary in place (it failed before renaming it), it is removed.
    """
    while True:
        tmp = temporary_name(path)
        try:
            if directory:
                os.mkdir(tmp)
                fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
            else:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        # a sweeper removed the new directory before it was opened: make another
        except FileNotFoundError:
            continue
        if fcntl is not None:
            # a file system without locks (some NFS or FUSE mounts): written unheld
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            ours = os.path.samestat(os.stat(tmp, follow_symlinks=False), os.fstat(fd))
        except FileNotFoundError:
            ours = False
        if ours:
            break
        os.close(fd)
    if not directory:
        _keep_mode(path, fd)
    try:
        yield tmp, fd
    finally:
        with contextlib.suppress(OSError):
            # still there: not renamed into place
            if os.path.samestat(os.stat(tmp, follow_symlinks=False), os.fstat(fd)):
                shutil.rmtree(tmp) if directory else tmp.unlink()
        os.close(fd)


def _keep_mode(path: Path, fd: int) -> None:
    """Give the temporary ``fd`` the permission bits (rwx, not setuid/setgid/sticky) of the file it
    will replace."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a new file: the umask's bits, as the temporary was created
    if stat.S_ISREG(mode):
        os.fchmod(fd, stat.S_IMODE(mode) & 0o777)


# DOTALL: a name may hold any character but / and NUL, a line break included.
_TEMPORARY = re.compile(
    r"\.(?P<name>.+)\.tmp(?P<pid>\d+)(?:-(?P<token>[0-9a-f]{8})(?:-(?P<host>[A-Za-z0-9._]+))?)?",
    re.DOTALL,
)


def remove_abandoned_temporaries(directory: Path, name: str | None = None) -> None:
    """Remove the temporaries in ``directory`` (of the target ``name``, or of any) that no writer
    holds (see the module docstring): files or directories, never through a symbolic link.

    Where locks cannot be taken, a temporary counts as held while a process of its id runs here.
    """
    stem = _stem(Path(directory) / name) if name is not None else None
    pattern = f".{glob.escape(stem)}.tmp*" if stem is not None else ".*.tmp*"
    for tmp in Path(directory).glob(pattern):
        match = _TEMPORARY.fullmatch(tmp.name)
        if match is None or (stem is not None and match["name"] != stem):
            continue
        try:
            # a FIFO of that name does not wait for a writer
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # a link, gone, or unreadable: not ours to judge
            continue
        try:
            kind = os.fstat(fd).st_mode
            # a directory only of the names nmt makes
            if not (stat.S_ISREG(kind) or (stat.S_ISDIR(kind) and match["token"])):
                continue
            # NFS takes an exclusive flock only on a descriptor open for writing
            if stat.S_ISREG(kind):
                with contextlib.suppress(OSError):
                    writable = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    if os.path.samestat(os.fstat(writable), os.fstat(fd)):
                        fd, writable = writable, fd
                    os.close(writable)
            if not _abandoned(fd, int(match["pid"]), match["host"]):
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(kind):
                    shutil.rmtree(tmp)
                else:
                    tmp.unlink()
        finally:
            os.close(fd)


def _abandoned(fd: int, pid: int, host: str | None) -> bool:
    """Whether the temporary open as ``fd`` has no writer: nobody holds its lock (taken now, until
    ``fd`` closes); where locks cannot be taken (no ``flock``, or a file system without locks), its
    ``host`` is this machine (or unnamed, as older names were) and no process ``pid`` runs here."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False  # its writer is at work
        except OSError:
            pass
    return host in (None, _HOST) and not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's counts as running; on
    Windows, where ``os.kill(pid, 0)`` would send Ctrl-C, every process does)."""
    if pid == os.getpid() or os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


@contextlib.contextmanager
def replace_directory(out: Path) -> Iterator[Path]:
    """Yield an empty directory beside ``out`` (an absolute path) to write into; when the block
    ends, it replaces ``out`` (the earlier directory there is removed). If the block fails, or the
    process is killed at any moment, ``out`` is as it was or is the new directory, never missing:
    the two are exchanged in one step where the system can (Linux's ``renameat2``); elsewhere the
    earlier one is moved aside first, and a later call that finds it moved aside with no ``out``
    (its writer was killed in between) puts it back. Temporaries killed writers left beside ``out``
    are removed."""
    old = out.with_name(f"{out.name}.old")
    _restore_displaced(out, old)
    for place in (out, old):  # what killed exports to the same place left
        remove_abandoned_temporaries(place.parent, place.name)
    displaced = temporary_name(old)
    with held_temporary(out, directory=True) as (tmp, _):
        yield tmp
        if out.exists() and _exchange(tmp, out):
            displaced = tmp  # the earlier directory, now at the temporary's name
        else:
            if out.exists():
                os.rename(out, displaced)
            os.rename(tmp, out)
    shutil.rmtree(displaced, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False
    where the system or file system cannot, changing nothing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    # a C library without it (musl before 1.2.?, glibc before 2.28)
    except (OSError, AttributeError):
        return False
    call.argtypes, call.restype = (
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint],
        ctypes.c_int,
    )
    at_cwd, rename_exchange = -100, 2
    return call(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0


def _restore_displaced(out: Path, old: Path) -> None:
    """Put back the earlier directory that a killed writer moved aside (``.NAME.old.tmp...``) before
    it could rename its own into place, when nothing is at ``out``: the newest such directory."""
    if out.exists() or out.is_symlink():
        return
    aside = sorted(
        out.parent.glob(f".{glob.escape(_stem(old))}.tmp*"),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for candidate in aside:
        if candidate.is_dir() and not candidate.is_symlink():
            with contextlib.suppress(OSError):
                os.rename(candidate, out)
                log.warning(
                    "warning: %s was missing (a writer was stopped between its two renames): the "
                    "earlier one is back in place",
                    out,
                )
                return
