"""Checkpoints: written atomically, loaded without executing code.

A checkpoint is a dict of tensors, numbers, strings and containers of them, read with
``torch.load(weights_only=True)``. It holds the model, optimizer and schedule states, the
step, the sampler's position (epoch and batch within it), every RNG state, the resolved
config and the tokenizer, so that ``nmt translate`` needs nothing else and ``nmt train
--resume`` continues exactly where the run stopped.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, or not one nmt wrote."""


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    """Write ``payload`` to ``path`` through a temporary file and an atomic rename, so an
    interruption leaves either the old file or the new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`.

    Raises:
        CheckpointError: the file does not exist, is not a checkpoint, or is damaged.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "best.pt").is_file() and (path / "last.pt").is_file():
            raise CheckpointError(f"{path} has no best.pt (no validation has run yet); pass --checkpoint {path / 'last.pt'} or --resume the run")
        path = path / "best.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for damaged or foreign files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in str(exc):  # torch's advice (weights_only=False) would run arbitrary code
            reason = "it holds objects other than tensors and plain values"
        raise CheckpointError(f"{path}: not a readable nmt checkpoint ({reason[:200]})") from None
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise CheckpointError(f"{path}: not an nmt checkpoint (no model/config entries)")
    return payload


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states as checkpoint-safe values."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def tokenizer_to_tensors(protos: dict[str, bytes]) -> dict[str, torch.Tensor]:
    return {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in protos.items()}


def tokenizer_from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: bytes(v.numpy().tobytes()) for k, v in tensors.items()}
