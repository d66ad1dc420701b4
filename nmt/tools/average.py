"""Checkpoint averaging (Vaswani et al. 2017, §6.1: the base models average the last 5
checkpoints)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from nmt.config import ConfigError
from nmt.errors import Key
from nmt.files import check_not_an_input, check_writable
from nmt.runs.checkpoint import CheckpointError, checkpoint_file, load_checkpoint, save_checkpoint
from nmt.runs.runid import peek, step_checkpoints, warn_if_not_the_runs

log = logging.getLogger("nmt.average")


def newest_step_checkpoints(run_dir: str | Path, last: int) -> list[Path]:
    """The ``last`` newest ``step_N.pt`` files of ``run_dir``, oldest first.

    Raises:
        ConfigError: ``last`` below 1, or ``run_dir`` not a directory.
    """
    if last < 1:
        raise ConfigError(Key("last"), f" must be at least 1, got {last}")
    if not Path(run_dir).is_dir():
        raise ConfigError(Key("run_dir"), f" {run_dir} is not a directory")
    found = step_checkpoints(Path(run_dir))[-last:]
    for path in found:  # one copied in from another run is named
        warn_if_not_the_runs(Path(run_dir), path, peek(path)[1])
    if 0 < len(found) < last:
        log.warning(
            "warning: --last %d asked for %d step checkpoints, but %s has %d (%s): averaging those",
            last,
            last,
            run_dir,
            len(found),
            ", ".join(p.name for p in found),
        )
    return found


NOTHING = (
    "nothing to average: give checkpoints, or a run directory with step_N.pt files (a run "
    "writes one every train.save_every steps)"
)


def average_checkpoints(paths: list[Path], out: Path, different_runs: bool = False) -> dict:
    """Average the model weights of ``paths`` into a new checkpoint at ``out``.

    Floating-point tensors are averaged (in float64, then cast back); integer and boolean
    buffers are taken from the last checkpoint. Tensors that share storage (tied
    embeddings) are averaged once and stay shared. The output holds the model, config and
    tokenizer of the last input (no optimizer state: it is for translation, not for
    ``--resume``); the inputs are not modified. Every input is loaded and checked
    before anything is written, and ``out`` may not replace a run's own ``last.pt``,
    ``best.pt`` or ``step_N.pt`` (``--resume`` and ``translate`` read them). Checkpoints of
    two trainings of one architecture are refused (their weights need not lie near each
    other, so their average need not translate) unless ``different_runs``; so is one checkpoint
    given twice, which would count double (:func:`_refuse_given_twice`).

    Raises:
        CheckpointError: no input, an input given twice (by another name, through a link or a run
            directory, or as a copy), ``out`` among the inputs, an input missing, damaged
            or inconsistent, inputs that differ in model config or tokenizer (the
            message names the difference), or inputs of different runs.
        nmt.files.OutputError: ``out`` cannot be written, or would replace a file of a run
            directory (:func:`nmt.files.check_not_a_run_file`).
    """
    out = Path(out)
    check_writable(out, Key("out"))
    if not paths:
        raise CheckpointError(NOTHING)
    check_not_an_input(Path(out), [("an input", Path(p)) for p in paths], "--out")
    sums: dict[str, torch.Tensor] = {}
    first = first_path = None
    seen: dict[tuple, Path] = {}
    for path in paths:
        last = load_checkpoint(path).payload
        _refuse_given_twice(path, last, seen)
        if first is None:
            first, first_path = last, path
        _check_compatible(first, first_path, last, path, different_runs)
        for name, tensor in last["model"].items():
            if tensor.is_floating_point():
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
    payload = {
        "model": averaged,
        "config": last["config"],
        "tokenizer": last["tokenizer"],
        "averaged_from": [str(Path(p).resolve()) for p in paths],  # followable from anywhere
    }
    # where the weights came from, for nmt info
    payload |= {key: last[key] for key in ("progress", "init_from", "imported_from") if key in last}
    if "run" in last and not different_runs:
        payload["run"] = last["run"]
    save_checkpoint(payload, Path(out))
    return payload


def _refuse_given_twice(path: Path, payload: dict, seen: dict[tuple, Path]) -> None:
    """Refuse checkpoint ``payload`` (given as ``path``) when it is one of those ``seen`` (what
    makes each the one it is, by the path that gave it first; ``seen`` gets this one's): the same
    file (another name, a link, a run directory's best.pt), the same recorded run at the same step
    (a copy, such as best.pt beside the step_N.pt it copies; an average records no step of its own),
    or identical weights (any other copy).

    Raises:
        CheckpointError: naming both paths and why they are one checkpoint.
    """
    st = os.stat(checkpoint_file(path))  # a run directory is its best.pt
    run, step = payload.get("run", {}), payload.get("progress", {}).get("step")
    identities = [(("file", st.st_dev, st.st_ino), "the same file")]
    if run.get("id") and isinstance(step, int) and "averaged_from" not in payload:
        identities.append(
            (
                ("run", run["id"], step),
                f"the same run, {run.get('dir') or run['id']}, at step {step}",
            )
        )
    identities.append((("weights", _weights_digest(payload["model"])), "identical weights"))
    for identity, why in identities:
        if identity in seen:
            raise CheckpointError(
                f"{path} is given twice (as {seen[identity]} too: {why}); each checkpoint counts "
                "once in an average, so give each once"
            )
    seen.update((identity, Path(path)) for identity, _ in identities)


def _weights_digest(state: dict[str, torch.Tensor]) -> str:
    """A hash of every tensor of ``state``: name, dtype, shape and bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def run_of(payload: dict) -> tuple[str, str]:
    """``(id, run directory)`` of the training a checkpoint comes from: its recorded run, or, for
    one written before runs were recorded, its config's run directory."""
    run = payload.get("run") or {}
    directory = run.get("dir") or payload["config"].get("train", {}).get("run_dir", "")
    return run.get("id") or directory, directory


def _check_compatible(
    a: dict, a_path: Path, b: dict, b_path: Path, different_runs: bool = False
) -> None:
    """Refuse to average checkpoints of different models or tokenizers (same shapes can hide
    either), or of different runs."""
    model_a, model_b = a["config"].get("model", {}), b["config"].get("model", {})
    differ = [
        f"model.{k} {model_a.get(k)!r} vs {model_b.get(k)!r}"
        for k in sorted(set(model_a) | set(model_b))
        if k != "preset" and model_a.get(k) != model_b.get(k)
    ]
    if differ:
        raise CheckpointError(
            f"{a_path} and {b_path} are different models ({', '.join(differ)}); average "
            "checkpoints of one run"
        )
    tok_a, tok_b = a["tokenizer"], b["tokenizer"]
    if set(tok_a) != set(tok_b) or any(not torch.equal(tok_a[k], tok_b[k]) for k in tok_a):
        raise CheckpointError(
            f"{a_path} and {b_path} have different tokenizers (the same ids mean different "
            "pieces); average checkpoints of one run"
        )
    (id_a, dir_a), (id_b, dir_b) = run_of(a), run_of(b)
    if not different_runs and id_a != id_b:
        raise CheckpointError(
            f"{a_path} and {b_path} come from different runs ({dir_a or 'unknown'} and "
            f"{dir_b or 'unknown'}): two trainings' weights "
            "need not lie near each other, so their average need not translate; average one run's "
            "checkpoints, or pass "
            "--allow-different-runs"
        )
