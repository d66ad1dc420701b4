"""Writing outputs: regular files replaced atomically, links followed, devices and FIFOs written
through.

Every special file is made in the test's own temporary directory; no test touches the
system's /dev entries.
"""

import os
import stat
import tempfile
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.files import OutputError, atomic_write, check_not_an_input, check_writable


def _dead_pid() -> int:
    pid = 4_000_000  # near Linux's largest pid_max (4,194,304); search downwards for a free one
    while pid > 1000:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 7919
    pytest.skip("no free process id found")


def test_a_symlink_is_followed_and_its_target_replaced(tmp_path):
    target = tmp_path / "real.de"
    target.write_text("old\n")
    link = tmp_path / "link.de"
    link.symlink_to(target)
    atomic_write(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.de"
    dangling.symlink_to(tmp_path / "made.de")
    atomic_write(dangling, "made\n")
    assert dangling.is_symlink() and (tmp_path / "made.de").read_text() == "made\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling.de",
        "link.de",
        "made.de",
        "real.de",
    ]


def test_a_fifo_is_written_through_to_its_reader(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    check_writable(fifo, "--output")
    atomic_write(fifo, lambda f: (f.write(b"one\n"), f.flush(), f.write(b"two\n")))
    reader.join(timeout=10)
    assert received == [b"one\ntwo\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.fifo"]  # no temporary, no probe


def test_a_character_device_is_written_through_not_replaced(tmp_path):
    null = tmp_path / "null"
    try:
        # the kernel's null device, made here
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("cannot make a device node here")
    check_writable(null)
    atomic_write(null, "thrown away\n")
    assert stat.S_ISCHR(os.stat(null).st_mode) and os.stat(null).st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    temporaries=st.lists(
        st.tuples(
            st.sampled_from(["avg.pt", "other.pt"]),
            st.sampled_from(["file", "directory"]),
            st.booleans(),
            st.sampled_from(["new", "old", "same pid"]),
        ),
        max_size=6,
    ),
)
def test_only_temporaries_that_no_writer_holds_are_swept(tmp_path_factory, temporaries):
    """A run's start once deleted every temporary in its directory, so an `nmt average --out
    RUN/avg.pt` or a `translate -o RUN/hyp.txt` still writing there lost its output; and names by
    process id alone collided between containers, where two writers are both pid 1. A temporary is
    removed only when no process holds its lock, whatever its pid, its target and its kind; the
    newer writer of the same target never takes the other's name. A directory is judged only under
    the names nmt gives (with a token): `.notes.tmp1/` may be anyone's."""
    import fcntl

    from nmt.temporaries import held_temporary, remove_abandoned_temporaries

    root = tmp_path_factory.mktemp("sweep")
    holders, made = [], []
    for i, (target, kind, held, naming) in enumerate(temporaries):
        pid = os.getpid() if naming == "same pid" else _dead_pid()
        name = f".{target}.tmp{pid - i}" if naming == "old" else f".{target}.tmp{pid}-{i:08x}-host"
        path = root / name
        if path.exists():
            continue
        path.mkdir() if kind == "directory" else path.write_bytes(b"partial")
        if held:  # another open file description: its lock stands against this process's too
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            holders.append(fd)
        made.append((path, target, held or (kind == "directory" and naming == "old")))
    try:
        atomic_write(root / "avg.pt", b"complete")
        assert (root / "avg.pt").read_bytes() == b"complete"
        assert sorted(p.name for p, _, _ in made if p.exists()) == sorted(
            p.name for p, target, kept in made if kept or target != "avg.pt"
        )
        with held_temporary(root / "other.pt") as (mine, _):
            remove_abandoned_temporaries(root)  # what a run does at its start
            assert mine.exists()
        assert sorted(p.name for p in root.iterdir()) == sorted(
            ["avg.pt", *(p.name for p, _, kept in made if kept)]
        )
    finally:
        for fd in holders:
            os.close(fd)
    remove_abandoned_temporaries(root)
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [
            "avg.pt",
            *(p.name for p, _, _ in made if p.is_dir() and ".tmp" in p.name and "-" not in p.name),
        ]
    )


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_a_private_files_new_content_is_never_readable_by_others(tmp_path, mode):
    """The temporary took the target's permission bits only after its content was written: for that
    while a 0600 file's new content was 0644. And setuid bits were copied; now only rwx."""
    out = tmp_path / "private.txt"
    out.write_text("old\n")
    os.chmod(out, mode | 0o4000)
    seen = []

    def content(f):
        seen.append(stat.S_IMODE(os.fstat(f.fileno()).st_mode))
        f.write(b"new\n")

    atomic_write(out, content)
    assert (
        seen == [mode] and stat.S_IMODE(os.stat(out).st_mode) == mode and out.read_text() == "new\n"
    )


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    """Replacing an output through a new temporary once widened a private (0600) file to the umask's
    0644."""
    for mode in (0o600, 0o640, 0o755):
        out = tmp_path / f"out{mode:o}.txt"
        out.write_text("old\n")
        os.chmod(out, mode)
        atomic_write(out, "new\n")
        assert out.read_text() == "new\n" and stat.S_IMODE(os.stat(out).st_mode) == mode


