"""``nmt translate``: a stream of lines in, one translation (or n-best list) per line out."""

# Size: module at most 432 lines, translate() at most 112: one command of 32 options; its body turns
# them into one Decoding value and streams lines, each option's errors beside it.

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nmt.config import ConfigError
from nmt.data.corpus import DataError, buffers, count_lines, iter_lines, stream_buffers
from nmt.files import atomic_write, check_not_an_input, inherited_fd, is_stream, resolve_output

from .options import (
    STDIN,
    AlignmentLayer,
    AllowUnk,
    Asked,
    BeamSize,
    Checkpoints,
    Device,
    DType,
    LengthNormalization,
    LengthPenalty,
    MaxInputPieces,
    MaxLenA,
    MaxLenB,
    MaxTokens,
    MinLen,
    NBest,
    Patience,
    Quiet,
    ReplaceUnk,
    ShortlistFile,
    Threads,
    TranslateTgtLang,
    check_output,
    progress_bar,
    setup_logging,
    standard_input,
    standard_output,
)

MAX_BUFFER = 10_000_000  # lines: more is more memory than a buffer needs to keep every core busy


def translate(
    ctx: typer.Context,
    checkpoint: Checkpoints,
    input: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            help="Source text, one sentence a line (plain or .gz). Default (or -): standard input.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Where to write translations. Default (or -): standard output."
        ),
    ] = None,
    buffer_size: Annotated[
        int,
        typer.Option(
            "--buffer-size",
            help="Lines read and translated together (sorted by length into batches); memory is "
            "bounded by it, not by the input. Also translated "
            "as soon as no more input is waiting, so a typed line is translated when entered.",
        ),
    ] = 1000,
    sampling: Annotated[
        bool,
        typer.Option(
            "--sampling",
            help="Draw --n-best independent random samples per line instead of beam search "
            "(back-translation, data augmentation).",
        ),
    ] = False,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature",
            help="With --sampling: log-probabilities divided by this (below 1 sharper, above 1 "
            "flatter). Default 1.",
        ),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            help="With --sampling: draw from the k most probable pieces only (0 = all, the "
            "default).",
        ),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option(
            "--top-p",
            help="With --sampling: draw from the fewest most probable pieces whose probabilities "
            "sum to at least p (nucleus; 1 = all, the default).",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            help="With --sampling: random seed (default 0); the same input, seed and options give "
            "the same samples, however batched.",
        ),
    ] = None,
    prefix_file: Annotated[
        Path | None,
        typer.Option(
            "--prefix-file",
            help="One line per input line: target text its translation must start with (an empty "
            "line: none). A prefix that ends inside "
            "a word lets the model finish the word in its own pieces; one that ends with a space "
            "makes the next piece start a word.",
        ),
    ] = None,
    constraints_file: Annotated[
        Path | None,
        typer.Option(
            "--constraints-file",
            help="One line per input line: target phrases, tab-separated, that its translation "
            "must contain, in any order, each as "
            "written (an empty line: none). Beam search only.",
        ),
    ] = None,
    ban_file: Annotated[
        Path | None,
        typer.Option(
            "--ban-file",
            help="One line per input line: target phrases, tab-separated, that its translation "
            "must not contain (an empty line: none).",
        ),
    ] = None,
    ban: Annotated[
        list[str],
        typer.Option(
            "--ban",
            metavar="<str>",
            help="A target phrase no translation may contain (repeatable; adds to --ban-file's).",
        ),
    ] = [],
    print_alignment: Annotated[
        bool,
        typer.Option(
            "--print-alignment",
            help="Add ' ||| ' and source-target alignments 'i-j' (0-based SentencePiece pieces; "
            "the cross-attention of "
            "--alignment-layer, heads averaged) after each translation.",
        ),
    ] = False,
    tgt_lang: TranslateTgtLang = None,
    quiet: Quiet = False,
    beam_size: BeamSize = None,
    length_penalty: LengthPenalty = None,
    length_normalization: LengthNormalization = None,
    max_len_a: MaxLenA = None,
    max_len_b: MaxLenB = None,
    n_best: NBest = None,
    min_len: MinLen = None,
    patience: Patience = None,
    max_tokens: MaxTokens = None,
    max_input_pieces: MaxInputPieces = None,
    allow_unk: AllowUnk = None,
    replace_unk: ReplaceUnk = False,
    alignment_layer: AlignmentLayer = None,
    device: Device = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
    shortlist: ShortlistFile = None,
) -> None:
    """Translate text with beam search (or sampling): exactly one output line per input line, in
    input order.

    Input is read and translated in buffers, each written out as soon as it is done.
    """
    setup_logging(quiet)
    input = None if input == STDIN else input  # -: standard input, as for nmt evaluate
    output = None if output == STDIN else output  # -: standard output

    def write_all(write) -> None:  # each buffer goes out as soon as it is translated
        for first, results in lines:
            write(
                "".join(
                    line + "\n"
                    for line in output_lines(
                        tokenizer, results, first, bool(n_best and n_best > 1), print_alignment
                    )
                )
            )
        if steering is not None:
            steering.check_end()  # before --output is put in place

    try:
        check_output(output)
        if output is None:
            standard_output()  # closed: one line now, not a traceback after the work
        if input is None:
            standard_input()
        # not at the top: `nmt --help` loads without torch
        from nmt.runs.checkpoint import checkpoint_file

        if output is not None:
            check_not_an_input(
                output,
                [
                    (flag, path)
                    for flag, path in (
                        ("--input", input),
                        ("--prefix-file", prefix_file),
                        ("--constraints-file", constraints_file),
                        ("--ban-file", ban_file),
                        ("--shortlist", shortlist),
                    )
                    if path is not None
                ]
                + [("--checkpoint", checkpoint_file(c)) for c in checkpoint],
            )
        if not 1 <= buffer_size <= MAX_BUFFER:
            raise ConfigError(f"--buffer-size must be 1 to {MAX_BUFFER:,} lines, got {buffer_size}")
        sampler = _sampling(sampling, temperature, top_k, top_p, seed)
        if sampler is not None and constraints_file is not None:
            raise ConfigError(
                "--constraints-file needs beam search: --sampling draws each piece and cannot make "
                "a sample hold a phrase"
            )
        inference, settings = Asked.of(ctx.params).translator(checkpoint)
        from nmt.data.multilingual import target
        from nmt.translation.inference import Decoding
        from nmt.translation.shortlist import Shortlist

        cfg, tokenizer = inference.cfg, inference.tokenizer
        goal = target(cfg, tokenizer, tgt_lang)

        steering = (
            SteeringLines(tokenizer, prefix_file, constraints_file, ban_file, ban)
            if (prefix_file or constraints_file or ban_file or ban)
            else None
        )
        chunks = (
            buffers(iter_lines(input, once=True), buffer_size)
            if input is not None
            else stream_buffers(standard_input(), buffer_size)
        )
        # a pipe is read once, by the translation
        counted = input is not None and output is not None and input.is_file()
        with progress_bar(quiet, total=count_lines(input) if counted else None) as bar:
            if input is None and sys.stdin.isatty() and not quiet:
                typer.echo(
                    "nmt translate: the model is loaded; type a sentence and press Enter (Ctrl-D "
                    "ends)",
                    err=True,
                )
            allowed = Shortlist.read(shortlist, tokenizer) if shortlist is not None else None
            decoding = Decoding(
                settings,
                sampling=sampler,
                alignment=print_alignment,
                replace_unk=replace_unk,
                src_prefix=goal.src_prefix,
                shortlist=allowed,
            )
            lines = inference.stream(chunks, decoding, steering, progress=bar.update)
            if output is None:
                out = standard_output()
                write_all(lambda text: (out.write(text), out.flush()))
            else:
                atomic_write(
                    output,
                    lambda f: write_all(lambda text: (f.write(text.encode("utf-8")), f.flush())),
                )
    except KeyboardInterrupt:  # Ctrl-C ends an interactive session; what was written stays
        # a file, not a pipe or device
        if (
            output is not None
            and inherited_fd(output) is None
            and not is_stream(resolve_output(output))
        ):
            typer.echo(
                f"nmt translate: stopped; {output} was left as it was (an output file appears only "
                "when complete:"
                " to keep translations as they come, write to standard output)",
                err=True,
            )
        raise typer.Exit(code=130) from None
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as command-line filters do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(code=141) from None


