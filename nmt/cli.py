"""The ``nmt`` command line: train, translate, evaluate."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from .config import ConfigError, load_config, validate
from .corpus import DataError, read_lines
from .evaluate import EvaluationError, score
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
    help="nmt: train Transformer translation models, translate with them, score the output, export them.",
)


def user_errors() -> tuple[type[Exception], ...]:
    """Errors reported as one line and exit code 2 (evaluated only when one is raised)."""
    from .checkpoint import CheckpointError

    return (ConfigError, DataError, TokenizerError, CheckpointError, EvaluationError)


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code=2)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def _check_output(path: Optional[Path]) -> None:
    """Fail before any work if ``path`` cannot be written (so no translation is thrown away)."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"--output {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise ConfigError(f"--output {path}: directory {path.parent} does not exist; create it first")


def _read_stdin() -> list[str]:
    """Standard input as lines, with the same rules as :func:`nmt.corpus.read_lines`."""
    raw = sys.stdin.buffer.read()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"<stdin>:{line}: invalid UTF-8; convert the input to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (sections model, data, tokenizer, train, decode)."),
    set_: list[str] = typer.Option([], "--set", metavar="SECTION.KEY=VALUE", help="Override a config value: section.key=value, e.g. train.max_steps=2000 (repeatable)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory for checkpoints, tokenizer and logs (same as --set train.run_dir=...)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the run directory from its last.pt (config comes from the checkpoint; --set may override)."),
) -> None:
    """Train a SentencePiece tokenizer and a Transformer, validating and checkpointing as it goes."""
    from .train import train as run_training

    _setup_logging()
    overrides = list(set_) + ([f"train.run_dir={run_dir}"] if run_dir else [])
    # SIGTERM (kill, timeout, schedulers) stops the data preparation as Ctrl-C does; the
    # training loop installs its own handler, which saves last.pt first.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cfg = load_config(config, overrides)
        result = run_training(cfg, resume=resume, overrides=overrides)
    except user_errors() as exc:
        _fail(exc)
    except KeyboardInterrupt:
        typer.echo("error: interrupted before training started; no checkpoint was written or changed", err=True)
        raise typer.Exit(code=130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one result line
        typer.echo(json.dumps({k: v for k, v in result.items() if k != "example"}))
    if result["interrupted"]:
        raise typer.Exit(code=130)


def _translate(checkpoint: Path, lines: list[str], beam_size, length_penalty, max_len_a, max_len_b, n_best, max_tokens, device, threads, dtype="float32"):
    import torch

    from .translate import load_model, resolve_device, translate_lines

    if threads > 0:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    model, tokenizer, cfg = load_model(checkpoint, dev)
    model.to(getattr(torch, dtype))
    changes = dict(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b, n_best=n_best, max_tokens=max_tokens)
    decode = replace(cfg.decode, **{k: v for k, v in changes.items() if v is not None})
    if decode.beam_size < 1:
        raise ConfigError(f"--beam-size must be at least 1, got {decode.beam_size}")
    validate(replace(cfg, decode=decode))
    return translate_lines(model, tokenizer, lines, decode, dev), tokenizer


BEAM = typer.Option(None, "--beam-size", "-b", help="Hypotheses kept per sentence (1 = greedy). Default: the checkpoint's decode.beam_size.")
ALPHA = typer.Option(None, "--length-penalty", "-a", help="GNMT length-penalty exponent α in ((5+|Y|)/6)^α; 0 = raw log-probability.")
MAXA = typer.Option(None, "--max-len-a", help="Output limit = a · source tokens + b (pieces).")
MAXB = typer.Option(None, "--max-len-b", help="Output limit = a · source tokens + b (pieces).")
NBEST = typer.Option(None, "--n-best", help="Hypotheses written per input (> 1 switches to 'index ||| text ||| score' lines; a blank input line gets one empty entry).")
MAXTOK = typer.Option(None, "--max-tokens", help="Source tokens per batch, padding included.")
DEVICE = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto.")
THREADS = typer.Option(0, "--threads", help="CPU threads for torch (0 = torch's default).")
DTYPE = typer.Option("float32", "--dtype", help="Weights and activations: float32, bfloat16 (faster on CPUs with AMX and on GPUs) or float16 (GPU). Scores stay float32.")


@app.command()
def translate(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt)."),
    input: Optional[Path] = typer.Option(None, "--input", "-i", help="Source text, one sentence a line (plain or .gz). Default: standard input."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write translations. Default: standard output."),
    beam_size: Optional[int] = BEAM,
    length_penalty: Optional[float] = ALPHA,
    max_len_a: Optional[float] = MAXA,
    max_len_b: Optional[int] = MAXB,
    n_best: Optional[int] = NBEST,
    max_tokens: Optional[int] = MAXTOK,
    device: str = DEVICE,
    threads: int = THREADS,
    dtype: str = DTYPE,
) -> None:
    """Translate text with beam search: exactly one output line per input line, in input order."""
    try:
        _check_output(output)
        lines = read_lines(input) if input is not None else _read_stdin()
        results, tokenizer = _translate(checkpoint, lines, beam_size, length_penalty, max_len_a, max_len_b, n_best, max_tokens, device, threads, dtype)
    except user_errors() as exc:
        _fail(exc)
    if n_best and n_best > 1:
        # A blank input line has no hypotheses: it still gets one (empty) entry, so every index appears.
        from .search import Hypothesis

        out = [f"{i} ||| {tokenizer.decode_tgt([h.tokens])[0]} ||| {h.score:.4f}" for i, hyps in enumerate(results) for h in hyps or [Hypothesis([], 0.0, 0.0)]]
    else:
        from .translate import best_strings

        out = best_strings(tokenizer, results)
    text = "".join(line + "\n" for line in out)
    if output is None:
        sys.stdout.write(text)
    else:
        _write_atomic(output, text)


@app.command()
def evaluate(
    ref: list[Path] = typer.Option(..., "--ref", "-r", help="Reference file (repeat for several references)."),
    hyp: Optional[Path] = typer.Option(None, "--hyp", help="Detokenized hypotheses, one a line."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Translate --src with this checkpoint first, then score."),
    src: Optional[Path] = typer.Option(None, "--src", help="Source text to translate (with --checkpoint)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="With --checkpoint: also write the translations here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
    beam_size: Optional[int] = BEAM,
    length_penalty: Optional[float] = ALPHA,
    max_tokens: Optional[int] = MAXTOK,
    device: str = DEVICE,
    threads: int = THREADS,
    dtype: str = DTYPE,
) -> None:
    """Score translations with sacreBLEU (BLEU and chrF, with signatures)."""
    try:
        _check_output(output)
        references = [read_lines(r) for r in ref]
        if checkpoint is not None:
            if src is None:
                raise ConfigError("--checkpoint needs --src (the text to translate)")
            results, tokenizer = _translate(checkpoint, read_lines(src), beam_size, length_penalty, None, None, 1, max_tokens, device, threads, dtype)
            from .translate import best_strings

            hyps = best_strings(tokenizer, results)
            if output is not None:
                _write_atomic(output, "".join(h + "\n" for h in hyps))
        elif hyp is not None:
            hyps = read_lines(hyp)
        else:
            raise ConfigError("give --hyp FILE, or --checkpoint CKPT with --src FILE")
        result = score(hyps, references, tuple(str(r) for r in ref))
    except user_errors() as exc:
        _fail(exc)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(f"BLEU = {result['bleu']:.2f}  ({result['bleu_signature']})\n{result['bleu_detail']}\nchrF = {result['chrf']:.2f}  ({result['chrf_signature']})")


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(None, help="Checkpoints to average (or give --run-dir)."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the averaged checkpoint (must not be an input)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Average this run's newest step_N.pt checkpoints."),
    last: int = typer.Option(5, "--last", help="With --run-dir: how many of the newest step checkpoints."),
) -> None:
    """Average model weights of several checkpoints (the paper averages the last 5)."""
    from .average import average_checkpoints, step_checkpoints

    try:
        paths = list(checkpoints or [])
        if run_dir is not None:
            paths += step_checkpoints(run_dir)[-last:]
        payload = average_checkpoints(paths, out)
    except user_errors() as exc:
        _fail(exc)
    typer.echo(f"averaged {len(payload['averaged_from'])} checkpoints into {out}")


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="A run directory with metrics.jsonl."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="PNG to write (default RUN_DIR/metrics.png)."),
) -> None:
    """Plot training/validation loss, validation BLEU and the learning rate over steps."""
    from .plot import plot_metrics

    try:
        path = plot_metrics(run_dir, out)
    except user_errors() as exc:
        _fail(exc)
    typer.echo(f"wrote {path}")


@app.command()
def export(
    out_dir: Path = typer.Argument(..., help="Directory to write (created if missing)."),
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Checkpoint file, or a run directory (uses its best.pt)."),
    format: str = typer.Option("huggingface", "--format", help="Only 'huggingface' (a MarianMTModel directory) for now."),
) -> None:
    """Write a checkpoint as a Hugging Face MarianMTModel directory (model, config, tokenizer).

    The result loads with transformers' from_pretrained. For CTranslate2 use
    nmt.export.export_ctranslate2 (pip install ctranslate2): the stock
    ct2-transformers-converter assumes Marian's zero-embedding decoder start, which nmt
    models do not use. Needs `pip install transformers`.
    """
    import torch

    from .export import ExportError, export_huggingface
    from .translate import load_model

    try:
        if format != "huggingface":
            raise ConfigError(f"--format {format!r} is not supported; use huggingface")
        model, tokenizer, _ = load_model(checkpoint, torch.device("cpu"))
        export_huggingface(model, tokenizer, out_dir)
    except (*user_errors(), ExportError) as exc:
        _fail(exc)
    except ImportError:
        _fail(RuntimeError("exporting needs transformers: pip install transformers"))
    typer.echo(f"wrote {out_dir}")


def main() -> None:
    app()