def test_an_output_that_is_an_input_is_refused(tmp_path):
    src = tmp_path / "same.en"
    src.write_text("a dog\n")
    (tmp_path / "hard.en").hardlink_to(src)
    (tmp_path / "soft.en").symlink_to(src)
    for name in ("same.en", "hard.en", "soft.en"):
        with pytest.raises(
            OutputError,
            match=rf"--output {tmp_path / name} is the same file as --input {src}: writing it "
            r"would destroy the input",
        ):
            check_not_an_input(tmp_path / name, [("--input", src)])
    check_not_an_input(tmp_path / "new.de", [("--input", src)])
    (tmp_path / "copy.en").write_text("a dog\n")
    check_not_an_input(tmp_path / "copy.en", [("--input", src)])  # equal content, another file
    assert src.read_text() == "a dog\n"


KINDS = (
    "absent",
    "regular",
    "symlink",
    "dangling symlink",
    "link to link",
    "directory",
    "missing parent",
    "fifo",
)


def _make(tmp_path, kind):
    out = tmp_path / "out.txt"
    if kind == "regular":
        out.write_bytes(b"before")
    elif kind == "symlink":
        (tmp_path / "target.txt").write_bytes(b"before")
        out.symlink_to(tmp_path / "target.txt")
    elif kind == "dangling symlink":
        out.symlink_to(tmp_path / "target.txt")
    elif kind == "link to link":
        (tmp_path / "target.txt").write_bytes(b"before")
        (tmp_path / "middle.txt").symlink_to(tmp_path / "target.txt")
        out.symlink_to(tmp_path / "middle.txt")
    elif kind == "directory":
        out.mkdir()
    elif kind == "missing parent":
        out = tmp_path / "nowhere" / "out.txt"
    elif kind == "fifo":
        os.mkfifo(out)
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.sampled_from(KINDS), content=st.binary(max_size=300), data=st.data())
def test_any_output_place_is_written_whole_or_refused_in_one_line(
    tmp_path_factory, kind, content, data
):
    tmp_path = tmp_path_factory.mktemp("out")
    out = _make(tmp_path, kind)
    received = []
    reader = (
        threading.Thread(target=lambda: received.append(out.read_bytes()))
        if kind == "fifo"
        else None
    )
    if reader:
        reader.start()
    before = {p.name: (p.is_symlink(), p.is_dir()) for p in tmp_path.iterdir()}
    try:
        check_writable(out, "--output")
        atomic_write(out, content if data.draw(st.booleans()) else (lambda f: f.write(content)))
    except OutputError as exc:
        assert (
            kind in ("directory", "missing parent")
            and "\n" not in str(exc)
            and str(out) in str(exc)
        )
        assert {p.name: (p.is_symlink(), p.is_dir()) for p in tmp_path.iterdir()} == before
        return
    if reader:
        reader.join(timeout=10)
        assert received == [content] and stat.S_ISFIFO(os.stat(out).st_mode)
    else:
        assert out.read_bytes() == content
    assert out.is_symlink() == ("link" in kind)  # links stay links
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name or ".probe" in p.name]


@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_loop_of_links_as_output_is_refused_and_left(tmp_path, length):
    """A loop of symbolic links given as an output was replaced by a regular file; a dangling link
    is still written through."""
    links = [tmp_path / f"l{i}" for i in range(length)]
    for i, link in enumerate(links):
        link.symlink_to(links[(i + 1) % length].name)
    for check in (check_writable, lambda p: atomic_write(p, "x\n")):
        with pytest.raises(
            OutputError, match=rf"^cannot write {links[0]}: it is a loop of symbolic links"
        ):
            check(links[0])
    assert all(link.is_symlink() for link in links)
    dangling = tmp_path / "dangling"
    dangling.symlink_to("target.txt")
    atomic_write(dangling, "x\n")
    assert dangling.is_symlink() and (tmp_path / "target.txt").read_text() == "x\n"


