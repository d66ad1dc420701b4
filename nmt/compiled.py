"""What nmt hands to ``torch.compile`` besides the model (``train.compile``, in
:class:`~nmt.core.update.Updater`): the loss's two passes over ``tokens × vocab``
(``train.compile_loss``), each compiled dynamic in the token count, and run eagerly from the
first failure on, said once."""

from __future__ import annotations

import logging

import torch

from .core.loss import EAGER, LossPasses, gradient_pass, rows_pass
from .runtime import out_of_memory

log = logging.getLogger("nmt.runtime")


class _Compiled:
    """``fn`` compiled by ``torch.compile`` (dynamic in the token count), run eagerly from the first
    failure to compile or run it on, which is said once in one line."""

    failed: list[str] = []  # why compiling the loss failed in this process, once it has

    def __init__(self, fn):
        self.fn, self.compiled = fn, torch.compile(fn, dynamic=True)

    def __call__(self, *args):
        if not self.failed:
            try:
                return self.compiled(*args)
            except Exception as exc:
                if out_of_memory(exc):
                    raise
                text = str(exc).strip()
                self.failed.append(text.splitlines()[0] if text else type(exc).__name__)
                log.warning(
                    "warning: train.compile_loss: compiling the loss failed (%s); it runs eagerly",
                    self.failed[0],
                )
        return self.fn(*args)


def training_loss(tc) -> LossPasses:
    """The loss an :class:`~nmt.core.update.Updater` trains with under ``tc`` (the
    :class:`~nmt.config.TrainConfig`): :func:`~nmt.core.loss.label_smoothed_loss`, with
    ``compile_loss`` its two passes over ``tokens × vocab`` compiled, each fused into one read of
    the logits (and one write of their gradient) instead of eager's float32 copies. The values
    are the eager ones up to rounding."""
    if not tc.compile_loss:
        return EAGER
    log.info("train.compile_loss: compiling the loss; the first steps take longer")
    return LossPasses(_Compiled(rows_pass), _Compiled(gradient_pass))
