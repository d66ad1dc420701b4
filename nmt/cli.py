"""The ``nmt`` command line: train, translate, evaluate, average, plot, info, export, serve."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from .config import ConfigError, DecodeConfig, load_config, validate
from .corpus import DataError, buffers, iter_lines, read_lines, stream_buffers
from .evaluate import LANGUAGE_TOKENIZERS, TOKENIZERS, EvaluationError, bleu_tokenizer, check_tokenizer, config_tokenizer, guess_cjk_language, score
from .files import OutputError, atomic_write, check_writable
from .tokenizer import TokenizerError

# torch is imported inside the commands, not here: encoding workers are spawned processes
# that re-import this module (the `nmt` script's), and need only SentencePiece and NumPy.

# Plain help, not Rich panels: typer 0.29's Rich panel prints a `<bool>` type after every flag
# (`--resume <bool>`, as if it took a value), while its plain formatter leaves flags bare.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


def user_errors() -> tuple[type[Exception], ...]:
    """Errors reported as one line and exit code 2 (evaluated only when one is raised)."""
    from .checkpoint import CheckpointError

    return (ConfigError, DataError, TokenizerError, CheckpointError, EvaluationError, OutputError)


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code=2)


QUIET = typer.Option(False, "--quiet", "-q", help="For scripts: no progress bar and no info messages on stderr (warnings and errors still print).")


def _setup_logging(quiet: bool = False) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def _check_output(path: Optional[Path], flag: str = "--output") -> None:
    """Fail before any work if ``path`` cannot be written (so no translation is thrown away)."""
    if path is not None:
        check_writable(path, flag)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (sections model, data, tokenizer, train, decode)."),
    set_: list[str] = typer.Option([], "--set", metavar="SECTION.KEY=VALUE", help="Override a config value: section.key=value, e.g. train.max_steps=2000 (repeatable)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory for checkpoints, tokenizer and logs (same as --set train.run_dir=...)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the run directory from its newest checkpoint (config comes from the checkpoint; --set, and keys written in --config, may change all but model and tokenizer)."),
    quiet: bool = QUIET,
) -> None:
    """Train a SentencePiece tokenizer and a Transformer, validating and checkpointing as it goes."""
    from .train import train as run_training
    from .translate import resolve_device

    _setup_logging(quiet)
    overrides = list(set_) + ([f"train.run_dir={run_dir}"] if run_dir else []) + (["train.progress_bar=false"] if quiet else [])
    # SIGTERM (kill, timeout, schedulers) stops the data preparation as Ctrl-C does; the
    # training loop installs its own handler, which saves last.pt first.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cfg = load_config(config, overrides)
        resolve_device(cfg.train.device, "train.device")  # now, not after the tokenizer is trained
        result = run_training(cfg, resume=resume, overrides=overrides, config_file=config if resume else None)
    except user_errors() as exc:
        _fail(in_flags(exc, {"train.run_dir": "--run-dir"}) if run_dir and isinstance(exc, ConfigError) else exc)
    except KeyboardInterrupt:  # before the training loop, or a second signal inside it
        typer.echo("error: stopped at once; files already written are intact (they are replaced atomically); --resume continues from the newest checkpoint", err=True)
        raise typer.Exit(code=130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one result line
        typer.echo(json.dumps(result))
    if result["interrupted"]:
        raise typer.Exit(code=130)


@dataclass(frozen=True)
class DecodeOptions:
    """How ``translate`` and ``evaluate`` run a checkpoint: search settings that override its
    ``decode`` section (None: keep the checkpoint's), and the device, threads and dtype."""

    beam_size: Optional[int] = None
    length_penalty: Optional[float] = None
    length_normalization: Optional[str] = None
    max_len_a: Optional[float] = None
    max_len_b: Optional[int] = None
    n_best: Optional[int] = None
    max_tokens: Optional[int] = None
    max_input_pieces: Optional[int] = None
    allow_unk: Optional[bool] = None
    device: str = "auto"
    threads: int = 0
    dtype: str = "float32"

    def overrides(self) -> dict[str, Any]:
        """The ``decode`` keys given on the command line, with their values."""
        return {k: getattr(self, k) for k in DECODE_KEYS if getattr(self, k) is not None}


# The one definition of the options `translate` and `evaluate` share, by DecodeOptions field.
# Where a field is a `decode` config key, the option's flag is what errors about that key say.
_DECODE_OPTIONS: dict[str, tuple[Any, Any]] = {
    "beam_size": (Optional[int], typer.Option(None, "--beam-size", "-b", help="Hypotheses kept per sentence (1 = greedy). Default: the checkpoint's decode.beam_size.")),
    "length_penalty": (
        Optional[float],
        typer.Option(None, "--length-penalty", "-a", help="Length-penalty exponent α (see --length-normalization); 0 = raw log-probability. Default: the checkpoint's decode.length_penalty."),
    ),
    "length_normalization": (
        Optional[str],
        typer.Option(
            None,
            "--length-normalization",
            help="Rank finished hypotheses by log P / lp(|Y|), |Y| pieces with EOS: length |Y|^α (fairseq, Hugging Face), gnmt ((5+|Y|)/6)^α, none. "
            "Default: the checkpoint's decode.length_normalization.",
        ),
    ),
    "max_len_a": (Optional[float], typer.Option(None, "--max-len-a", help="Output limit = a · source tokens + b (pieces).")),
    "max_len_b": (Optional[int], typer.Option(None, "--max-len-b", help="Output limit = a · source tokens + b (pieces).")),
    "n_best": (
        Optional[int],
        typer.Option(
            None,
            "--n-best",
            help="Hypotheses written per input (> 1 switches to 'index ||| text ||| score' lines; a blank input line gets one empty entry). "
            "score = log P(text|source) in nats (EOS included) divided by lp(|Y|) of --length-normalization, |Y| pieces with EOS: "
            "the value beam search ranks by, higher is better.",
        ),
    ),
    "max_tokens": (Optional[int], typer.Option(None, "--max-tokens", help="Source tokens per batch, padding included.")),
    "max_input_pieces": (
        Optional[int],
        typer.Option(None, "--max-input-pieces", help="Longest source line translated, in pieces (default: the checkpoint's decode.max_input_pieces, 1024); a longer line gets an empty output line and a warning on stderr."),
    ),
    "allow_unk": (
        Optional[bool],
        typer.Option(None, "--allow-unk/--no-allow-unk", help="Let translations contain the unknown piece (printed ' ⁇ '). Default: the checkpoint's decode.allow_unk (false)."),
    ),
    "device": (str, typer.Option("auto", "--device", help="cpu, cuda, cuda:N, mps or auto (CUDA if available).")),
    "threads": (int, typer.Option(0, "--threads", help="CPU threads for torch (0 = torch's default).")),
    "dtype": (
        str,
        typer.Option(
            "float32",
            "--dtype",
            help="Weights and activations: float32, bfloat16 (faster on GPUs and on CPUs with AMX or AVX512-BF16; several times slower on others), "
            "float16 (GPU), int8 (CPU: every linear layer dynamically quantized), or auto (bfloat16 where it is fast, else float32). Scores stay float32.",
        ),
    ),
}
DECODE_KEYS = tuple(name for name in _DECODE_OPTIONS if name in {f.name for f in fields(DecodeConfig)})


def decode_options(*skip: str):
    """Give a command the shared decode options (all but ``skip``); they arrive as one
    :class:`DecodeOptions` in its ``decode`` parameter. Typer reads the command's signature,
    so the wrapper's signature lists the options in place of ``decode``."""

    def wrap(command):
        names = [name for name in _DECODE_OPTIONS if name not in skip]
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "decode"]
        shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_DECODE_OPTIONS[name][1], annotation=_DECODE_OPTIONS[name][0]) for name in names]

        @functools.wraps(command)
        def wrapper(**kwargs):
            decode = DecodeOptions(**{name: kwargs.pop(name) for name in names})
            return command(decode=decode, **kwargs)

        wrapper.__signature__ = inspect.signature(command).replace(parameters=own + shared)
        return wrapper

    return wrap


