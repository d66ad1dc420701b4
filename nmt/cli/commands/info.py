"""``nmt info``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nmt.config import ConfigError

from .options import CKPT_HELP, standard_output


def info(
    path: Annotated[
        Path | None,
        typer.Argument(
            metavar="CHECKPOINT",
            help=f"{CKPT_HELP} Or give it with --checkpoint.",
            show_default=False,
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help=f"{CKPT_HELP[:-1]}, as translate and evaluate take it."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object (with the whole config) instead of text."
        ),
    ] = False,
) -> None:
    """Describe a checkpoint: step, epoch, best validation BLEU, parameters, tokenizer, file size,
    optimizer state, config."""
    from nmt.tools.info import checkpoint_info, format_info

    if (path is None) == (checkpoint is None):
        got = f" (got {path} and --checkpoint {checkpoint})" if path else ""
        raise ConfigError(
            f"give one checkpoint: nmt info CHECKPOINT, or nmt info --checkpoint CHECKPOINT{got}"
        )
    standard_output()
    result = checkpoint_info(path or checkpoint)
    typer.echo(json.dumps(result) if as_json else format_info(result))
