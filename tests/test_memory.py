import os
import subprocess
import sys
import textwrap

import pytest

from nmt.runtime.memory import chosen_by_user


def glibc_version() -> tuple[int, ...]:
    """The version of glibc, () for another C library."""
    found = os.confstr("CS_GNU_LIBC_VERSION") if sys.platform.startswith("linux") else ""
    return (
        tuple(int(part) for part in found.split()[1].split(".")[:2])
        if found and found.startswith("glibc")
        else ()
    )


glibc = pytest.mark.skipif(glibc_version() < (2, 33), reason="glibc 2.33 or later (mallinfo2)")

# Allocates and frees a 64 MiB tensor: prints whether memory was kept, how many more blocks glibc
# serves by mmap with the tensor alive, and whether its 64 MiB are free in the heap afterwards.
PROBE = textwrap.dedent(
    """
    import ctypes, sys, torch
    from nmt.runtime.memory import keep_freed_memory

    class Mallinfo2(ctypes.Structure):
        names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    applied = keep_freed_memory() if sys.argv[1] == "keep" else None
    before = libc.mallinfo2().hblks
    x = torch.ones(16 * 2**20)
    mapped = libc.mallinfo2().hblks - before
    del x
    print(applied, mapped, libc.mallinfo2().fordblks >= 64 * 2**20)
    """
)


def probe(mode: str, **env) -> list[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GLIBC_TUNABLES", "LD_PRELOAD") and not k.startswith("MALLOC_")
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ | env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@glibc
def test_large_tensors_come_from_the_heap_and_stay_there_once_kept():
    # glibc's default: 64 MiB is above any mmap threshold, so it is mapped, then unmapped when
    # freed.
    assert probe("default") == ["None", "1", "False"]
    # Kept: served from the heap, and still there (free, for the next tensor) after it is freed.
    assert probe("keep") == ["True", "0", "True"]


@glibc
def test_a_users_own_malloc_settings_stand():
    assert probe("keep", GLIBC_TUNABLES="glibc.malloc.mmap_max=65536") == ["False", "1", "False"]


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({}, None),
        ({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}, None),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "GLIBC_TUNABLES"),
        ({"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX"),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/usr/lib/libfakeroot.so"}, None),
        ({"LD_PRELOAD": "/usr/lib/libfakeroot.so:/opt/libJEMALLOC.so"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/usr/lib/libfakeroot.so /opt/libhoard.so"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/home/me/malloc-tests/libfakeroot.so"}, None),
        ({"MALLOC_ARENA_MAX": ""}, None),
        ({"glibc_tunables": "glibc.malloc.mmap_max=0"}, None),
    ],
)
def test_chosen_by_user_names_the_variable(environ, named, tmp_path):
    assert chosen_by_user(environ, preload_file=str(tmp_path / "absent")) == named


def test_an_allocator_preloaded_for_the_whole_system_counts(tmp_path):
    preload = tmp_path / "ld.so.preload"
    preload.write_text("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4\n")
    assert chosen_by_user({}, preload_file=str(preload)) == str(preload)