def _flag(name: str) -> str:
    """The command-line flag of a :class:`DecodeOptions` field."""
    return _DECODE_OPTIONS[name][1].param_decls[0]


def in_flags(exc: ConfigError, flags: dict[str, str]) -> ConfigError:
    """``exc`` reworded so that each config key the user set through a flag is named by that
    flag (``decode.max_tokens must be positive`` -> ``--max-tokens must be positive``).

    Args:
        flags: ``{"section.key": "--flag"}`` for the keys the command line set.
    """
    # A list of known keys names config keys, not flags: it stays as it is.
    message, known_sep, known = str(exc).partition("; known keys: ")
    for key, flag in flags.items():
        section, name = key.split(".")
        message = re.sub(rf"(?<![\w.-])(?:{section}\.)?{name}\b", flag, message)
    return ConfigError(message + known_sep + known)


def _load_translator(checkpoints: list[Path], options: DecodeOptions):
    """The models (one checkpoint, or several as an ensemble), tokenizer, decode settings (the
    first checkpoint's, with the options given) and device."""
    import torch

    from .translate import load_models, resolve_device, resolve_dtype

    if options.threads < 0:
        raise ConfigError(f"--threads must be >= 0 (0 = torch's default), got {options.threads}")
    if options.threads > 0:
        torch.set_num_threads(options.threads)
    dev = resolve_device(options.device, "--device")
    dtype = resolve_dtype(options.dtype, dev, "--dtype")
    models, tokenizer, cfg = load_models(checkpoints, dev, dtype)
    changes = options.overrides()
    decode = replace(cfg.decode, **changes)
    try:
        validate(replace(cfg, decode=decode))
    except ConfigError as exc:
        raise in_flags(exc, {f"decode.{k}": _flag(k) for k in changes}) from None
    return models, tokenizer, decode, dev, cfg