class SteeringLines:
    """One :class:`~nmt.decode.steering.Steering` per input line, read from the prefix, constraints
    and ban files in step with the input (:func:`nmt.translation.steering_text.steering`); ``bans``
    apply to every line.

    Raises:
        DataError: a file ends before the input does (when its line is needed), or, at
            :meth:`check_end`, has lines beyond the input's.
    """

    def __init__(
        self,
        tokenizer,
        prefix_file: Path | None,
        constraints_file: Path | None,
        ban_file: Path | None,
        bans: list[str],
    ):
        self.tokenizer, self.bans, self.lines = tokenizer, list(bans), 0
        self.files = {
            flag: (path, iter_lines(path, once=True))
            for flag, path in (
                ("--prefix-file", prefix_file),
                ("--constraints-file", constraints_file),
                ("--ban-file", ban_file),
            )
            if path is not None
        }

    def __iter__(self):
        from nmt.translation.steering_text import UnwritableText, steering

        while True:
            self.lines += 1
            given = {flag: self._line(flag) for flag in self.files}
            try:
                yield steering(
                    self.tokenizer,
                    given.get("--prefix-file", ""),
                    given.get("--constraints-file", "").split("\t"),
                    [*given.get("--ban-file", "").split("\t"), *self.bans],
                )
            except UnwritableText as exc:
                flag = "--prefix-file" if exc.field == "prefix" else "--constraints-file"
                raise exc.located(self.files[flag][0], self.lines) from None

    def _line(self, flag: str) -> str:
        path, lines = self.files[flag]
        line = next(lines, None)
        if line is None:
            raise DataError(
                f"{flag} {path} has {self.lines - 1} lines, the input has more: give one line per "
                "input line (an empty line for none)"
            )
        return line

    def check_end(self) -> None:
        """Raise if a file has lines beyond the input's (the input had ``lines - 1`` lines read
        ahead by none)."""
        for flag, (path, lines) in self.files.items():
            if next(lines, None) is not None:
                raise DataError(
                    f"{flag} {path} has more lines than the input: give one line per input line"
                )


