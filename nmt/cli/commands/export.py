"""``nmt export``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import Checkpoint, still_working


def export(
    out: Annotated[
        Path,
        typer.Argument(
            metavar="OUT",
            help="Where to write: a directory (huggingface, ctranslate2; created if missing) or a "
            "file (nmt, e.g. model.pt).",
        ),
    ],
    checkpoint: Checkpoint,
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="huggingface (a MarianMTModel directory), ctranslate2 (a CTranslate2 model "
            "directory), or nmt (a slim checkpoint: weights, config and "
            "tokenizer, no optimizer state; for translate and evaluate).",
        ),
    ] = "huggingface",
    quantization: Annotated[
        str | None,
        typer.Option(
            "--quantization",
            help="With --format ctranslate2: int8, int8_float32, float16, bfloat16, ... "
            "(CTranslate2's names). Default: float32.",
        ),
    ] = None,
) -> None:
    """Write a checkpoint for deployment: a Hugging Face MarianMTModel directory, a CTranslate2
    model directory, or a slim nmt checkpoint without optimizer state.

    huggingface loads with transformers' from_pretrained; ctranslate2 converts that directory
    with CTranslate2's converter (the stock ct2-transformers-converter assumes Marian's
    zero-embedding decoder start, which nmt models do not use). Both need
    `pip install -e ".[export]"`.
    """
    from nmt.interop.export import export as write

    with still_working("nmt export"):
        write(checkpoint, out, format, quantization)
    typer.echo(f"wrote {out}")
