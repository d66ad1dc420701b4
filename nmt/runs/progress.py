"""Where a training run stands, as its checkpoints record it: the step, the sampler's position and
what cut the epoch's batches (:class:`Progress`, :class:`Batching`), and every random generator's
state (:func:`rng_state`), so that ``nmt train --resume`` continues exactly where the run
stopped."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Batching:
    """What cuts an epoch into batches: the token budget (``train.max_tokens``), the seed, the
    processes that share the batches and, with several directions, the sampling temperature. A
    checkpoint stores it as the list ``[max_tokens, seed, processes]`` (and the temperature), as
    every version has."""

    max_tokens: int
    seed: int
    processes: int
    temperature: float | None = None

    @classmethod
    def of(cls, stored: list) -> Batching:
        """The value of a checkpoint's list."""
        return cls(*stored)

    def stored(self) -> list:
        """The list a checkpoint holds."""
        return [self.max_tokens, self.seed, self.processes] + (
            [self.temperature] if self.temperature is not None else []
        )


@dataclass
class Progress:
    """Where a run stands: optimizer steps done, the sampler's position, the best score."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already trained on
    best_bleu: float = -1.0
    bad_validations: int = 0  # validations since the last BLEU improvement
    validated_step: int = -1  # step of the last completed validation
    batching: Batching | None = None  # what this epoch's batches were cut with

    @classmethod
    def of(cls, stored: dict) -> Progress:
        """The progress a checkpoint holds (``batching`` as its list)."""
        batching = stored.get("batching")
        return cls(**{**stored, "batching": Batching.of(batching) if batching else None})

    def stored(self) -> dict:
        """The progress as a checkpoint holds it."""
        return {**vars(self), "batching": self.batching.stored() if self.batching else None}


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states of this process, as checkpoint-safe
    values."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generator states saved by :func:`rng_state`."""
    random.setstate(_tuples(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


@dataclass
class Invocation:
    """Where this invocation of a run started: its first step (``first_step``) and time
    (``started``, ``time.perf_counter()``); and when it logs before its first ``train.log_every``
    steps: at that first step and once a minute in, so that a run writing its log to a file says
    early that it runs and how fast."""

    first_step: int
    started: float
    minute_said: bool = False

    def seconds(self) -> float:
        """Seconds since :attr:`started`."""
        return time.perf_counter() - self.started

    def early_log_due(self, step: int) -> bool:
        """Whether ``step`` gets an early log line (each of the two comes once)."""
        if step == self.first_step:
            return True
        if not self.minute_said and self.seconds() >= 60:
            self.minute_said = True
            return True
        return False
