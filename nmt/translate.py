"""Translating lines of text with a trained checkpoint."""

from __future__ import annotations

import numpy as np
import torch

from .checkpoint import CheckpointError, load_checkpoint, tokenizer_from_tensors
from .config import Config, ConfigError, config_from_dict
from .data import pad_sources, token_batches
from .model import Transformer
from .search import Hypothesis, translate_batch
from .tokenizer import Tokenizer


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ConfigError: an unknown device, or CUDA asked for where there is none.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but this torch build or machine has no CUDA; use cpu")
    return device


def load_model(path, device: torch.device) -> tuple[Transformer, Tokenizer, Config]:
    """Rebuild the model and tokenizer from a checkpoint alone (a file, or a run directory's ``best.pt``).

    Raises:
        nmt.checkpoint.CheckpointError: the checkpoint is missing or unreadable.
    """
    payload = load_checkpoint(path)
    try:
        cfg = config_from_dict(payload["config"], str(path))
        model = Transformer(cfg.model)
        model.load_state_dict(payload["model"])
        tokenizer = Tokenizer.from_protos(tokenizer_from_tensors(payload["tokenizer"]))
    except (KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: incomplete or inconsistent checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
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
        hyps = translate_batch(model, src, decode.beam_size, decode.length_penalty, decode.max_len_a, decode.max_len_b, decode.n_best, min_len)
        for i, h in zip(batch, hyps):
            results[present[i]] = h
    return results


def best_strings(tokenizer: Tokenizer, results: list[list[Hypothesis]]) -> list[str]:
    """Detokenized best hypothesis per input line (empty string for blank input)."""
    return tokenizer.decode_tgt([r[0].tokens if r else [] for r in results])
