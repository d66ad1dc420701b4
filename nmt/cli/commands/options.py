"""Options that several commands share, declared once, and running a checkpoint as they ask."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from nmt.config import ConfigError, DecodeConfig, validate
from nmt.errors import NmtError
from nmt.files import check_writable
from nmt.scoring.evaluate import TOKENIZERS

# torch is imported inside the functions, not here: commands that do not run a model
# (evaluate --hyp, info, --help) answer without its seconds of import time.

CKPT_HELP = "Checkpoint file, or a run directory (uses its best.pt)."
Checkpoint = Annotated[Path, typer.Option("--checkpoint", help=CKPT_HELP)]
Checkpoints = Annotated[
    list[Path],
    typer.Option(
        "--checkpoint",
        metavar="<path>",
        help=f"{CKPT_HELP[:-1]}. Repeat for an ensemble: models' next-token probabilities "
        "averaged; their tokenizers must be the same.",
    ),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="For scripts: no progress bar and no info messages on stderr (warnings and errors "
        "still print).",
    ),
]
Tokenize = Annotated[
    str | None,
    typer.Option(
        "--tokenize",
        "-t",
        help=f"sacreBLEU's BLEU tokenizer: {', '.join(TOKENIZERS)}. Default: chosen by --tgt-lang, "
        "or with --checkpoint by its config "
        "(eval.tokenize, data.tgt_lang), else 13a.",
    ),
]
TGT_LANG_HELP = (
    "Target language code. With a multilingual checkpoint, the language to translate into "
    "(required; its >>xx<< tag goes before "
    "each source, and a source language it was not trained from is zero-shot); a checkpoint of one "
    "target language takes only that one."
)
TgtLang = Annotated[
    str | None,
    typer.Option(
        "--tgt-lang",
        "-l",
        help=f"{TGT_LANG_HELP} Also picks the BLEU tokenizer as sacreBLEU does: zh → zh, ja → "
        "ja-mecab, ko → ko-mecab, others → 13a, "
        "any spelling (zho, cmn, zho_Hans, zh-Hant-TW, jpn_Jpan, kor_Hang) (with --checkpoint, as "
        "validation scored that direction).",
    ),
]
TranslateTgtLang = Annotated[str | None, typer.Option("--tgt-lang", "-l", help=TGT_LANG_HELP)]

# The decode settings, each named as the DecodeConfig field it sets; None keeps the checkpoint's.
DECODE_KEYS = tuple(f.name for f in fields(DecodeConfig))
BeamSize = Annotated[
    int | None,
    typer.Option(
        "--beam-size",
        "-b",
        help="Hypotheses kept per sentence (1 = greedy). Default: the checkpoint's "
        "decode.beam_size.",
    ),
]
LengthPenalty = Annotated[
    float | None,
    typer.Option(
        "--length-penalty",
        "-a",
        help="Length-penalty exponent α (see --length-normalization); 0 = raw log-probability. "
        "Default: the checkpoint's decode.length_penalty.",
    ),
]
LengthNormalization = Annotated[
    str | None,
    typer.Option(
        "--length-normalization",
        help="Rank finished hypotheses by log P / lp(|Y|), |Y| pieces with EOS: length |Y|^α "
        "(fairseq, Hugging Face), "
        "gnmt ((5+|Y|)/6)^α, none. Default: the checkpoint's decode.length_normalization.",
    ),
]
MaxLenA = Annotated[
    float | None, typer.Option("--max-len-a", help="Output limit = a · source tokens + b (pieces).")
]
MaxLenB = Annotated[
    int | None, typer.Option("--max-len-b", help="Output limit = a · source tokens + b (pieces).")
]
NBest = Annotated[
    int | None,
    typer.Option(
        "--n-best",
        help="Hypotheses written per input (> 1 switches to 'index ||| text ||| score' lines; a "
        "blank input line gets one empty entry). "
        "score = log P(text|source) in nats (EOS included) divided by lp(|Y|) of "
        "--length-normalization, |Y| pieces with EOS: the value beam search "
        "ranks by, higher is better.",
    ),
]
Patience = Annotated[
    float | None,
    typer.Option(
        "--patience",
        help="Also end a sentence's beam search once beam size × P hypotheses have finished "
        "(CTranslate2's patience; 1: fairseq's rule and Hugging Face's early_stopping=True): "
        "faster, not exact. 0: only when no running hypothesis can still enter the n-best "
        "(exact). Greedy search and sampling have no use for it. Default: the checkpoint's "
        "decode.patience (exact; 1 for a checkpoint written before the exact rule).",
    ),
]
MinLen = Annotated[
    int | None,
    typer.Option(
        "--min-len",
        help="No translation ends before this many pieces (EOS is forbidden until then). Default: "
        "the checkpoint's decode.min_len (0).",
    ),
]
MaxTokens = Annotated[
    int | None, typer.Option("--max-tokens", help="Source tokens per batch, padding included.")
]
MaxInputPieces = Annotated[
    int | None,
    typer.Option(
        "--max-input-pieces",
        help="Longest source line translated, in pieces (default: the checkpoint's "
        "decode.max_input_pieces, 1024); a longer line "
        "gets an empty output line and a warning on stderr.",
    ),
]
AllowUnk = Annotated[
    bool | None,
    typer.Option(
        "--allow-unk/--no-allow-unk",
        help="Let translations contain the unknown piece (printed ' ⁇ '). Default: the "
        "checkpoint's decode.allow_unk (false).",
    ),
]
ReplaceUnk = Annotated[
    bool,
    typer.Option(
        "--replace-unk",
        help="Let translations contain the unknown piece, and write in its place the source text "
        "its step attends to most (OpenNMT's -replace_unk; digits and names a vocabulary lacks "
        "come through where the model writes an unknown piece for them).",
    ),
]

AlignmentLayer = Annotated[
    int | None,
    typer.Option(
        "--alignment-layer",
        help="Decoder layer (1-based) that --print-alignment reads cross-attention from. Default: "
        "the checkpoint's "
        "decode.alignment_layer, else the penultimate layer of three or more, the last of fewer "
        "(nmt plot attention shows each layer).",
    ),
]

# How a checkpoint runs, beside its decode settings.
RUNNING = ("device", "threads", "dtype")
Device = Annotated[
    str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto (CUDA if available).")
]
Threads = Annotated[
    int, typer.Option("--threads", help="CPU threads for torch (0 = torch's default).")
]
ShortlistFile = Annotated[
    Path | None,
    typer.Option(
        "--shortlist",
        help="Restrict each batch's output to the target pieces this vocabulary shortlist allows "
        "for its source pieces (built by nmt shortlist; "
        "CTranslate2's vocabulary-map format): faster decoding, no longer exact. Default: the "
        "whole vocabulary.",
    ),
]
DType = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="Weights and activations: float32, bfloat16 (faster on GPUs and on CPUs with AMX or "
        "AVX512-BF16; several times slower on others), "
        "float16 (GPU), int8 (CPU: every linear layer dynamically quantized), or auto (bfloat16 "
        "where it is fast, else float32). Scores stay float32.",
    ),
]


def on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the command line set option ``name`` (rather than its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def setup_logging(quiet: bool = False) -> None:
    """Info messages (or, ``quiet``, only warnings and errors) on stderr, with the time."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def progress_bar(quiet: bool, total: int | None = None, unit: str = "line"):
    """A progress bar on stderr (tqdm) when stderr is a terminal and not ``quiet``; otherwise one
    that shows nothing."""
    from tqdm import tqdm

    shown = not quiet and sys.stderr is not None and sys.stderr.isatty()
    return tqdm(total=total, unit=unit, disable=not shown, dynamic_ncols=True, leave=False)