def test_on_a_file_system_without_locks_writes_work_and_the_process_id_decides(
    tmp_path, monkeypatch
):
    """Some NFS and FUSE mounts refuse flock (ENOLCK): writing must not fail there, and a temporary
    is then judged by its process id (gone: abandoned) instead of its lock."""
    import errno
    import fcntl

    from nmt.temporaries import remove_abandoned_temporaries

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    dead, alive = (
        tmp_path / f".out.txt.tmp{_dead_pid()}-0000000a",
        tmp_path / f".out.txt.tmp{os.getpid()}-0000000b",
    )
    # its process id means nothing here
    elsewhere = tmp_path / f".out.txt.tmp{_dead_pid()}-0000000c-another.host"
    for path in (dead, alive, elsewhere):
        path.write_bytes(b"partial")
    atomic_write(tmp_path / "out.txt", "whole\n")
    assert (
        (tmp_path / "out.txt").read_text() == "whole\n"
        and not dead.exists()
        and alive.exists()
        and elsewhere.exists()
    )
    remove_abandoned_temporaries(tmp_path)
    assert alive.exists() and elsewhere.exists()
    from nmt.runs.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.lock()  # unlocked, with a warning: the run goes on
    run.release()


def test_a_directory_swept_between_its_making_and_its_opening_is_made_again(tmp_path, monkeypatch):
    """A sweeper could remove a new temporary directory before its writer opened (and so held) it:
    export then failed with FileNotFoundError in 7 of 5,187 races. The writer makes another."""
    from nmt.temporaries import held_temporary

    real, made = os.mkdir, []

    def swept_once(path, *args, **kwargs):
        real(path, *args, **kwargs)
        made.append(path)
        if len(made) == 1:
            os.rmdir(path)  # what a sweeper that ran just then does

    monkeypatch.setattr(os, "mkdir", swept_once)
    with held_temporary(tmp_path / "hf", directory=True) as (tmp, _):
        assert tmp.is_dir() and len(made) == 2 and tmp == made[1]
    assert list(tmp_path.iterdir()) == []


def test_a_writer_killed_mid_write_leaves_a_temporary_the_next_writer_removes(tmp_path):
    """Across processes: while its writer runs, a temporary is held (another process's sweep leaves
    it); after a kill -9 the kernel drops the lock, and the next write of the same target removes
    what was left."""
    import signal
    import subprocess
    import sys
    import time

    from nmt.temporaries import remove_abandoned_temporaries

    out = tmp_path / "avg.pt"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; from nmt.files import atomic_write; atomic_write({str(out)!r}, lambda "
            "f: (f.write(b'partial'), f.flush(), time.sleep(60)))",
        ]
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".avg.pt.tmp*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    # the temporary exists; its writer has locked it (the lock precedes the first byte)
    time.sleep(0.5)
    remove_abandoned_temporaries(tmp_path)
    (held,) = list(tmp_path.glob(".avg.pt.tmp*"))
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    assert held.read_bytes() == b"partial" and not out.exists()
    atomic_write(out, b"whole")
    assert out.read_bytes() == b"whole" and sorted(p.name for p in tmp_path.iterdir()) == ["avg.pt"]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(exchange=st.booleans(), killed_at=st.integers(0, 2))
