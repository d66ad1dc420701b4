"""Translating lines of text with trained checkpoints (one model or an ensemble)."""

# Size: translate_lines() is over 60 lines by its signature and Args; its code is 44 lines.

from __future__ import annotations

import functools
import itertools
import logging
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .align import add_alignments
from .beams import Steering
from .checkpoint import CheckpointError, load_checkpoint, restore_model
from .config import Config, ConfigError
from .corpus import DataError
from .data import pad_sources, token_batches
from .model import Transformer
from .search import Hypothesis, Sampling, sample_seed, translate_batch
from .shortlist import Shortlist
from .tokenizer import EOS, UNK, Tokenizer, tokenizer_difference, unknown_only

log = logging.getLogger("nmt.translate")


def resolve_device(name: str, what: str = "device") -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Args:
        what: how errors name the setting (``--device``, ``train.device``).

    Raises:
        ConfigError: an unknown device, or one this machine or torch build lacks.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{what}: unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{what} {name!r} asked for, but this torch build or machine has no CUDA; use cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"{what} {name!r} asked for, but this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{what} {name!r} asked for, but this torch build or machine has no Apple MPS; use cpu or auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{what}: unsupported device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    return device


def native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU multiplies bfloat16 matrices natively: x86 AMX-BF16 or AVX512-BF16,
    or Arm's BF16 extension, read from the flags in ``/proc/cpuinfo`` (or ``cpuinfo``).

    Without them PyTorch converts bfloat16 to float32 and back around every product: on
    AVX2-only CPUs bfloat16 decoding took 2x (500 Multi30k sentences, `small` model) to 7x
    (200 toy sentences, beam 5, 20 pieces each, one thread; CPU seconds) the time of float32.
    None where the flags cannot be read (not Linux).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    flags = {word for line in cpuinfo.splitlines() if line.split(":")[0].strip() in ("flags", "Features") for word in line.split(":", 1)[1].split()}
    return bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})


def resolve_dtype(name: str, device: torch.device, what: str = "dtype") -> torch.dtype:
    """``float32``, ``bfloat16``, ``float16``, ``int8`` (``torch.qint8``: see :func:`to_dtype`),
    or ``auto``: bfloat16 where ``device`` computes it natively (a GPU that supports it, a CPU
    per :func:`native_bf16`), else float32.

    Logs a warning when bfloat16 is asked for on a CPU without native support.

    Raises:
        ConfigError: an unknown name, or int8 on a device other than the CPU.
    """
    if name not in ("float32", "bfloat16", "float16", "int8", "auto"):
        raise ConfigError(f"{what} must be float32, bfloat16, float16, int8 or auto, got {name!r}")
    if name == "int8":
        if device.type != "cpu":
            raise ConfigError(f"{what} int8 runs on the CPU only (PyTorch's dynamic quantization); use --device cpu, or bfloat16/float16 on a GPU")
        return torch.qint8
    native = native_bf16() if device.type == "cpu" else device.type == "cuda" and torch.cuda.is_bf16_supported()
    if name == "auto":
        chosen = torch.bfloat16 if native else torch.float32
        log.info("%s auto: %s on %s", what, str(chosen).removeprefix("torch."), device)
        return chosen
    if name == "bfloat16" and device.type == "cpu" and native is False:
        log.warning(
            "warning: %s bfloat16 on a CPU without native bfloat16 (no AMX-BF16 or AVX512-BF16 flag in /proc/cpuinfo) "
            "runs several times slower than float32; use %s float32 or auto",
            what,
            what,
        )
    return getattr(torch, name)


def load_model(path, device: torch.device) -> tuple[Transformer, Tokenizer, Config]:
    """Rebuild the model and tokenizer from a checkpoint alone (a file, or a run directory's ``best.pt``).

    Raises:
        nmt.checkpoint.CheckpointError: the checkpoint is missing, damaged, or inconsistent.
    """
    model, tokenizer, cfg = restore_model(load_checkpoint(path), path)
    return model.to(device).eval(), tokenizer, cfg