def _sampling(sampling: bool, temperature: Optional[float], top_k: Optional[int], top_p: Optional[float], seed: Optional[int]):
    """The :class:`~nmt.search.Sampling` the flags ask for, or None for beam search."""
    given = {"--temperature": temperature, "--top-k": top_k, "--top-p": top_p, "--seed": seed}
    if not sampling:
        if any(v is not None for v in given.values()):
            raise ConfigError(f"{', '.join(k for k, v in given.items() if v is not None)} only apply with --sampling")
        return None
    from .search import Sampling

    chosen = Sampling(*(v if v is not None else d for v, d in zip((temperature, top_k, top_p, seed), (1.0, 0, 1.0, 0))))
    if not chosen.temperature > 0:
        raise ConfigError(f"--temperature must be above 0, got {chosen.temperature}")
    if chosen.top_k < 0:
        raise ConfigError(f"--top-k must be 0 (no limit) or more, got {chosen.top_k}")
    if not 0 < chosen.top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {chosen.top_p}")
    return chosen


def _output_lines(tokenizer, results, first: int, n_best: bool, alignment: bool) -> list[str]:
    """The output lines of one buffer: best translations, or ``index ||| text ||| score`` lines
    (``first``: the buffer's first input index); ``alignment`` adds ``||| i-j ...`` after the text."""
    from .align import format_alignment
    from .search import Hypothesis

    if not n_best:
        rows = [(None, r[0] if r else Hypothesis([], 0.0, 0.0, ())) for r in results]
    else:  # a blank input line still gets one (empty) entry, so every index appears
        rows = [(first + i, h) for i, hyps in enumerate(results) for h in hyps or [Hypothesis([], 0.0, 0.0, ())]]
    texts = tokenizer.decode_tgt([h.tokens for _, h in rows])
    lines = []
    for (index, h), text in zip(rows, texts):
        fields = ([str(index)] if n_best else []) + [text] + ([format_alignment(h.alignment)] if alignment else []) + ([f"{h.score:.4f}"] if n_best else [])
        lines.append(" ||| ".join(fields))
    return lines


CHECKPOINTS = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt). Repeat for an ensemble: models' next-token probabilities averaged; their tokenizers must be the same.")


