"""``nmt evaluate``: sacreBLEU scores of translations, given or made by a checkpoint."""

# Size: evaluate() at most 72: Typer declares every option, with its help, in the command's
# signature; the body reads them in the order they are checked, before anything is translated.

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nmt.data.corpus import read_lines, stream_buffers
from nmt.errors import NmtError
from nmt.files import atomic_write, check_not_an_input
from nmt.scoring.evaluate import (
    LANGUAGE_TOKENIZERS,
    bleu_tokenizer,
    check_inputs,
    check_line_counts,
    check_tokenizer,
    cjk_language,
    config_tokenizer,
    guess_cjk_language,
    score,
)

from .options import (
    DECODE_KEYS,
    RUNNING,
    STDIN,
    AllowUnk,
    Asked,
    BeamSize,
    Device,
    DType,
    LengthNormalization,
    LengthPenalty,
    MaxInputPieces,
    MaxLenA,
    MaxLenB,
    MaxTokens,
    MinLen,
    Patience,
    Quiet,
    ReplaceUnk,
    ShortlistFile,
    TgtLang,
    Threads,
    Tokenize,
    check_output,
    on_command_line,
    progress_bar,
    setup_logging,
    standard_input,
    standard_output,
)


def evaluate(
    ctx: typer.Context,
    ref: Annotated[
        list[Path],
        typer.Option(
            "--ref",
            "-r",
            metavar="<path>",
            help="Reference file (repeat for several references; - reads standard input).",
        ),
    ],
    hyp: Annotated[
        Path | None,
        typer.Option("--hyp", help="Detokenized hypotheses, one a line (- reads standard input)."),
    ] = None,
    checkpoint: Annotated[
        list[Path],
        typer.Option(
            "--checkpoint",
            metavar="<path>",
            help="Translate --src with this checkpoint first (repeat for an ensemble), then score.",
        ),
    ] = [],
    src: Annotated[
        Path | None,
        typer.Option(
            "--src", help="Source text to translate (with --checkpoint; - reads standard input)."
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="With --checkpoint: also write the translations here."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object (unrounded scores) instead of text."),
    ] = False,
    tokenize: Tokenize = None,
    tgt_lang: TgtLang = None,
    quiet: Quiet = False,
    beam_size: BeamSize = None,
    length_penalty: LengthPenalty = None,
    length_normalization: LengthNormalization = None,
    max_len_a: MaxLenA = None,
    max_len_b: MaxLenB = None,
    min_len: MinLen = None,
    patience: Patience = None,
    max_tokens: MaxTokens = None,
    max_input_pieces: MaxInputPieces = None,
    allow_unk: AllowUnk = None,
    replace_unk: ReplaceUnk = False,
    device: Device = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
    shortlist: ShortlistFile = None,
) -> None:
    """Score translations with sacreBLEU (BLEU and chrF, with signatures)."""
    setup_logging(quiet)
    standard_output()  # the score goes there: closed, it would be lost
    settings_given = [
        p.name
        for p in ctx.command.params
        if p.name in (*DECODE_KEYS, *RUNNING, "shortlist", "replace_unk")
        and on_command_line(ctx, p.name)
    ]
    check_inputs(hyp, checkpoint, src, output, settings_given)
    if output == STDIN:
        raise NmtError(
            "--output -: standard output takes the scores; give a file for the translations"
        )
    check_output(output)
    if output is not None:
        # not at the top: `nmt --help` loads without torch
        from nmt.runs.checkpoint import checkpoint_file

        readers = (
            [("--src", src), ("--shortlist", shortlist)]
            + [("--ref", r) for r in ref]
            + [("--checkpoint", checkpoint_file(c)) for c in checkpoint]
        )
        check_not_an_input(output, [(flag, path) for flag, path in readers if path is not None])
    read = _reader([("--hyp", hyp), ("--src", src)] + [("--ref", r) for r in ref])
    references = [read(r) for r in ref]
    ref_names = tuple("<stdin>" if r == STDIN else str(r) for r in ref)
    # with a checkpoint, --tgt-lang chooses the direction
    chosen = bleu_tokenizer(tokenize, tgt_lang) if tokenize is not None or not checkpoint else None
    # a tokenizer asked for by name, not chosen by a language
    named = tokenize not in (None, "auto")
    if chosen is not None:
        check_tokenizer(chosen)  # before translating, not after
    if checkpoint:
        inference, settings = Asked.of(ctx.params, n_best=1).translator(checkpoint)
        from nmt.data.multilingual import target
        from nmt.translation.inference import Decoding
        from nmt.translation.shortlist import Shortlist

        cfg, tokenizer = inference.cfg, inference.tokenizer
        goal = target(cfg, tokenizer, tgt_lang)
        chosen = chosen or config_tokenizer(cfg, goal.lang)  # as validation scored this direction
        # the language that chose, for the warning below
        named, tgt_lang = (named or cfg.eval.tokenize != "auto", goal.lang)
        check_tokenizer(chosen)
        sources = read(src)
        # before translating, not after
        check_line_counts(len(sources), "source lines", references, ref_names)
        allowed = Shortlist.read(shortlist, tokenizer) if shortlist is not None else None
        with progress_bar(quiet, total=len(sources)) as bar:
            decoding = Decoding(
                settings, src_prefix=goal.src_prefix, shortlist=allowed, replace_unk=replace_unk
            )
            # one buffer, streamed: its end says the lines warned of but not named
            ((_, results),) = inference.stream([sources], decoding, progress=bar.update)
            hyps = inference.best_strings(results)
        if output is not None:
            atomic_write(output, "".join(h + "\n" for h in hyps))
    else:
        hyps = read(hyp)
    result = score(hyps, references, ref_names, chosen)
    if not named:
        _warn_if_unsegmented(references[0], chosen, tgt_lang, bool(checkpoint))
    if as_json:
        typer.echo(json.dumps(result))
    else:
        # sacreBLEU's BLEU line already starts with "BLEU = score": print it, not a second score
        # line.
        typer.echo(
            f"{result['bleu_detail']}\n  signature: {result['bleu_signature']}\nchrF = "
            f"{result['chrf']:.2f}\n  signature: {result['chrf_signature']}"
        )


def _warn_if_unsegmented(
    references: list[str], chosen: str, tgt_lang: str | None, checkpoint: bool
) -> None:
    """Warn in one line when ``references`` look like Chinese, Japanese or Korean text
    (:func:`nmt.scoring.evaluate.guess_cjk_language`) and the tokenizer chosen for them is 13a,
    whatever ``tgt_lang`` (``--tgt-lang``, or the checkpoint's) said: a code that names no such
    language (:func:`nmt.scoring.evaluate.cjk_language`) chooses 13a, which scores such text,
    unsegmented, near 0."""
    guessed = guess_cjk_language(references) if chosen == "13a" else None
    if guessed:
        said = ""
        if tgt_lang and cjk_language(tgt_lang.replace("_", "-").split("-")[0]):
            said = f" (language code {tgt_lang} names a script other than Han, kana or Hangul)"
        elif tgt_lang:
            said = f" (language code {tgt_lang} is none nmt knows for Chinese, Japanese or Korean)"
        tokenizer = LANGUAGE_TOKENIZERS[guessed]
        fix = (
            f"pass --tokenize {tokenizer}"
            if checkpoint
            else f"pass --tgt-lang {guessed} (or --tokenize NAME)"
        )
        typer.echo(
            f"warning: the references look like {guessed} text, which sacreBLEU scores with "
            f"tokenizer {tokenizer}, not 13a{said}: {fix}",
            err=True,
        )


def _reader(inputs: list[tuple[str, Path | None]]):
    """``read(path)``: a file's lines (:func:`nmt.data.corpus.read_lines`), or standard input's for
    ``-``.

    Raises:
        NmtError: ``-`` given for more than one input: standard input can be read once; one
            file given twice as ``--ref``: it would count as two references.
    """
    dashes = [flag for flag, path in inputs if path == STDIN]
    if len(dashes) > 1:
        raise NmtError(
            f"{len(dashes)} inputs ({', '.join(dashes)}) name standard input (-), which can be "
            "read once: give files for all but one"
        )
    refs = [(p, Path(p).resolve()) for flag, p in inputs if flag == "--ref" and p != STDIN]
    same = next(
        ([p for p, g in refs if g == f] for _, f in refs if [g for _, g in refs].count(f) > 1), []
    )
    if same:
        raise NmtError(
            f"--ref {' and --ref '.join(map(str, same))} are one file ({Path(same[0]).resolve()}): "
            "it would count as several references; give it once"
        )

    def read(path: Path) -> list[str]:
        if path != STDIN:
            return read_lines(path)
        return [line for lines in stream_buffers(standard_input(), 10_000) for line in lines]

    return read
