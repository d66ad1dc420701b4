"""Freed memory kept for reuse: glibc's malloc told not to hand large blocks back to the system.

glibc serves every allocation above its mmap threshold (which adapts, up to 32 MiB) with a
fresh ``mmap`` and unmaps it when it is freed, so a tensor that large is paid for again in
page faults each time it is allocated: the kernel zeroes and maps every 4 KiB page on first
touch. A training step of the ``small`` model on 1,250 tokens allocates several such tensors,
the ``(tokens, vocab)`` logits, their log-softmax and their gradients (40 MB each at 8,000
pieces); on a 2-core CPU copying one 40 MB tensor took 15 ms with fresh pages and 4 ms with
reused ones, and a whole step was 1.09-1.10× faster with reuse (``docs/performance.md``).
PyTorch has no caching allocator on the CPU; the usual remedies are jemalloc or tcmalloc
through ``LD_PRELOAD``, which must be set before the process starts. :func:`keep_freed_memory`
does the same for glibc from inside the process, with ``mallopt``: no allocation is served by
``mmap`` and the heap is never trimmed, so freed blocks are reused. The cost is that the
process keeps its peak memory until it exits, as a caching allocator does.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters, from glibc's <malloc.h>
NEVER_TRIM = 2**31 - 1  # bytes: mallopt takes an int
DEFAULT_MMAP_MAX = 65536  # glibc's default count of mmapped blocks
# in the file name of a preloaded allocator: jemalloc, tcmalloc, mimalloc, ...
ALLOCATORS = ("malloc", "hoard", "scudo")


def chosen_by_user(
    environ: dict[str, str] | None = None, preload_file: str = "/etc/ld.so.preload"
) -> str | None:
    """What already chose how this process allocates memory, or None: ``GLIBC_TUNABLES`` with a
    malloc setting, a ``MALLOC_*`` variable with a value, or an allocator preloaded by
    ``LD_PRELOAD`` or ``preload_file`` (a library whose file name holds one of
    :data:`ALLOCATORS`)."""
    env = os.environ if environ is None else environ
    if "malloc" in env.get("GLIBC_TUNABLES", "").lower():
        return "GLIBC_TUNABLES"
    for name, value in env.items():
        if name.upper().startswith("MALLOC_") and value:
            return name
    preloads = [("LD_PRELOAD", env.get("LD_PRELOAD", ""))]
    try:
        with open(preload_file, encoding="utf-8", errors="replace") as f:
            preloads.append((preload_file, f.read()))
    except OSError:
        pass
    for source, libraries in preloads:
        for library in libraries.replace(":", " ").split():
            if any(a in os.path.basename(library).lower() for a in ALLOCATORS):
                return source
    return None


def keep_freed_memory() -> bool:
    """Make glibc's malloc reuse freed memory for every size (see the module docstring).

    Process-wide and for the rest of the process. It governs glibc's main heap, which serves
    the thread that calls it (a training step's); a block that another thread allocates from
    its own arena may still be mapped. Returns True when applied; False, changing
    nothing, off Linux, with a C library other than glibc (musl has no ``mallopt``), or when
    :func:`chosen_by_user` names what chose the allocator: that choice stands.
    """
    if not sys.platform.startswith("linux") or chosen_by_user():
        return False
    try:
        # the symbols already loaded into this process, its C library's among them
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(M_MMAP_MAX, 0) != 1:
        return False
    if mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) != 1:
        # half applied is worse than neither: blocks kept but trimmed away
        mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        return False
    return True