@app.command()
@decode_options()
def translate(
    checkpoint: list[Path] = CHECKPOINTS,
    input: Optional[Path] = typer.Option(None, "--input", "-i", help="Source text, one sentence a line (plain or .gz). Default: standard input."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write translations. Default: standard output."),
    buffer_size: int = typer.Option(
        1000, "--buffer-size", help="Lines read and translated together (sorted by length into batches); memory is bounded by it, not by the input. Also translated as soon as no more input is waiting, so a typed line is translated when entered."
    ),
    sampling: bool = typer.Option(False, "--sampling", help="Draw --n-best independent random samples per line instead of beam search (back-translation, data augmentation)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="With --sampling: log-probabilities divided by this (below 1 sharper, above 1 flatter). Default 1."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="With --sampling: draw from the k most probable pieces only (0 = all, the default)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="With --sampling: draw from the fewest most probable pieces whose probabilities sum to at least p (nucleus; 1 = all, the default)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="With --sampling: random seed (default 0); the same input, seed and options give the same samples, however batched."),
    print_alignment: bool = typer.Option(
        False, "--print-alignment", help="Add ' ||| ' and source-target alignments 'i-j' (0-based SentencePiece pieces; penultimate decoder layer's cross-attention, heads averaged) after each translation."
    ),
    quiet: bool = QUIET,
    decode: DecodeOptions = DecodeOptions(),
) -> None:
    """Translate text with beam search (or sampling): exactly one output line per input line, in input order.

    Input is read and translated in buffers, each written out as soon as it is done.
    """
    _setup_logging(quiet)
    try:
        _check_output(output)
        if buffer_size < 1:
            raise ConfigError(f"--buffer-size must be at least 1 line, got {buffer_size}")
        sampler = _sampling(sampling, temperature, top_k, top_p, seed)
        models, tokenizer, settings, dev, _ = _load_translator(checkpoint, decode)
        from .translate import translate_stream

        chunks = buffers(iter_lines(input), buffer_size) if input is not None else stream_buffers(sys.stdin.buffer, buffer_size)
        lines = translate_stream(models, tokenizer, chunks, settings, dev, sampling=sampler, alignment=print_alignment)
        n_best_format = bool(decode.n_best and decode.n_best > 1)

        def write_all(write) -> None:  # each buffer goes out as soon as it is translated
            for first, results in lines:
                write("".join(line + "\n" for line in _output_lines(tokenizer, results, first, n_best_format, print_alignment)))

        if output is None:
            write_all(lambda text: (sys.stdout.write(text), sys.stdout.flush()))
        else:
            atomic_write(output, lambda f: write_all(lambda text: (f.write(text.encode("utf-8")), f.flush())))
    except user_errors() as exc:
        _fail(exc)
    except KeyboardInterrupt:  # Ctrl-C ends an interactive session; what was written stays
        raise typer.Exit(code=130) from None
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as command-line filters do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(code=141) from None


def _check_evaluate_options(hyp, checkpoint, src, output, decode: DecodeOptions) -> None:
    """Refuse option combinations where one option would be silently ignored.

    Raises:
        ConfigError: naming the options that conflict.
    """
    if hyp is not None and (checkpoint is not None or src is not None):
        given = " and ".join(flag for flag, value in (("--checkpoint", checkpoint), ("--src", src)) if value is not None)
        raise ConfigError(f"--hyp (translations to score) and {given} (a source to translate) exclude each other: give one or the other")
    if hyp is None and checkpoint is None:
        raise ConfigError("nothing to score: give --hyp FILE, or --checkpoint CKPT with --src FILE" + (" (--src needs --checkpoint to translate it)" if src else ""))
    if checkpoint is not None and src is None:
        raise ConfigError("--checkpoint needs --src (the text to translate)")
    if hyp is not None:
        if output is not None:
            raise ConfigError("--output writes the translations made with --checkpoint; with --hyp there is nothing to write")
        given = [_flag(name) for name, value in vars(decode).items() if value != getattr(DecodeOptions, name)]
        if given:
            raise ConfigError(f"{', '.join(given)}: these set how --checkpoint translates; with --hyp nothing is translated")


TOKENIZE = typer.Option(
    None, "--tokenize", "-t", help=f"sacreBLEU's BLEU tokenizer: {', '.join(TOKENIZERS)}. Default: chosen by --tgt-lang, or with --checkpoint by its config (eval.tokenize, data.tgt_lang), else 13a."
)
TGT_LANG = typer.Option(None, "--tgt-lang", "-l", help="Target language code; picks the tokenizer as sacreBLEU does: zh → zh, ja → ja-mecab, ko → ko-mecab, others → 13a.")


@app.command()
@decode_options("n_best")
def evaluate(
    ref: list[Path] = typer.Option(..., "--ref", "-r", metavar="<path>", help="Reference file (repeat for several references)."),
    hyp: Optional[Path] = typer.Option(None, "--hyp", help="Detokenized hypotheses, one a line."),
    checkpoint: list[Path] = typer.Option([], "--checkpoint", help="Translate --src with this checkpoint first (repeat for an ensemble), then score."),
    src: Optional[Path] = typer.Option(None, "--src", help="Source text to translate (with --checkpoint)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="With --checkpoint: also write the translations here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (unrounded scores) instead of text."),
    tokenize: Optional[str] = TOKENIZE,
    tgt_lang: Optional[str] = TGT_LANG,
    quiet: bool = QUIET,
    decode: DecodeOptions = DecodeOptions(),
) -> None:
    """Score translations with sacreBLEU (BLEU and chrF, with signatures)."""
    _setup_logging(quiet)
    try:
        _check_evaluate_options(hyp, checkpoint or None, src, output, decode)
        _check_output(output)
        references = [read_lines(r) for r in ref]
        from_checkpoint = bool(checkpoint) and tokenize is None and tgt_lang is None
        chosen = None if from_checkpoint else bleu_tokenizer(tokenize, tgt_lang)
        if chosen is not None:
            check_tokenizer(chosen)  # before translating, not after
        if checkpoint:
            models, tokenizer, settings, dev, cfg = _load_translator(checkpoint, replace(decode, n_best=1))
            from .translate import best_strings, translate_lines

            chosen = chosen or config_tokenizer(cfg)
            check_tokenizer(chosen)
            hyps = best_strings(tokenizer, translate_lines(models, tokenizer, read_lines(src), settings, dev))
            if output is not None:
                atomic_write(output, "".join(h + "\n" for h in hyps))
        else:
            hyps = read_lines(hyp)
        result = score(hyps, references, tuple(str(r) for r in ref), chosen)
    except user_errors() as exc:
        _fail(exc)
    guessed = guess_cjk_language(references[0]) if tokenize is None and tgt_lang is None and chosen == "13a" else None
    if guessed:
        typer.echo(f"warning: the references look like {guessed} text, which sacreBLEU scores with tokenizer {LANGUAGE_TOKENIZERS[guessed]}, not 13a: "
                   f"pass --tgt-lang {guessed} (or --tokenize NAME)", err=True)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        # sacreBLEU's BLEU line already starts with "BLEU = score": print it, not a second score line.
        typer.echo(f"{result['bleu_detail']}\n  signature: {result['bleu_signature']}\nchrF = {result['chrf']:.2f}\n  signature: {result['chrf_signature']}")


def _csv(flag: str, text: str, kind: type) -> list:
    """``text`` ("1,4,5") as a list of ``kind``, or a :class:`ConfigError` naming ``flag``."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated {kind.__name__} values, e.g. {flag} 1,4,5") from None
    if not values:
        raise ConfigError(f"{flag} is empty; give at least one value")
    return values


@app.command("tune-decode")
@decode_options("beam_size", "length_penalty", "length_normalization", "max_len_a", "max_len_b", "n_best")
def tune_decode(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt)."),
    src: Path = typer.Option(..., "--src", help="Validation source text (never the test set)."),
    ref: Path = typer.Option(..., "--ref", "-r", help="Validation reference text, line for line with --src."),
    beam_sizes: str = typer.Option("1,5", "--beam-sizes", help="Comma-separated beam sizes to try (1 = greedy)."),
    normalizations: str = typer.Option("gnmt,length", "--length-normalizations", help="Comma-separated: gnmt, length, none (see translate --length-normalization)."),
    alphas: str = typer.Option("0.6,1.0,1.5,2.0", "--length-penalties", help="Comma-separated length-penalty exponents α to try."),
    max_sentences: Optional[int] = typer.Option(None, "--max-sentences", help="Use only the first N lines (a fixed, faster sample)."),
    allow_test_names: bool = typer.Option(False, "--allow-test-names", help="Accept a file whose name says test (e.g. WMT's newstest2013 used as a validation set)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (rows and best) instead of a table."),
    tokenize: Optional[str] = TOKENIZE,
    tgt_lang: Optional[str] = TGT_LANG,
    decode: DecodeOptions = DecodeOptions(),
) -> None:
    """Choose beam size, length normalisation and α on a validation set: prints BLEU for each
    setting of a small grid and the best one. Settings chosen on the test set overstate its
    score, so a file named like a test set (test*, *_test*, newstest*) is refused."""
    from .tune import grid, looks_like_test_data, tune_decode as run_grid

    try:
        for flag, path in (("--src", src), ("--ref", ref)):
            if looks_like_test_data(path) and not allow_test_names:
                raise ConfigError(
                    f"{flag} {path}: the name says test data; choose decoding settings on a validation set (tuning on the test set overstates its score),"
                    " or pass --allow-test-names if this file is a validation set named like a test set"
                )
        beams = _csv("--beam-sizes", beam_sizes, int)
        names = _csv("--length-normalizations", normalizations, str)
        exponents = _csv("--length-penalties", alphas, float)
        if min(beams) < 1:
            raise ConfigError(f"--beam-sizes must all be at least 1, got {beam_sizes!r}")
        unknown = [n for n in names if n not in ("gnmt", "length", "none")]
        if unknown:
            raise ConfigError(f"--length-normalizations: unknown {', '.join(unknown)}; choose from gnmt, length, none")
        if max_sentences is not None and max_sentences < 1:
            raise ConfigError(f"--max-sentences must be at least 1, got {max_sentences}")
        src_lines, ref_lines = read_lines(src)[:max_sentences], read_lines(ref)[:max_sentences]
        if len(src_lines) != len(ref_lines):
            raise ConfigError(f"--src {src} and --ref {ref} differ in length ({len(src_lines)} and {len(ref_lines)} lines); they must match line for line")
        chosen = None if tokenize is None and tgt_lang is None else bleu_tokenizer(tokenize, tgt_lang)
        if chosen:
            check_tokenizer(chosen)  # before translating, not after
        (model,), tokenizer, settings, dev, cfg = _load_translator([checkpoint], decode)
        chosen = chosen or config_tokenizer(cfg)  # as validation scored this run
        check_tokenizer(chosen)
        rows = run_grid(model, tokenizer, src_lines, ref_lines, settings, dev, grid(beams, names, exponents), tokenize=chosen)
    except user_errors() as exc:
        _fail(exc)
    best = max(rows, key=lambda r: r["bleu"])  # the first of equals: the smallest beam, in grid order
    flags = f"--beam-size {best['beam_size']} --length-normalization {best['length_normalization']} --length-penalty {best['length_penalty']}"
    if as_json:
        typer.echo(json.dumps({"src": str(src), "ref": str(ref), "sentences": len(src_lines), "rows": rows, "best": best, "flags": flags}))
        return
    typer.echo(f"{len(src_lines)} sentences of {src}; {rows[0]['bleu_signature']}")
    typer.echo(f"{'beam':>4} {'normalization':>13} {'alpha':>5} {'BLEU':>6} {'chrF':>6} {'len ratio':>9} {'search s':>8}")
    for r in rows:
        typer.echo(f"{r['beam_size']:>4} {r['length_normalization']:>13} {r['length_penalty']:>5} {r['bleu']:>6.2f} {r['chrf']:>6.2f} {r['length_ratio']:>9.3f} {r['search_s']:>8}")
    typer.echo(f"best: BLEU {best['bleu']:.2f} with {flags}")


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(None, help="Checkpoints to average (or give --run-dir)."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the averaged checkpoint (must not be an input)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Average this run's newest step_N.pt checkpoints."),
    last: int = typer.Option(5, "--last", help="With --run-dir: how many of the newest step checkpoints (at least 1)."),
) -> None:
    """Average model weights of several checkpoints (the paper averages the last 5)."""
    from .average import average_checkpoints
    from .rundir import step_checkpoints

    try:
        if last < 1:
            raise ConfigError(f"--last must be at least 1, got {last}")
        if run_dir is not None and not run_dir.is_dir():
            raise ConfigError(f"--run-dir {run_dir} is not a directory")
        _check_output(out, "--out")
        if re.fullmatch(r"(last|best|step_\d+)\.pt", out.name) and (out.parent / "metrics.jsonl").is_file():
            raise ConfigError(
                f"--out {out} would replace a training checkpoint of the run in {out.parent} (--resume reads last.pt, translate uses best.pt);"
                f" write the average under another name, e.g. {out.parent / 'average.pt'}"
            )
        paths = list(checkpoints or [])
        if run_dir is not None:
            paths += step_checkpoints(run_dir)[-last:]
        payload = average_checkpoints(paths, out)
    except user_errors() as exc:
        _fail(exc)
    typer.echo(f"averaged {len(payload['averaged_from'])} checkpoints into {out}")


class _PlotGroup(TyperGroup):
    """``nmt plot RUN`` stays short for ``nmt plot metrics RUN``."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["metrics", *args]
        return super().resolve_command(ctx, args)


plot_app = typer.Typer(cls=_PlotGroup, no_args_is_help=True, rich_markup_mode=None, context_settings={"max_content_width": 120}, help="Plot a run's metrics (nmt plot RUN, same as nmt plot metrics RUN) or a translation's cross-attention (nmt plot attention SENTENCE --checkpoint CKPT).")
app.add_typer(plot_app, name="plot")


@plot_app.command("metrics")
def plot_metrics(
    run_dir: Path = typer.Argument(..., help="A run directory with metrics.jsonl."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Image to write: .png (also without a suffix), .pdf or .svg. Default: RUN_DIR/metrics.png."),
) -> None:
    """Plot training/validation loss, validation BLEU and the learning rate over steps."""
    from .plot import plot_metrics as draw

    try:
        _check_output(out, "--out")
        path = draw(run_dir, out)
    except user_errors() as exc:
        _fail(exc)
    typer.echo(f"wrote {path}")


@plot_app.command("attention")
@decode_options("n_best", "max_tokens")
def plot_attention(
    sentence: str = typer.Argument(..., help="The source sentence to translate."),
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt)."),
    out: Path = typer.Option(Path("attention.png"), "--out", "-o", help="Image to write (.png)."),
    decode: DecodeOptions = DecodeOptions(),
) -> None:
    """Translate one sentence and draw each decoder layer's cross-attention (heads averaged) as a heatmap."""
    try:
        _check_output(out, "--out")
        (model,), tokenizer, settings, dev, _ = _load_translator([checkpoint], decode)
        from .align import alignment_layer, sentence_attention
        from .plot import plot_attention as draw

        src_pieces, tgt_pieces, weights = sentence_attention(model, tokenizer, sentence, settings, dev)
        path = draw(weights.numpy(), src_pieces, tgt_pieces, out, marked_layer=alignment_layer(weights.size(0)))
    except user_errors() as exc:
        _fail(exc)
    typer.echo(f"wrote {path}")


@app.command()
def info(
    checkpoint: Path = typer.Argument(..., help="Checkpoint file, or a run directory (its best.pt)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with the whole config) instead of text."),
) -> None:
    """Describe a checkpoint: step, epoch, best validation BLEU, parameters, tokenizer, file size, optimizer state, config."""
    from .info import checkpoint_info, format_info

    try:
        result = checkpoint_info(checkpoint)
    except user_errors() as exc:
        _fail(exc)
    typer.echo(json.dumps(result) if as_json else format_info(result))


EXPORT_FORMATS = ("huggingface", "ctranslate2", "nmt")


@app.command()
def export(
    out: Path = typer.Argument(..., help="Where to write: a directory (huggingface, ctranslate2; created if missing) or a file (nmt, e.g. model.pt)."),
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt)."),
    format: str = typer.Option("huggingface", "--format", help="huggingface (a MarianMTModel directory), ctranslate2 (a CTranslate2 model directory), "
                               "or nmt (a slim checkpoint: weights, config and tokenizer, no optimizer state; for translate and evaluate)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="With --format ctranslate2: int8, int8_float32, float16, bfloat16, ... (CTranslate2's names). Default: float32."),
) -> None:
    """Write a checkpoint for deployment: a Hugging Face MarianMTModel directory, a CTranslate2
    model directory, or a slim nmt checkpoint without optimizer state.

    huggingface loads with transformers' from_pretrained; ctranslate2 converts that directory
    with CTranslate2's converter (the stock ct2-transformers-converter assumes Marian's
    zero-embedding decoder start, which nmt models do not use). Both need
    `pip install -e ".[export]"`.
    """
    import tempfile

    from .export import ExportError, export_ctranslate2, export_huggingface, export_slim

    try:
        if format not in EXPORT_FORMATS:
            raise ConfigError(f"--format {format!r} is not supported; use {', '.join(EXPORT_FORMATS)}")
        if quantization is not None and format != "ctranslate2":
            raise ConfigError(f"--quantization applies to --format ctranslate2 only, not {format}")
        if format == "nmt":
            _check_output(out, "OUT")
            source = checkpoint / "best.pt" if checkpoint.is_dir() else checkpoint
            if out.exists() and source.exists() and out.samefile(source):
                raise ConfigError(f"OUT {out} is the checkpoint being exported; give another file name")
            export_slim(checkpoint, out)
        else:
            import torch

            from .translate import load_model

            model, tokenizer, _ = load_model(checkpoint, torch.device("cpu"))
            if format == "huggingface":
                export_huggingface(model, tokenizer, out)
            else:
                with tempfile.TemporaryDirectory() as hf_dir:
                    export_huggingface(model, tokenizer, Path(hf_dir))
                    export_ctranslate2(Path(hf_dir), out, quantization)
    except (*user_errors(), ExportError) as exc:
        _fail(exc)
    except ImportError as exc:
        _fail(RuntimeError(f"exporting to {format} needs {exc.name or 'transformers and ctranslate2'}: pip install -e \".[export]\""))
    except ValueError as exc:  # CTranslate2 rejects an unknown quantization with a ValueError
        if quantization is None:
            raise
        _fail(ConfigError(f"--quantization {quantization!r}: {exc}"))
    typer.echo(f"wrote {out}")


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nmt")
    except PackageNotFoundError:  # running from a source tree that pip has not installed
        from . import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"nmt {_package_version()} (torch {version('torch')}, Python {sys.version.split()[0]})")
        raise typer.Exit()


@app.callback()
def options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print nmt's version (and torch's, Python's) and exit."),
) -> None:
    """nmt: train Transformer translation models, translate with them, score the output, export them."""


@app.command()
@decode_options(*DECODE_KEYS)
def serve(
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt); one, as ensembles cannot be served yet."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; keep 127.0.0.1 unless a reverse proxy guards it."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    max_batch_tokens: int = typer.Option(4096, "--max-batch-tokens", help="Source tokens (EOS included) of concurrent requests gathered into one batch."),
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", help="How long a request waits for others to share its batch (milliseconds)."),
    max_input_pieces: int = typer.Option(256, "--max-input-pieces", help="Longest line accepted, in SentencePiece pieces (longer: HTTP 413)."),
    max_lines: int = typer.Option(64, "--max-lines", help="Most lines in one request (more: HTTP 413)."),
    max_beam_size: int = typer.Option(16, "--max-beam-size", help="Largest beam_size (and n_best) a request may ask for."),
    decode: DecodeOptions = DecodeOptions(),
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health, GET /info, and a web page at /. Needs the serve extra: pip install "nmt[serve]"."""
    try:
        from .serve import Limits, Translator, serve as run_server
    except ImportError as exc:
        _fail(RuntimeError(f"serving needs the serve extra ({exc.name} is missing): pip install \"nmt[serve]\""))
    try:
        limits = Limits(max_batch_tokens, max_wait_ms, max_input_pieces, max_lines, max_beam_size)
        limits.check()
        from .translate import resolve_device, resolve_dtype

        if decode.threads > 0:
            import torch

            torch.set_num_threads(decode.threads)
        dev = resolve_device(decode.device, "--device")
        translator = Translator.load(checkpoint, dev, resolve_dtype(decode.dtype, dev, "--dtype"))
    except user_errors() as exc:
        _fail(exc)
    run_server(translator, limits, host, port)


def main() -> None:
    app()
