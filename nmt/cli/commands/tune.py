"""``nmt tune-decode``: BLEU over a grid of decoding settings on a validation set."""

# Size: tune_decode() at most 65: the grid, its ties and the flags it prints are one loop over one
# validation set.

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from nmt.config import ConfigError
from nmt.scoring.evaluate import bleu_tokenizer, check_tokenizer, config_tokenizer

from .options import (
    AllowUnk,
    Asked,
    Checkpoint,
    Device,
    DType,
    MaxInputPieces,
    MaxTokens,
    Quiet,
    TgtLang,
    Threads,
    Tokenize,
    progress_bar,
    setup_logging,
    standard_output,
)


def tune_decode(
    ctx: typer.Context,
    checkpoint: Checkpoint,
    src: Annotated[
        Path, typer.Option("--src", help="Validation source text (never the test set).")
    ],
    ref: Annotated[
        Path,
        typer.Option("--ref", "-r", help="Validation reference text, line for line with --src."),
    ],
    beam_sizes: Annotated[
        str, typer.Option("--beam-sizes", help="Comma-separated beam sizes to try (1 = greedy).")
    ] = "1,5",
    normalizations: Annotated[
        str,
        typer.Option(
            "--length-normalizations",
            help="Comma-separated: gnmt, length, none (see translate --length-normalization).",
        ),
    ] = "gnmt,length",
    alphas: Annotated[
        str,
        typer.Option(
            "--length-penalties", help="Comma-separated length-penalty exponents α to try."
        ),
    ] = "0.6,1.0,1.5,2.0",
    patiences: Annotated[
        str,
        typer.Option(
            "--patiences",
            help="Comma-separated stopping rules to try: 0 the exact rule, P > 0 also end once "
            "beam size × P hypotheses have finished (see translate --patience).",
        ),
    ] = "0",
    max_sentences: Annotated[
        int | None,
        typer.Option(
            "--max-sentences", help="Use only the first N lines (a fixed, faster sample)."
        ),
    ] = None,
    allow_test_names: Annotated[
        bool,
        typer.Option(
            "--allow-test-names",
            help="Accept a file whose name says test (e.g. WMT's newstest2013 used as a validation "
            "set).",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object (rows and best) instead of a table."),
    ] = False,
    tokenize: Tokenize = None,
    tgt_lang: TgtLang = None,
    quiet: Quiet = False,
    max_tokens: MaxTokens = None,
    max_input_pieces: MaxInputPieces = None,
    allow_unk: AllowUnk = None,
    device: Device = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
) -> None:
    """Choose beam size, stopping rule, length normalisation and α on a validation set: prints
    BLEU for each setting of a small grid and the best one. Settings chosen on the test set
    overstate its score, so a file named like a test set (test*, *_test*, newstest*) is refused."""
    from nmt.tools.tune import grid, validation_lines
    from nmt.tools.tune import tune_decode as run_grid

    setup_logging(quiet)
    settings = grid(
        _csv("--beam-sizes", beam_sizes, int),
        _csv("--length-normalizations", normalizations, str),
        _csv("--length-penalties", alphas, float),
        [p or None for p in _csv("--patiences", patiences, float)],
    )
    src_lines, ref_lines = validation_lines(src, ref, max_sentences, allow_test_names)
    chosen = None if tokenize is None else bleu_tokenizer(tokenize, tgt_lang)
    if chosen:
        check_tokenizer(chosen)  # before translating, not after
    standard_output()  # the table goes there: closed, it would be lost
    inference, decode = Asked.of(ctx.params).translator([checkpoint])
    from nmt.data.multilingual import target

    cfg, tokenizer = inference.cfg, inference.tokenizer
    goal = target(cfg, tokenizer, tgt_lang)
    chosen = chosen or config_tokenizer(cfg, goal.lang)  # as validation scored this run's direction
    check_tokenizer(chosen)
    searches = len({(s.beam_size, s.patience) for s in settings})
    with progress_bar(quiet, total=len(src_lines) * searches) as bar:
        rows = run_grid(
            inference,
            src_lines,
            ref_lines,
            decode,
            settings,
            tokenize=chosen,
            progress=bar.update,
            src_prefix=goal.src_prefix,
        )
    best = choose(rows, decode, len(src_lines))
    flags = flags_of(best)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "src": str(src),
                    "ref": str(ref),
                    "sentences": len(src_lines),
                    "rows": rows,
                    "best": best,
                    "flags": flags,
                }
            )
        )
        return
    typer.echo(f"{len(src_lines)} sentences of {src}; {rows[0]['bleu_signature']}")
    typer.echo(
        f"{'beam':>4} {'patience':>8} {'normalization':>13} {'alpha':>5} {'BLEU':>6} {'chrF':>6} "
        f"{'len ratio':>9} {'search s':>8}"
    )
    for r in rows:
        typer.echo(
            f"{r['beam_size']:>4} {r['patience'] or 'exact':>8} {r['length_normalization']:>13} "
            f"{r['length_penalty']:>5} {r['bleu']:>6.2f} {r['chrf']:>6.2f} "
            f"{r['length_ratio']:>9.3f} {r['search_s']:>8}"
        )
    typer.echo(f"best: BLEU {best['bleu']:.2f} with {flags}")


def flags_of(row: dict) -> str:
    """The ``nmt translate`` flags of a grid row's setting."""
    return (
        f"--beam-size {row['beam_size']} --length-normalization {row['length_normalization']} "
        f"--length-penalty {row['length_penalty']} --patience {row['patience'] or 0:g}"
    )


#: Fewer validation lines than this cannot tell search settings apart: a setting's BLEU moves by
#: whole points with one sentence.
FEW_SENTENCES = 100


def choose(rows: list[dict], decode, sentences: int) -> dict:
    """The best row: the highest BLEU, then chrF; among settings still equal, the checkpoint's own
    (``decode``), else the smallest beam (the fastest), the first of those in the grid's order, so
    that a tie never changes what is there by the grid's order. Warns in one line, naming the flags
    kept, when settings tie, and when ``sentences`` are too few to tell them apart
    (:data:`FEW_SENTENCES`)."""
    top = max((r["bleu"], r["chrf"]) for r in rows)
    tied = [r for r in rows if (r["bleu"], r["chrf"]) == top]
    own = lambda r: (
        (r["beam_size"], r["length_normalization"], r["length_penalty"], r["patience"])
        == (decode.beam_size, decode.length_normalization, decode.length_penalty, decode.patience)
    )
    best = next((r for r in tied if own(r)), min(tied, key=lambda r: r["beam_size"]))
    log = logging.getLogger("nmt.tune")
    if len(tied) > 1:
        log.warning(
            "warning: %d of %d settings tie at BLEU %.2f and chrF %.2f; kept %s: %s",
            len(tied),
            len(rows),
            *top,
            "the checkpoint's own"
            if own(best)
            else "the smallest beam's first in the grid's order",
            flags_of(best),
        )
    if sentences < FEW_SENTENCES:
        log.warning(
            "warning: %d sentences cannot tell search settings apart reliably; tune on a "
            "validation set of hundreds of lines",
            sentences,
        )
    return best


def _csv(flag: str, text: str, kind: type) -> list:
    """``text`` ("1,4,5") as a list of ``kind``.

    Raises:
        ConfigError: naming ``flag``, for text that is not such a list.
    """
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r}: expected comma-separated {kind.__name__} values, e.g. {flag} 1,4,5"
        ) from None
    if not values:
        raise ConfigError(f"{flag} is empty; give at least one value")
    return values