def load_models(paths: list, device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[list[Transformer], Tokenizer, Config]:
    """Load one checkpoint, or several that decode as an ensemble, in ``dtype`` (see :func:`to_dtype`).

    The tokenizer and the config (hence the decode defaults) are the first checkpoint's.

    Raises:
        nmt.checkpoint.CheckpointError: a checkpoint is missing or unreadable, or its tokenizer
            differs from the first one's (the message names the difference).
    """
    loaded = [load_model(path, device) for path in paths]
    models, (tokenizer, cfg) = [m for m, _, _ in loaded], loaded[0][1:]
    for path, (_, other, _) in zip(paths[1:], loaded[1:]):
        difference = tokenizer_difference(tokenizer, other)
        if difference:
            raise CheckpointError(f"{path}: its tokenizer differs from {paths[0]}'s ({difference}); an ensemble needs one tokenizer")
    return [to_dtype(m, dtype) for m in models], tokenizer, cfg


class PackedLinear(nn.Module):
    """``F.linear(x, weight, bias)`` through oneDNN with ``weight`` ``(out, in)`` reordered once
    into oneDNN's blocked layout, for inference on the CPU (what CTranslate2 calls packed GEMM
    weights). On an AVX2 CPU with one thread the packed product is 10-30% faster than
    ``F.linear``'s MKL product at 32 rows or more, and up to 3x slower for a single row of a
    small matrix (``docs/performance.md``): inputs of fewer than ``min_rows`` rows go through
    ``F.linear``. The tied output matrix, read from memory at every decoding step, is packed for
    every row count. Results equal ``F.linear``'s to float32 rounding (another summation order),
    not bit for bit. Where autograd is recording, the dense weight is used.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, min_rows: int = 1):
        super().__init__()
        self.weight, self.bias, self.min_rows = weight, bias, min_rows  # a Linear's own Parameters stay its state_dict entries
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` → ``(..., out)``."""
        if (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)) or x.numel() < self.min_rows * x.size(-1):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


#: Rows from which a layer's product goes through its packed weight (see :class:`PackedLinear`).
#: Measured on whole searches (random `small` model, 1 thread, AVX2): one sentence at beam 1 (one
#: row a step) took 0.123 s with F.linear and 0.135 s packed, at beam 5 (five rows) 0.183 s and 0.171 s.
PACKED_MIN_ROWS = 4


