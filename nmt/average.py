"""Checkpoint averaging (Vaswani et al. 2017, §6.1: the base models average the last 5 checkpoints)."""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's ``step_N.pt`` files, oldest first."""
    return sorted(run_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))


def average_checkpoints(paths: list[Path], out: Path) -> dict:
    """Average the model weights of ``paths`` into a new checkpoint at ``out``.

    Floating-point tensors are averaged (in float64, then cast back); integer and boolean
    buffers are taken from the last checkpoint. Tensors that share storage (tied
    embeddings) are averaged once and stay shared. The output holds the model, config and
    tokenizer of the last input (no optimizer state: it is for translation or fine-tuning
    from scratch); the inputs are not modified.

    Raises:
        CheckpointError: fewer than one input, an input missing, ``out`` among the
            inputs, or inputs whose parameter names or shapes differ.
    """
    if not paths:
        raise CheckpointError("nothing to average: give checkpoints or a run directory with step_N.pt files")
    if any(Path(p).resolve() == Path(out).resolve() for p in paths):
        raise CheckpointError(f"{out} is one of the inputs; write the average to a new file")
    sums: dict[str, torch.Tensor] = {}
    names: set[str] | None = None
    for path in paths:
        last = load_checkpoint(path)
        state = last["model"]
        names = names or set(state)
        if set(state) != names:
            raise CheckpointError(f"{path}: parameter names differ from {paths[0]}")
        for name, tensor in state.items():
            if not tensor.is_floating_point():
                continue
            if name in sums and sums[name].shape != tensor.shape:
                raise CheckpointError(f"{path}: {name} has shape {tuple(tensor.shape)}, {paths[0]} has {tuple(sums[name].shape)}")
            sums[name] = sums.get(name, 0) + tensor.double()
    averaged: dict[str, torch.Tensor] = {}
    by_storage: dict[int, torch.Tensor] = {}
    for name, tensor in last["model"].items():
        if not tensor.is_floating_point():
            averaged[name] = tensor
            continue
        key = tensor.untyped_storage().data_ptr()
        if key not in by_storage:  # tied weights: one averaged tensor shared by every name
            by_storage[key] = (sums[name] / len(paths)).to(tensor.dtype)
        averaged[name] = by_storage[key]
    payload = {"model": averaged, "config": last["config"], "tokenizer": last["tokenizer"], "averaged_from": [str(p) for p in paths]}
    if "progress" in last:
        payload["progress"] = last["progress"]
    save_checkpoint(payload, Path(out))
    return payload
