"""``nmt average``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import setup_logging


def average(
    checkpoints: Annotated[
        list[Path] | None,
        typer.Argument(metavar="CHECKPOINT", help="Checkpoints to average (or give --run-dir)."),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Where to write the averaged checkpoint (not an input, nor a run's own last.pt, "
            "best.pt or step_N.pt).",
        ),
    ] = ...,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="Average this run's newest step_N.pt checkpoints."),
    ] = None,
    last: Annotated[
        int,
        typer.Option(
            "--last", help="With --run-dir: how many of the newest step checkpoints (at least 1)."
        ),
    ] = 5,
    allow_different_runs: Annotated[
        bool,
        typer.Option(
            "--allow-different-runs",
            help="Average checkpoints of different trainings of one architecture (refused "
            "otherwise: their average need not translate).",
        ),
    ] = False,
) -> None:
    """Average model weights of several checkpoints (the paper averages the last 5)."""
    from nmt.tools.average import average_checkpoints, newest_step_checkpoints

    setup_logging()
    paths = list(checkpoints or []) + (
        newest_step_checkpoints(run_dir, last) if run_dir is not None else []
    )
    payload = average_checkpoints(paths, out, allow_different_runs)
    typer.echo(f"averaged {len(payload['averaged_from'])} checkpoints into {out}")