def pack_linear_layers(model: nn.Module, min_rows: int) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` replaced, in place, by a :class:`PackedLinear` of the same
    weight and bias Parameters (so ``state_dict`` is unchanged) that packs from ``min_rows`` rows
    on; returns ``model``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child.weight, child.bias, min_rows))
    return model


@functools.cache
def onednn_linear_works() -> bool:
    """Whether this torch build runs :class:`PackedLinear` (oneDNN present, its private ops as
    expected, results equal to ``F.linear`` on a small example); False falls back to ``F.linear``."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, bias, x = torch.randn(7, 5), torch.randn(7), torch.randn(2, 3, 5)
        with torch.inference_mode():
            return bool(torch.allclose(PackedLinear(weight, bias)(x), F.linear(x, weight, bias), atol=1e-5))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class Int8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamically quantized linear layer (int8 weights, activations quantized per
    call) with a shorter call: the operator's one overload directly, without the operator
    packet's per-call search of its arguments for script objects and the output's ``.to``
    (nmt's activations are float32, which the operator returns). One sentence at beam 5 (random
    `small` model, 1 thread) decoded in 0.096 s median against 0.102 s through the parent's call."""

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` float32 → ``(..., out)`` float32."""
        return torch.ops.quantized.linear_dynamic.default(x, self._packed_params._packed_params, True)  # True: reduce_range, as the parent's version 4


def to_dtype(model: Transformer, dtype: torch.dtype, per_channel: bool = True) -> nn.Module:
    """``model`` for inference in ``dtype`` (from :func:`resolve_dtype`): float32, bfloat16 or
    float16 weights and activations, or ``torch.qint8``: every ``nn.Linear`` dynamically
    quantized (an :class:`Int8Linear`) (int8 weights, one scale per output channel, or per matrix without
    ``per_channel``; activations quantized per batch on the fly) with PyTorch's own
    ``quantize_dynamic``, on the CPU, in ``torch.backends.quantized.engine``'s layout, and a
    quantized copy of the tied output matrix computes the logits. Embeddings, LayerNorm and the
    scores stay float32. In float32 on the CPU every linear layer becomes a :class:`PackedLinear`
    (:func:`pack_linear_layers`) and the logits come from a packed copy of the tied matrix.
    """
    if dtype != torch.qint8:
        model = model.to(dtype)
        if dtype == torch.float32 and next(model.parameters()).device.type == "cpu" and onednn_linear_works():
            pack_linear_layers(model, PACKED_MIN_ROWS)
            model.output_projection = PackedLinear(model.tgt_embed.weight.detach(), model.output_bias)
        return model
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao; it still works
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        mapping = {nn.Linear: Int8Linear}
        quantized = quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, mapping=mapping)
        # The tied output matrix is the largest of all: a quantized copy of it computes the logits,
        # while the embeddings (and the checkpoint's tie) keep the float32 matrix.
        output = nn.Linear(model.cfg.d_model, model.cfg.tgt_vocab_size, bias=model.output_bias is not None)
        output.weight = nn.Parameter(model.tgt_embed.weight.detach().clone(), requires_grad=False)
        if model.output_bias is not None:  # an imported model's fixed logit bias (Marian's final_logits_bias)
            output.bias = nn.Parameter(model.output_bias.detach().clone(), requires_grad=False)
        output.qconfig = qconfig
        quantized.output_projection = quantize_dynamic(nn.Sequential(output), {nn.Linear: qconfig}, dtype=torch.qint8, mapping=mapping)[0]
        return quantized


class UnwritableText(DataError):
    """A prefix or constraint the model cannot write; ``field`` says which (``prefix``, ``constraint``)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def steering(tokenizer: Tokenizer, prefix: str = "", constraints: Iterable[str] = (), bans: Iterable[str] = ()) -> Steering:
    """What one line's translation must start with, hold and avoid, from text (:class:`~nmt.beams.Steering`).

    Each text is segmented with the target tokenizer, as the model writes it (a word that
    starts a phrase gets its word-initial piece, ``▁Hund``), so a constraint or ban matches the
    output's own pieces; an empty phrase is ignored. A prefix's pieces are forced, except its
    last one when the prefix ends inside a word (no trailing space): the search may then use
    any piece that begins with that piece's text (``▁Hu`` may become ``▁Hund``), so the word
    can be finished in the model's own segmentation rather than as the typed fragment was cut
    (what CTranslate2 calls a prefix "in the middle of a word"). After a prefix that ends with
    a space, the next piece starts a word (or the translation ends there).

    Raises:
        UnwritableText: the prefix or a constraint has characters the target vocabulary lacks
            (forcing UNK would write ⁇, not the text), or a constraint holds a banned phrase.
    """

    def pieces(text: str, field: str | None = None) -> tuple[int, ...]:
        ids = tuple(tokenizer.encode_tgt([text])[0]) if text.strip() else ()
        if field is not None and UNK in ids:  # it could only be written as ⁇, not as given
            missing = "".join(dict.fromkeys(c for c in text if not c.isspace() and UNK in tokenizer.encode_tgt([c])[0]))
            raise UnwritableText(field, f"{field} {text!r} has characters the target vocabulary lacks ({missing}); remove or replace them")
        return ids

    steps: list[tuple[int, ...]] = [(i,) for i in pieces(prefix, "prefix")]
    texts = tokenizer.tgt_pieces
    if steps and prefix[-1:].isspace():
        steps.append(tuple(i for i, t in enumerate(texts) if t.startswith("\u2581")) + (EOS,))
    elif steps:
        last = texts[steps[-1][0]]
        steps[-1] = tuple(i for i, t in enumerate(texts) if t.startswith(last) and not tokenizer.tgt.is_control(i))
    wanted = [(c, p) for c in constraints if (p := pieces(c, "constraint"))]
    banned = [(b, p) for b in bans if (p := pieces(b))]  # a ban with UNK bans what is never written anyway
    for c, need in wanted:
        clash = next((b for b, ban in banned if any(need[i : i + len(ban)] == ban for i in range(len(need) - len(ban) + 1))), None)
        if clash is not None:
            raise UnwritableText("constraint", f"constraint {c!r} holds the banned phrase {clash!r}: no translation can meet both; drop one")
    return Steering(tuple(steps), tuple(p for _, p in wanted), tuple(p for _, p in banned))