def test_a_directory_replaced_by_a_writer_that_stops_at_any_moment_is_never_missing(
    tmp_path_factory, exchange, killed_at
):
    """An export that replaced an earlier one and was killed between its two renames left no output
    directory (old and new both hidden), and the next export deleted both."""
    from nmt import temporaries as module
    from nmt.temporaries import replace_directory as directory_in_place

    place = tmp_path_factory.mktemp("place")
    out = place / "hf"
    with directory_in_place(out) as tmp:
        (tmp / "config.json").write_text("first")
    renames = {"n": 0}
    real_rename, real_exchange = os.rename, module._exchange

    def stopped(original):
        def call(*args):
            renames["n"] += 1
            if renames["n"] == killed_at + 1:
                raise KeyboardInterrupt  # the process stops here (a kill leaves the same files)
            return original(*args)

        return call

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            module, "_exchange", stopped(real_exchange) if exchange else lambda a, b: False
        )
        patch.setattr(os, "rename", stopped(real_rename))
        try:
            with directory_in_place(out) as tmp:
                (tmp / "config.json").write_text("second")
        except KeyboardInterrupt:
            pass
    if exchange:  # one step: the place holds one complete export whenever it stops
        assert (out / "config.json").read_text() in ("first", "second")
    with directory_in_place(place / "other"):  # any later export (here: elsewhere) leaves it be
        pass
    # the next export to the place finds an export there or puts it back first
    with directory_in_place(out) as tmp:
        assert (out / "config.json").read_text() in ("first", "second")
        (tmp / "config.json").write_text("third")
    assert (out / "config.json").read_text() == "third" and sorted(
        p.name for p in place.iterdir()
    ) == ["hf", "other"]


NAME_MAX = os.pathconf(tempfile.gettempdir(), "PC_NAME_MAX")  # where pytest makes its directories


@st.composite
def output_names(draw):
    """A file name of any length in bytes up to the file system's limit, of one- to four-byte UTF-8
    characters."""
    length = draw(st.integers(1, NAME_MAX))
    chars = draw(
        st.lists(
            st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
            min_size=1,
            max_size=4,
        )
    )
    name, i = "", 0
    while len((name + chars[i % len(chars)]).encode()) <= length:
        name, i = name + chars[i % len(chars)], i + 1
    name += "a" * (length - len(name.encode()))  # exactly `length` bytes
    return name if name not in (".", "..") else "a" * length


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=output_names(), kind=st.sampled_from(["file", "directory"]), exchange=st.booleans())
def test_an_output_of_any_name_the_file_system_takes_is_written_and_its_abandoned_temporaries_swept(
    tmp_path_factory, name, kind, exchange
):
    """An output named near the 255-byte limit was refused (File name too long): its temporary,
    `.NAME.tmpPID-TOKEN-HOST`, is about 25 bytes longer. Every temporary fits, a writer still sweeps
    what a killed one left of the same output, and no other file, however it is named, is
    touched."""
    import fcntl

    from nmt import temporaries
    from nmt.temporaries import (
        held_temporary,
        remove_abandoned_temporaries,
        replace_directory,
        temporary_name,
    )

    root = tmp_path_factory.mktemp("names")
    out = root / name
    assert len(os.fsencode(out.name)) <= NAME_MAX
    for kind_of_name in ("tmp", "probe"):
        made = temporary_name(out, kind_of_name)
        assert len(os.fsencode(made.name)) <= NAME_MAX and made.parent == root
    assert temporary_name(out) != temporary_name(out)  # unique
    stem = temporaries._TEMPORARY.fullmatch(temporary_name(out).name)["name"]
    # the name itself wherever it fits
    assert stem == name or len(os.fsencode(name)) > NAME_MAX - temporaries._ADDED
    left = temporary_name(out)  # what a killed writer left: nobody holds it
    left.mkdir() if kind == "directory" else left.write_bytes(b"partial")
    others = [root / f".{stem}.tmp", root / f".{stem}.tmpnotes"]  # look alike, but no nmt temporary
    for other in others:
        other.write_bytes(b"mine")
    held = temporary_name(out)  # a writer at work
    held.write_bytes(b"writing")
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        check_writable(out)
        if kind == "file":
            atomic_write(out, b"complete")
            assert out.read_bytes() == b"complete"
        else:
            with pytest.MonkeyPatch.context() as patch:
                if not exchange:
                    patch.setattr(temporaries, "_exchange", lambda a, b: False)
                for content in ("first", "second"):  # the second replaces the first
                    with replace_directory(out) as tmp:
                        (tmp / "config.json").write_text(content)
            assert (out / "config.json").read_text() == "second"
        assert sorted(p.name for p in root.iterdir()) == sorted(
            [name, held.name, *(p.name for p in others)]
        )
    finally:
        os.close(fd)
    remove_abandoned_temporaries(root, name)
    assert sorted(p.name for p in root.iterdir()) == sorted([name, *(p.name for p in others)])
    with held_temporary(out) as (mine, _):
        assert len(os.fsencode(mine.name)) <= NAME_MAX
