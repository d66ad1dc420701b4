"""How nmt runs on a device, kept apart from what it computes: choices that change speed, never results
beyond rounding. Each names what it is for and the measurement behind it."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

#: The attention kernels nmt lets ``scaled_dot_product_attention`` choose from on a GPU: flash
#: (causal self-attention, unmasked keys), memory-efficient (any boolean mask) and the reference
#: kernel. Not cuDNN's: it builds a new plan for every new shape, and in decoding every step's
#: key length is new (on an H200, 1.51 s of a 1.73 s decode of 32 sentences was cuDNN planning);
#: in training every batch's lengths are.
GPU_ATTENTION = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends(device: torch.device):
    """A context in which attention uses :data:`GPU_ATTENTION` on a GPU; elsewhere nothing changes."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(list(GPU_ATTENTION))
