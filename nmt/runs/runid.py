"""Which run a checkpoint belongs to, and whether a run directory's checkpoint is its own.

Every checkpoint ``nmt train`` writes holds its run, ``{"id": ..., "dir": ...}``: an id drawn
when the run starts and kept by ``--resume``, and the directory it started in. The run directory
keeps the same value in ``run.json`` from the run's start, so a checkpoint copied in from
another run (a ``best.pt`` or ``last.pt`` of the same architecture, which would translate and
resume without complaint) is told from the directory's own whichever of its files it replaced,
and even when it is the only one. A directory of an nmt from before ``run.json`` has only its
checkpoints to say it: two of them of different runs are named together, neither as the other's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from nmt.files import RUN_RECORD, atomic_write

log = logging.getLogger("nmt.runid")


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``step_N.pt`` files, oldest first."""
    return sorted(
        (p for p in run_dir.glob("step_*.pt") if p.stem[5:].isdigit()),
        key=lambda p: int(p.stem[5:]),
    )


def run_checkpoints(run_dir: Path) -> list[Path]:
    """``last.pt``, ``best.pt`` (those that exist) and the ``step_N.pt`` files, oldest step
    first."""
    return [p for p in (run_dir / "last.pt", run_dir / "best.pt") if p.is_file()] + (
        step_checkpoints(run_dir)
    )


def peek(path: Path) -> tuple[int, dict | None]:
    """A checkpoint's step and the run that wrote it (its ``run`` entry), read lazily (tensors are
    not loaded); ``(-1, None)`` if it cannot be read, a None run where it records none (an older
    nmt's)."""
    try:
        payload = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
        return int(payload["progress"]["step"]), _run(payload)
    except Exception:  # damaged or foreign files sort last; loading them reports why
        return -1, None


def _run(payload: dict) -> dict | None:
    """The ``run`` entry of a checkpoint (or of ``run.json``) where it names an id, else None."""
    run = payload.get("run") if isinstance(payload, dict) else None
    return run if isinstance(run, dict) and isinstance(run.get("id"), str) else None


def recorded_run(run_dir: Path) -> dict | None:
    """The run ``run_dir/run.json`` says the directory holds; None without one (a directory of an
    older nmt), or where it is damaged."""
    try:
        return _run({"run": json.loads((run_dir / RUN_RECORD).read_bytes())})
    except (OSError, ValueError):
        return None


def record_run(run_dir: Path, run: dict) -> None:
    """Write ``run`` (a checkpoint's ``run`` entry) as the run ``run_dir`` holds."""
    atomic_write(run_dir / RUN_RECORD, json.dumps(run) + "\n")


def not_the_runs(run_dir: Path, path: Path, run: dict | None) -> str | None:
    """Why the checkpoint ``path`` of the run directory ``run_dir``, written by ``run`` (its ``run``
    entry), is another run's, in words naming both files; None when nothing says it is (no record
    to compare with, or ``path`` of an nmt that recorded no run)."""
    if _run({"run": run}) is None:
        return None
    own = recorded_run(run_dir)
    if own is not None:
        if own["id"] == run["id"]:
            return None
        mine = next(
            (p for p, theirs in _others(run_dir, path) if theirs and theirs["id"] == own["id"]),
            None,
        )
        return (
            f"{path} was written by another run (started in {run.get('dir')}) than the run "
            f"{run_dir / RUN_RECORD} names (started in {own.get('dir')}), "
            + (f"whose checkpoint is {mine}" if mine else f"of which {run_dir} holds no checkpoint")
        )
    for other, theirs in _others(run_dir, path):
        if theirs is not None and theirs["id"] != run["id"]:
            return (
                f"{path} (started in {run.get('dir')}) and {other} (started in "
                f"{theirs.get('dir')}) were written by different runs, and {run_dir} has no "
                f"{RUN_RECORD} to say which is its own"
            )
    return None


def _others(run_dir: Path, path: Path):
    """The checkpoints of ``run_dir`` but ``path``, each with its run, read as they are asked
    for."""
    return ((p, peek(p)[1]) for p in run_checkpoints(run_dir) if p.name != path.name)


def warn_if_not_the_runs(run_dir: Path, path: Path, run: dict | None) -> None:
    """Warn in one line where ``path``, a checkpoint the run directory ``run_dir`` was resolved to
    (its ``best.pt``, a ``step_N.pt``), is another run's (:func:`not_the_runs`); it is read all the
    same."""
    why = not_the_runs(run_dir, path, run)
    if why:
        log.warning(
            "warning: %s; reading %s all the same: move the other run's checkpoint out of %s, or "
            "give the checkpoint's file, not the directory, to use it knowingly",
            why,
            path,
            run_dir,
        )