def _sampling(
    sampling: bool,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
):
    """The :class:`~nmt.decode.sampling.Sampling` the flags ask for, or None for beam search.

    Raises:
        ConfigError: a sampling flag without ``--sampling``, or one out of range.
    """
    given = {"--temperature": temperature, "--top-k": top_k, "--top-p": top_p, "--seed": seed}
    if not sampling:
        if any(v is not None for v in given.values()):
            raise ConfigError(
                f"{', '.join(k for k, v in given.items() if v is not None)} only apply with "
                "--sampling"
            )
        return None
    from nmt.config import SEED
    from nmt.decode.search import Sampling

    chosen = Sampling(
        *(
            v if v is not None else d
            for v, d in zip((temperature, top_k, top_p, seed), (1.0, 0, 1.0, 0))
        )
    )
    if not chosen.temperature > 0:
        raise ConfigError(f"--temperature must be above 0, got {chosen.temperature}")
    if chosen.top_k < 0:
        raise ConfigError(f"--top-k must be 0 (no limit) or more, got {chosen.top_k}")
    if not 0 < chosen.top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {chosen.top_p}")
    if chosen.seed not in SEED:
        raise ConfigError(f"--seed must be {SEED}, got {chosen.seed}")
    return chosen


def output_lines(tokenizer, results, first: int, n_best: bool, alignment: bool) -> list[str]:
    """The output lines of one buffer: best translations, or ``index ||| text ||| score`` lines
    (``first``: the buffer's first input index); ``alignment`` adds ``||| i-j ...`` after the
    text."""
    from nmt.decode.search import Hypothesis
    from nmt.translation.align import format_alignment

    if not n_best:
        rows = [(None, r[0] if r else Hypothesis([], 0.0, 0.0, ())) for r in results]
    else:  # a blank input line still gets one (empty) entry, so every index appears
        rows = [
            (first + i, h)
            for i, hyps in enumerate(results)
            for h in hyps or [Hypothesis([], 0.0, 0.0, ())]
        ]
    texts = tokenizer.decode_tgt([h.tokens for _, h in rows], [h.copied for _, h in rows])
    lines = []
    for (index, h), text in zip(rows, texts):
        parts = (
            ([str(index)] if n_best else [])
            + [text]
            + ([format_alignment(h.alignment)] if alignment else [])
            + ([f"{h.score:.4f}"] if n_best else [])
        )
        lines.append(" ||| ".join(parts))
    return lines
