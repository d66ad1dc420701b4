"""What nmt hands to ``torch.compile``: the training step's module (``train.compile``, run by
:class:`~nmt.core.update.Updater`) and the loss's two passes over ``tokens × vocab``
(``train.compile_loss``), each compiled dynamic in the token count.

Compiling needs a working compiler for the device (a C++ compiler on a CPU; Triton, which needs
a C compiler, on a GPU), and fails without one only once the first step has been traced, which
on a large model takes minutes. :func:`compiling` checks first, once per process, by compiling a
trivial function and its gradient: where that fails, the step and the loss train eagerly, said
in one line. A failure the check misses, in the loss's passes or the step's forward pass, runs
eagerly from then on, said once too (one in the step's backward pass, compiled at the first
backward, is raised).
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from collections.abc import Callable

import torch

from nmt.core.loss import EAGER, LossPasses, ProjectedLoss, gradient_pass, rows_pass
from nmt.core.pieces import PAD
from nmt.errors import first_line

from .device import out_of_memory

log = logging.getLogger("nmt.runtime")

#: how long compiling and running a trivial function and its gradient may take (seconds)
PROBE_TIMEOUT_S = 120

# A child process compiles it: it can be stopped at the timeout, and a compiler that crashes
# takes only the child down.
_PROBE = """
import sys, torch
try:
    x = torch.ones(8, device=sys.argv[1], requires_grad=True)
    torch.compile(lambda t: (t * 2).sin().sum())(x).backward()
except Exception as exc:
    text = str(exc).strip()
    print(text.splitlines()[0] if text else type(exc).__name__)
    sys.exit(1)
