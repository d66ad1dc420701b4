"""``nmt shortlist``: build a vocabulary shortlist for ``--shortlist`` from parallel training
text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import check_output, setup_logging


def shortlist(
    checkpoint: Annotated[
        Path,
        typer.Option(
            "--checkpoint",
            help="The model whose tokenizer cuts the text (a checkpoint file or a run directory).",
        ),
    ],
    src: Annotated[
        Path,
        typer.Option(
            "--src", help="Source side of the training text (plain or .gz), one sentence a line."
        ),
    ],
    tgt: Annotated[
        Path, typer.Option("--tgt", help="Target side, line by line parallel to --src.")
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the shortlist (CTranslate2's vocabulary-map text format).",
        ),
    ],
    per_source: Annotated[
        int,
        typer.Option(
            "--per-source",
            min=1,
            help="Target pieces kept per source piece, those most strongly co-occurring with it "
            "(Dice).",
        ),
    ] = 100,
    frequent: Annotated[
        int,
        typer.Option("--frequent", min=0, help="The most frequent target pieces, always allowed."),
    ] = 200,
) -> None:
    """Build a vocabulary shortlist (Marian's lexical shortlist; CTranslate2's vocabulary map) for
    `nmt translate --shortlist`."""
    from nmt.data.corpus import ParallelText
    from nmt.files import check_not_an_input
    from nmt.runs.checkpoint import checkpoint_file, load_checkpoint
    from nmt.translation.shortlist import build

    setup_logging()
    check_output(output)
    check_not_an_input(
        output, [("--src", src), ("--tgt", tgt), ("--checkpoint", checkpoint_file(checkpoint))]
    )
    tokenizer = load_checkpoint(checkpoint).tokenizer
    result = build(
        tokenizer, ParallelText.files(src, tgt).pairs(), per_source=per_source, frequent=frequent
    )
    result.write(output, tokenizer)
    typer.echo(
        f"wrote {output}: {len(result.always)} target pieces always allowed, "
        f"{len(result.by_source)} source pieces with up to {per_source} each"
    )
