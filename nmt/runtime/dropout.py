"""Dropout (Srivastava et al. 2014) with masks a CPU draws four times faster.

Vaswani et al. 2017, §5.4, apply dropout at rate P_drop to the sum of embeddings and
positions and to every sublayer's output before its residual sum; that is 17 masks per
training step of a 3+3-layer model. PyTorch's CPU ``dropout`` draws each element with
``bernoulli_``, one call to its random generator per element: on a 2-core CPU that was
11% of a ``small`` training step (torch.profiler), more than attention. Here one 64-bit
draw of the same generator gives two elements' 32-bit integers, and an element is kept
when its integer is at least a threshold, so the mask costs a quarter of the draws and
no floating-point sampling. The result is still inverted dropout: zero with probability
``p``, ``1 / (1 - p)`` otherwise, so the expectation of the output is the input.

The rate is applied exactly up to 2^-32 (``round(p · 2^32) / 2^32``, and the scale uses
that rate): finer than a float32 uniform draw compared with ``p`` (2^-24). The masks come
from ``torch``'s default CPU generator, so ``torch.manual_seed`` and a checkpoint's saved
random state reproduce them, whatever the number of threads. On a GPU, and for dtypes
other than float32 and float64 (a bfloat16 ``1 / (1 - p)`` would be inexact), and inside
``torch.compile`` (which cannot trace ``random_``), this is ``torch.nn.functional.dropout``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_EXACT_DTYPES = (torch.float32, torch.float64)


def checked_rate(p: float | Tensor) -> float:
    """``p`` as a float (a one-element tensor too, as ``torch.nn.Dropout`` takes).

    Raises:
        ValueError: ``p`` outside ``[0, 1]`` (NaN included).
    """
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout rate must be in [0, 1], got {p}")
    return p


def dropout_mask(
    shape: torch.Size | tuple[int, ...],
    p: float,
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
) -> Tensor:
    """A CPU mask of ``shape``: 0 with probability ``p``, ``1 / (1 - p)`` otherwise.

    Args:
        shape: any shape, empty ones included.
        p: the drop rate, ``0 <= p <= 1``; applied as ``round(p · 2^32) / 2^32``.
        dtype: the mask's dtype (that of what it multiplies).
        generator: the random generator; ``None`` is torch's default CPU generator.

    Raises:
        ValueError: ``p`` outside ``[0, 1]``.
    """
    return _mask(shape, checked_rate(p), dtype, generator)


def _mask(shape, p: float, dtype: torch.dtype, generator: torch.Generator | None = None) -> Tensor:
    """:func:`dropout_mask` for a rate already checked."""
    # elements whose uniform 32-bit integer is below this many of 2^32 are dropped
    drop = round(p * 2**32)
    if drop == 2**32:
        return torch.zeros(shape, dtype=dtype)
    n = math.prod(shape)
    # Two elements per 64-bit draw; random_(-2^63, None) draws the full 64-bit range (plain
    # random_() leaves the sign bit 0).
    bits = torch.empty((n + 1) // 2, dtype=torch.int64).random_(-(2**63), None, generator=generator)
    bits = bits.view(torch.int32)[:n].view(shape)  # uniform over [-2^31, 2^31)
    mask = torch.empty(shape, dtype=dtype)
    torch.ge(bits, drop - 2**31, out=mask)  # 1.0 where kept: P = 1 - drop / 2^32
    return mask.mul_(2**32 / (2**32 - drop))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` (any shape) at rate ``p``; ``x`` itself when not ``training``
    or ``p`` is 0. Gradients flow through the mask (``∂out/∂x = mask``).

    Raises:
        ValueError: ``p`` outside ``[0, 1]``, whether training or not.
    """
    return _dropout(x, checked_rate(p), training)


def _dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """:func:`dropout` for a rate already checked (a :class:`Dropout` checks its own once)."""
    if not training or p == 0.0:
        return x
    # torch.compile cannot trace random_ (a graph break at every mask): inside it, PyTorch's own.
    if x.device.type != "cpu" or x.dtype not in _EXACT_DTYPES or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    return x * _mask(x.shape, p, x.dtype)


class Dropout(nn.Module):
    """:func:`dropout` as a module, in place of ``torch.nn.Dropout`` (same ``p``, same
    ``train()``/``eval()``)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = checked_rate(p)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` with elements zeroed at rate ``p`` and the rest scaled by ``1 / (1 - p)`` (training
        only)."""
        return _dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        """``p=...`` in the module's repr, as ``torch.nn.Dropout`` shows it."""
        return f"p={self.p}"
