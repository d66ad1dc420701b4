"""Translating lines of text with a trained checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from .checkpoint import load_checkpoint, restore_model
from .config import Config, ConfigError
from .data import pad_sources, token_batches
from .model import Transformer
from .search import Hypothesis, translate_batch
from .tokenizer import Tokenizer

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
    """``float32``, ``bfloat16``, ``float16``, or ``auto``: bfloat16 where ``device`` computes
    it natively (a GPU that supports it, a CPU per :func:`native_bf16`), else float32.

    Logs a warning when bfloat16 is asked for on a CPU without native support.

    Raises:
        ConfigError: an unknown name.
    """
    if name not in ("float32", "bfloat16", "float16", "auto"):
        raise ConfigError(f"{what} must be float32, bfloat16, float16 or auto, got {name!r}")
    native = native_bf16() if device.type == "cpu" else device.type == "cuda" and torch.cuda.is_bf16_supported()
    if name == "auto":
        chosen = torch.bfloat16 if native else torch.float32
        log.info("%s auto: %s on %s", what, str(chosen).removeprefix("torch."), device)
        return chosen
    if name == "bfloat16" and device.type == "cpu" and native is False:
        log.warning(
            "warning: %s bfloat16 on a CPU without native bfloat16 (no AMX-BF16 or AVX512-BF16 flag in /proc/cpuinfo) "
            "runs several times slower than float32; use %s float32 or auto",
            what, what,
        )
    return getattr(torch, name)


def load_model(path, device: torch.device) -> tuple[Transformer, Tokenizer, Config]:
    """Rebuild the model and tokenizer from a checkpoint alone (a file, or a run directory's ``best.pt``).

    Raises:
        nmt.checkpoint.CheckpointError: the checkpoint is missing, damaged, or inconsistent.
    """
    model, tokenizer, cfg = restore_model(load_checkpoint(path), path)
    return model.to(device).eval(), tokenizer, cfg


def translate_lines(model: Transformer, tokenizer: Tokenizer, lines: list[str], decode, device: torch.device, min_len: int = 0) -> list[list[Hypothesis]]:
    """Beam-search every line; returns, in input order, each line's n-best list.

    Lines are sorted by length into batches of at most ``decode.max_tokens`` source tokens
    (padding included). A blank line yields an empty list without running the model.
    """
    stripped = [line.strip() for line in lines]
    present = [i for i, line in enumerate(stripped) if line]
    ids = tokenizer.encode_src([stripped[i] for i in present])
    lengths = np.array([len(s) + 1 for s in ids], dtype=np.int64)
    results: list[list[Hypothesis]] = [[] for _ in lines]
    for batch in token_batches(lengths, decode.max_tokens, np.argsort(lengths, kind="stable")):
        src = pad_sources([ids[i] for i in batch]).to(device)
        hyps = translate_batch(model, src, decode.beam_size, decode.length_penalty, decode.max_len_a, decode.max_len_b, decode.n_best, min_len, allow_unk=decode.allow_unk)
        for i, h in zip(batch, hyps):
            results[present[i]] = h
    return results


def best_strings(tokenizer: Tokenizer, results: list[list[Hypothesis]]) -> list[str]:
    """Detokenized best hypothesis per input line (empty string for blank input)."""
    return tokenizer.decode_tgt([r[0].tokens if r else [] for r in results])
