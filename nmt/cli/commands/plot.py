"""``nmt plot metrics`` (``nmt plot RUN`` for short) and ``nmt plot attention``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nmt.config import ConfigError
from nmt.files import check_not_an_input

from .options import (
    AlignmentLayer,
    AllowUnk,
    Asked,
    BeamSize,
    Checkpoint,
    Device,
    DType,
    LengthNormalization,
    LengthPenalty,
    MaxInputPieces,
    MaxLenA,
    MaxLenB,
    Threads,
    TranslateTgtLang,
    check_output,
)


def metrics(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="A run directory with metrics.jsonl.")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Image to write: .png (also without a suffix), .pdf or .svg. Default: "
            "RUN_DIR/metrics.png.",
        ),
    ] = None,
) -> None:
    """Plot training/validation loss, validation BLEU and the learning rate over steps."""
    from nmt.tools.plot import plot_metrics

    check_output(out, "--out")
    if out is not None:
        check_not_an_input(out, [("RUN_DIR's metrics", run_dir / "metrics.jsonl")], "--out")
    typer.echo(f"wrote {plot_metrics(run_dir, out)}")


def attention(
    ctx: typer.Context,
    sentence: Annotated[
        str, typer.Argument(metavar="SENTENCE", help="The source sentence to translate.")
    ],
    checkpoint: Checkpoint,
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Image to write: .png (also without a suffix), .pdf or .svg."
        ),
    ] = Path("attention.png"),
    beam_size: BeamSize = None,
    length_penalty: LengthPenalty = None,
    length_normalization: LengthNormalization = None,
    max_len_a: MaxLenA = None,
    max_len_b: MaxLenB = None,
    max_input_pieces: MaxInputPieces = None,
    allow_unk: AllowUnk = None,
    alignment_layer: AlignmentLayer = None,
    tgt_lang: TranslateTgtLang = None,
    device: Device = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
) -> None:
    """Translate one sentence and draw each decoder layer's cross-attention (heads averaged) as a
    heatmap."""
    check_output(out, "--out")
    from nmt.tools.plot import check_image_format

    check_image_format(out)  # before translating
    # not at the top: `nmt --help` loads without torch
    from nmt.runs.checkpoint import checkpoint_file

    check_not_an_input(out, [("--checkpoint", checkpoint_file(checkpoint))], "--out")
    inference, settings = Asked.of(ctx.params).translator([checkpoint])
    from nmt.data.multilingual import target
    from nmt.tools.plot import plot_attention
    from nmt.translation.align import alignment_layer

    goal = target(inference.cfg, inference.tokenizer, tgt_lang)
    src_pieces, tgt_pieces, weights = sentence_attention(
        inference, sentence, settings, goal.src_prefix
    )
    marked = alignment_layer(weights.size(0), settings.alignment_layer)
    written = plot_attention(weights.numpy(), src_pieces, tgt_pieces, out, marked_layer=marked)
    typer.echo(f"wrote {written}")


def sentence_attention(inference, sentence: str, decode, src_prefix: tuple[int, ...]):
    """Translate ``sentence`` (after ``src_prefix``) with beam search and return what the decoder
    read (:meth:`nmt.translation.inference.Inference.attention`).

    Raises:
        ConfigError: the sentence is one ``nmt translate`` leaves untranslated
            (:meth:`nmt.translation.inference.Inference.untranslatable`).
    """
    from dataclasses import replace

    from nmt.translation.inference import Decoding

    line = sentence.strip()
    pieces = inference.tokenizer.encode_src([line])[0]
    why = inference.untranslatable(sentence, pieces, decode.max_input_pieces)
    if why is not None:  # what nmt translate leaves empty is not drawn
        raise ConfigError(f"the sentence to translate {why[1]}; nothing to plot")
    ((best, *_),) = inference.translate(
        [line], Decoding(replace(decode, n_best=1), src_prefix=src_prefix)
    )
    return inference.attention(line, best, src_prefix)