def translate_lines(
    model,
    tokenizer: Tokenizer,
    lines: list[str],
    decode,
    device: torch.device,
    *,
    sampling: Sampling | None = None,
    first_index: int = 0,
    alignment: bool = False,
    steering: list[Steering] | None = None,
    progress: Callable[[int], object] | None = None,
    skipped: Counter | None = None,
    src_prefix: tuple[int, ...] = (),
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Translate every line; returns, in input order, each line's n-best list.

    Lines are sorted by length into batches of at most ``decode.max_tokens`` source tokens
    (padding included). A line with no pieces (blank, or only characters SentencePiece
    normalises away, such as U+200B) yields an empty list without running the model; so
    do, each with a warning naming it, a line of more than ``decode.max_input_pieces``
    pieces and a line of only unknown pieces (:func:`nmt.tokenizer.unknown_only`: an emoji,
    ``!!!`` or another script outside the vocabulary, which the model would answer with an
    invented sentence).

    Args:
        model: a :class:`~nmt.model.Transformer`, or a list of them decoding as an ensemble.
        decode: a :class:`~nmt.config.DecodeConfig`: the search settings (beam size, length
            penalty and limits, n-best, ...), passed whole to :func:`~nmt.search.translate_batch`,
            and the batch budget ``max_tokens`` and ``max_input_pieces``.
        sampling: draw ``decode.n_best`` samples per line instead of beam search; line ``i``'s
            draws are seeded by ``sample_seed(sampling.seed, first_index + i)``.
        first_index: the index of ``lines[0]`` in the whole input (streaming calls this per buffer).
        alignment: fill in each hypothesis's source-target alignment (:mod:`nmt.align`).
        steering: per line, its prefix, constraints and banned phrases (:func:`steering`); a line
            whose length limit ended it before its constraints appeared is named in a warning.
        progress: told how many more lines are done, batch by batch (a progress bar's ``update``).
        skipped: counts the lines left untranslated, by reason (``too_long``, ``unknown``).
        src_prefix: piece ids put before every line that is translated: a multilingual model's
            target tag (:func:`nmt.multilingual.target`). ``max_input_pieces`` and the checks above
            count the line's own pieces, alignments index them (a link to the tag is left out),
            and the output limit counts the tag as a source token, as the model reads it.
        shortlist: restrict each batch's output to the target pieces its source pieces (and
            steering) allow (:class:`~nmt.shortlist.Shortlist`): faster, and no longer exact.
    """
    skipped = skipped if skipped is not None else Counter()
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    encoded = tokenizer.encode_src(lines)  # SentencePiece's normalisation strips whitespace, as in training
    for i, pieces in enumerate(encoded):
        if len(pieces) > decode.max_input_pieces:  # one huge line must not take the others down
            log.warning(
                "input line %d has %d pieces, over the limit of %d (--max-input-pieces): its output line is left empty",
                first_index + i + 1,
                len(pieces),
                decode.max_input_pieces,
            )
            skipped["too_long"] += 1
        elif unknown_only(pieces, tokenizer.src):  # the model would see nothing and invent a sentence
            log.warning(
                "input line %d has only characters the model does not know (every piece is unknown): its output line is left empty", first_index + i + 1
            )
            skipped["unknown"] += 1
    present = [i for i, pieces in enumerate(encoded) if 0 < len(pieces) <= decode.max_input_pieces and not unknown_only(pieces, tokenizer.src)]
    ids = [[*src_prefix, *encoded[i]] for i in present] if src_prefix else [encoded[i] for i in present]
    lengths = np.array([len(s) + 1 for s in ids], dtype=np.int64)
    results: list[list[Hypothesis]] = [[] for _ in lines]
    if progress is not None:
        progress(len(lines) - len(present))  # the lines left untranslated are done too
    for batch in token_batches(lengths, decode.max_tokens, np.argsort(lengths, kind="stable")):
        sources = [ids[i] for i in batch]
        src = pad_sources(sources).to(device)
        seeds = [sample_seed(sampling.seed, first_index + present[i]) for i in batch] if sampling is not None else None
        steer = [steering[present[i]] for i in batch] if steering else None
        columns = shortlist.columns(sources, steer) if shortlist is not None else None
        hyps = translate_batch(models, src, decode, sampling=sampling, seeds=seeds, rules=tokenizer.output_rules, steering=steer, columns=columns)
        if alignment:
            hyps = add_alignments(models, sources, hyps, device, decode.alignment_layer)
            if src_prefix:
                hyps = [[replace(h, alignment=tuple((i - len(src_prefix), j) for i, j in h.alignment if i >= len(src_prefix))) for h in line] for line in hyps]
        for i, h in zip(batch, hyps):
            results[present[i]] = h
            if h and h[0].unmet:
                log.warning(
                    "input line %d: its length limit ended the translation before %d of its constraints appeared; raise --max-len-a or --max-len-b",
                    first_index + present[i] + 1,
                    h[0].unmet,
                )
        if progress is not None:
            progress(len(batch))
    return results


def translate_stream(
    model, tokenizer: Tokenizer, buffers: Iterable[list[str]], decode, device: torch.device, steering: Iterable[Steering] | None = None, **options
) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
    """Translate input that arrives in buffers of lines, one buffer at a time, so that memory
    is bounded by a buffer and each buffer's output can be written before the next is read.

    Yields ``(index of the buffer's first line in the whole input, its n-best lists)``;
    ``steering`` gives one :class:`~nmt.beams.Steering` per input line, read as the lines are;
    ``options`` are :func:`translate_lines`' keyword arguments.
    """
    first, steering = 0, iter(steering) if steering is not None else None
    for lines in buffers:
        steer = list(itertools.islice(steering, len(lines))) if steering is not None else None
        yield first, translate_lines(model, tokenizer, lines, decode, device, first_index=first, steering=steer, **options)
        first += len(lines)


def best_strings(tokenizer: Tokenizer, results: list[list[Hypothesis]]) -> list[str]:
    """Detokenized best hypothesis per input line (empty string for blank input)."""
    return tokenizer.decode_tgt([r[0].tokens if r else [] for r in results])
