"""``nmt import``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def import_(
    source: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="A Hugging Face MarianMTModel directory (an OPUS-MT model as downloaded: "
            "config.json, "
            "vocab.json, source.spm, target.spm, model.safetensors or pytorch_model.bin).",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Where to write the nmt checkpoint, e.g. opus-mt-en-de.pt."
        ),
    ],
    format: Annotated[
        str,
        typer.Option(
            "--format", help="huggingface: a MarianMTModel directory (the only format so far)."
        ),
    ] = "huggingface",
    src_lang: Annotated[
        str | None,
        typer.Option(
            "--src-lang",
            help="Source language code (default: tokenizer_config.json's source_lang).",
        ),
    ] = None,
    tgt_lang: Annotated[
        str | None,
        typer.Option(
            "--tgt-lang",
            help="Target language code (default: tokenizer_config.json's target_lang); picks the "
            "BLEU tokenizer as data.tgt_lang does.",
        ),
    ] = None,
) -> None:
    """Import a pretrained model as an nmt checkpoint: translate, evaluate, serve and export it, or
    fine-tune it with nmt train --init-from.

    The checkpoint translates as transformers' MarianTokenizer and MarianMTModel.generate() do,
    token for token (its decode defaults come from generation_config.json); a setting nmt cannot
    represent is refused, naming its key. Works offline from the directory.
    """
    from nmt.interop.importing import import_checkpoint

    from .options import setup_logging, still_working

    setup_logging()
    with still_working("nmt import"):
        payload = import_checkpoint(source, out, format, src_lang, tgt_lang)
    cfg = payload["config"]
    m = cfg["model"]
    typer.echo(
        f"wrote {out}: {m['d_model']}-wide {m['n_encoder_layers']}+{m['n_decoder_layers']}-layer "
        "Marian model, "
        f"{payload['imported_from']['vocab_size']:,} pieces, "
        + (
            f"directions {', '.join(cfg['data']['directions'])} (choose one with --tgt-lang)"
            if cfg["data"].get("directions")
            else f"{cfg['data']['src_lang']}→{cfg['data']['tgt_lang']}"
        )
    )