STDIN = Path("-")  # as an input, standard input; as an output, standard output


def standard_input():
    """The binary standard input.

    Raises:
        NmtError: it is closed (``nmt translate <&-``): one line, not a traceback.
    """
    if sys.stdin is None:
        raise NmtError(
            "standard input is closed; give the text with --input FILE, or open standard input (< "
            "FILE, or a pipe)"
        )
    return sys.stdin.buffer


def standard_output():
    """The text standard output (UTF-8 whatever the locale: :func:`nmt.cli.main.main` sets it).

    Raises:
        NmtError: it is closed (``nmt evaluate >&-``), so a result would go nowhere.
    """
    if sys.stdout is None:
        raise NmtError(
            "standard output is closed, so the result would be lost; redirect it to a file (> "
            "FILE) or give --output FILE where the command has it"
        )
    return sys.stdout


def check_output(path: Path | None, flag: str = "--output") -> None:
    """Fail before any work if ``path`` cannot be written (so no translation is thrown away).

    Raises:
        nmt.files.OutputError: naming ``flag``.
    """
    if path is not None:
        check_writable(path, flag)


@dataclass(frozen=True)
class Asked:
    """What a command's options ask of decoding, as one value built in one place (:meth:`of`):
    ``decode``, the :class:`~nmt.config.DecodeConfig` fields given (by field name; the rest are the
    checkpoint's), and where the model runs: ``device``, ``threads``, ``dtype``."""

    decode: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    threads: int = 0
    dtype: str = "float32"

    @classmethod
    def of(cls, params: dict[str, Any], **fixed) -> Asked:
        """From a command's parameters (``ctx.params``): each decode option the command has and
        was given (not None), by the name of the field it sets, then ``fixed``; the running options
        (:data:`RUNNING`) where the command has them."""
        given = {name: params[name] for name in DECODE_KEYS if params.get(name) is not None}
        return cls(given | fixed, **{name: params[name] for name in RUNNING if name in params})

    def device_and_dtype(self):
        """The torch device and dtype asked for, the threads set at once.

        Raises:
            ConfigError: ``--threads`` out of :data:`nmt.config.THREADS`, or a device or dtype
                this machine lacks.
        """
        import torch

        from nmt.config import THREADS
        from nmt.runtime.device import resolve_device, resolve_dtype

        if self.threads not in THREADS:
            raise ConfigError(
                f"--threads must be {THREADS} (0 = torch's default), got {self.threads}"
            )
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        dev = resolve_device(self.device, "--device")
        return dev, resolve_dtype(self.dtype, dev, "--dtype")

    def translator(self, checkpoints: list[Path]):
        """The :class:`~nmt.translation.inference.Inference` of the checkpoints (one, or several as
        an ensemble) on the device and in the dtype asked for, and the decode settings: the first
        checkpoint's with :attr:`decode` applied.

        Raises:
            ConfigError: a decode setting out of range or inconsistent (named as its config key,
                which the command line shows as the flag), or see :meth:`device_and_dtype`.
            nmt.runs.checkpoint.CheckpointError: a checkpoint is missing, damaged or differs in
                tokenizer.
        """
        from nmt.translation.inference import Inference

        replace(DecodeConfig(), **self.decode)  # each value's own range, before anything loads
        dev, dtype = self.device_and_dtype()
        inference = Inference.load(checkpoints, dev, dtype)
        decode = replace(inference.cfg.decode, **self.decode)
        validate(replace(inference.cfg, decode=decode))
        return inference, decode


#: When a long command says it is still working: seconds after its start, then every last one.
STILL_WORKING_AT = (5, 15, 30, 60)


@contextlib.contextmanager
def still_working(what: str, at: tuple[float, ...] = STILL_WORKING_AT):
    """Say on stderr, at ``at`` seconds and then every ``at[-1]`` seconds until the block ends,
    that ``what`` is still under way and for how long (``nmt export: still working, 15 s``): a
    command of a few silent minutes on a busy machine must not look hung. Nothing is said for a
    block that ends sooner."""
    done, started = threading.Event(), time.perf_counter()

    def say() -> None:
        waits = iter(at)
        due = next(waits)
        while not done.wait(max(0.0, due - (time.perf_counter() - started))):
            print(f"{what}: still working, {time.perf_counter() - started:.0f} s", file=sys.stderr)
            due = next(waits, due + at[-1])

    thread = threading.Thread(target=say, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
