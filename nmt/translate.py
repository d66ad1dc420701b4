"""Translating lines of text with a trained checkpoint."""

from __future__ import annotations

import numpy as np
import torch

from .checkpoint import load_checkpoint, tokenizer_from_tensors
from .config import Config, config_from_dict
from .data import pad_sources, token_batches
from .model import Transformer
from .search import Hypothesis, translate_batch
from .tokenizer import Tokenizer


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_model(path, device: torch.device) -> tuple[Transformer, Tokenizer, Config]:
    """Rebuild the model and tokenizer from a checkpoint alone (a file, or a run directory's ``best.pt``).

    Raises:
        nmt.checkpoint.CheckpointError: the checkpoint is missing or unreadable.
    """
    payload = load_checkpoint(path)
    cfg = config_from_dict(payload["config"], str(path))
    model = Transformer(cfg.model)
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    return model, Tokenizer.from_protos(tokenizer_from_tensors(payload["tokenizer"])), cfg


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