"""


@functools.cache
def compile_failure(device: str) -> str | None:
    """Why ``torch.compile`` cannot compile on ``device`` here (one line), or None where it can:
    a trivial function and its gradient compiled and run in a child process, stopped after
    ``PROBE_TIMEOUT_S`` seconds, with inductor's caches off (a kernel compiled by an earlier run
    would hide a compiler gone since). Tried once per process and device."""
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, device],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return f"compiling a trivial function took over {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    said = (done.stdout.strip() or done.stderr.strip() or "no message").splitlines()[-1]
    return said if done.returncode == 1 else f"the check ended with code {done.returncode}: {said}"


class _Compiled:
    """``fn`` compiled by ``torch.compile`` (dynamic in the token count), run eagerly from the first
    failure to compile or run it on, which is said once in one line per setting."""

    setting, what = "train.compile_loss", "the loss"
    failed: dict[str, str] = {}  # setting -> why compiling failed in this process, once it has

    def __init__(self, fn):
        self.fn, self.compiled = fn, torch.compile(fn, dynamic=True)

    def __call__(self, *args, **kwargs):
        if self.setting not in self.failed:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as exc:
                if out_of_memory(exc):
                    raise
                self.failed[self.setting] = first_line(exc)
                log.warning(
                    "warning: %s: compiling %s failed (%s); it runs eagerly",
                    self.setting,
                    self.what,
                    self.failed[self.setting],
                )
        return self.fn(*args, **kwargs)


class _CompiledStep(_Compiled):
    """The module a training step runs (the model, or DDP's wrapper of it), compiled; eager from
    the first failure on."""

    setting, what = "train.compile", "the training step"

    def train(self, mode: bool = True) -> _CompiledStep:
        """Set the module's training mode, as :meth:`torch.nn.Module.train` does."""
        self.fn.train(mode)
        return self


def _as_is(module: torch.nn.Module) -> torch.nn.Module:
    return module


class _ChunksOrWhole(ProjectedLoss):
    """A :class:`~nmt.core.loss.ProjectedLoss` in chunks on a device its chunks have not been run
    on by the tests (any but a CPU): from the first failure on, it scores the whole logits, said
    once in one line, for training and validation alike. A failure can only come in the forward
    pass, which does all the work."""

    failed: str | None = None  # why the chunks failed in this process, once they have

    def __call__(self, states, target, smoothing, model, pad_id: int = PAD):
        if _ChunksOrWhole.failed is None:
            try:
                return super().__call__(states, target, smoothing, model, pad_id)
            except Exception as exc:
                if out_of_memory(exc):
                    raise
                _ChunksOrWhole.failed = first_line(exc)
                log.warning(
                    "warning: train.loss_chunk_tokens: scoring in chunks failed on %s (%s); the "
                    "loss scores the whole logits from now on",
                    states.device.type,
                    _ChunksOrWhole.failed,
                )
        return ProjectedLoss(0, self.passes)(states, target, smoothing, model, pad_id)


def training_loss(tc, device: torch.device, passes: LossPasses | None = None) -> ProjectedLoss:
    """The loss an :class:`~nmt.core.update.Updater` trains with under ``tc`` (the
    :class:`~nmt.config.TrainConfig`) on ``device``: the output projection and
    :func:`~nmt.core.loss.label_smoothed_loss`, ``loss_chunk_tokens`` target tokens at a time
    (0: all; in chunks on a GPU the output matrix is padded to a multiple of 64 rows for the
    products: :class:`~nmt.core.loss.ProjectedLoss`); with ``compile_loss`` the two passes over each
    ``tokens × vocab`` compiled, each fused into one read of the logits (and one write of their
    gradient) instead of eager's float32 copies, unless ``passes`` says how they run. The values
    are the eager ones up to rounding. In chunks on a device other than a CPU, a failure of the
    chunks makes it score the whole logits, said once (:class:`_ChunksOrWhole`)."""
    if passes is None and tc.compile_loss:
        log.info("train.compile_loss: compiling the loss; the first steps take longer")
        passes = LossPasses(_Compiled(rows_pass), _Compiled(gradient_pass))
    tested = device.type == "cpu" or tc.loss_chunk_tokens == 0
    return (ProjectedLoss if tested else _ChunksOrWhole)(
        tc.loss_chunk_tokens, passes or EAGER, vocab_multiple=64 if device.type == "cuda" else 1
    )


def training_step(tc) -> Callable[[torch.nn.Module], Callable]:
    """What an :class:`~nmt.core.update.Updater` runs the module of its step through under ``tc``:
    with ``compile``, ``torch.compile`` (dynamic shapes); else the module itself."""
    if not tc.compile:
        return _as_is
    log.info("train.compile: compiling the training step; the first steps take a minute or more")
    return _CompiledStep


def compiling(
    tc, device: torch.device, gather: Callable[[str | None], list] = lambda reason: [reason]
) -> tuple[ProjectedLoss, Callable[[torch.nn.Module], Callable]]:
    """The loss and the step wrapper an :class:`~nmt.core.update.Updater` trains with under
    ``tc`` (:func:`training_loss`, :func:`training_step`), decided before the first step: where
    ``compile`` asks for ``torch.compile`` and it cannot compile on ``device``
    (:func:`compile_failure`, on this process or on any other of ``gather``: a ``torchrun``
    job's processes decide alike), the step and the loss run eagerly, said in one warning line.

    ``compile_loss`` alone is not checked first: its passes fail to compile within seconds, and
    then run eagerly (:class:`_Compiled`), where the check would cost seconds every run."""
    if tc.compile:
        failures = [reason for reason in gather(compile_failure(str(device))) if reason]
        if failures:
            asked = ["compile"] + (["compile_loss"] if tc.compile_loss else [])
            log.warning(
                "warning: %s: torch.compile cannot compile on %s here (%s); training runs "
                "eagerly. Install a working compiler (on a CPU a C++ one, named by CXX if not on "
                "PATH), or pass %s",
                " and ".join(f"train.{name}" for name in asked),
                device.type,
                failures[0],
                " ".join(f"--set train.{name}=false" for name in asked),
            )
            return training_loss(tc, device, EAGER), _as_is
    return training_loss(tc, device), training_step(tc)
