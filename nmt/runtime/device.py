"""How nmt runs on a device, kept apart from what it computes (:mod:`nmt.core`): the device and
dtype, and every trick that makes a device faster without changing results beyond rounding,
each applied from here to a model built as the paper describes it:

* :func:`resolve_device`, :func:`resolve_dtype`: ``auto`` and what a device computes natively;
* :func:`to_dtype`: bfloat16/float16, or int8 linear layers (:class:`Int8Linear`) on a CPU, and
  float32 linear layers through oneDNN's packed weights (:class:`PackedLinear`) on a CPU;
* :func:`for_training`: on a CPU, dropout masks drawn four times faster (:mod:`nmt.runtime.dropout`)
and
  freed memory kept for reuse (:mod:`nmt.runtime.memory`);
* :func:`attention_backends`: the attention kernels a GPU may choose from;
* the search's step of fixed shapes replayed as CUDA graphs is the search's own
  (:mod:`nmt.decode.static`, chosen by :func:`nmt.decode.search.step_kind`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt.config import ConfigError
from nmt.core.model import Transformer

from .dropout import Dropout
from .memory import keep_freed_memory

log = logging.getLogger("nmt.runtime")

#: The attention kernels nmt lets ``scaled_dot_product_attention`` choose from on a GPU: flash
#: (causal self-attention, unmasked keys), memory-efficient (any boolean mask) and the reference
#: kernel. Not cuDNN's: it builds a new plan for every new shape, and in decoding every step's
#: key length is new (on an H200, 1.51 s of a 1.73 s decode of 32 sentences was cuDNN planning);
#: in training every batch's lengths are.
GPU_ATTENTION = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends(device: torch.device):
    """A context in which attention uses :data:`GPU_ATTENTION` on a GPU; elsewhere nothing
    changes."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(list(GPU_ATTENTION))


def resolve_device(name: str, what: str = "device") -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Args:
        what: how errors name the setting (``--device``, ``train.device``).

    Raises:
        ConfigError: an unknown device, or one this machine or torch build lacks.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"{what}: unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{what} {name!r} asked for, but this torch build or machine has no CUDA; use cpu or "
            "auto"
        )
    if (
        device.type == "cuda"
        and device.index is not None
        and device.index >= torch.cuda.device_count()
    ):
        raise ConfigError(
            f"{what} {name!r} asked for, but this machine has {torch.cuda.device_count()} CUDA "
            "device(s), numbered from 0"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"{what} {name!r} asked for, but this torch build or machine has no Apple MPS; use cpu "
            "or auto"
        )
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(
            f"{what}: unsupported device {name!r}; use auto, cpu, cuda, cuda:N or mps"
        )
    return device


def native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU multiplies bfloat16 matrices natively: x86 AMX-BF16 or AVX512-BF16,
    or Arm's BF16 extension, read from the flags in ``/proc/cpuinfo`` (or ``cpuinfo``).

    Without them PyTorch converts bfloat16 to float32 and back around every product: on
    AVX2-only CPUs bfloat16 decoding took 2x (500 Multi30k sentences, `small` model) to 7x
    (200 toy sentences, beam 5, 20 pieces each, one thread; CPU seconds) the time of float32.
    None where the flags cannot be read (not Linux).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    flags = {
        word
        for line in cpuinfo.splitlines()
        if line.split(":")[0].strip() in ("flags", "Features")
        for word in line.split(":", 1)[1].split()
    }
    return bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})


def resolve_dtype(name: str, device: torch.device, what: str = "dtype") -> torch.dtype:
    """``float32``, ``bfloat16``, ``float16``, ``int8`` (``torch.qint8``: see :func:`to_dtype`),
    or ``auto``: bfloat16 where ``device`` computes it natively (a GPU that supports it, a CPU
    per :func:`native_bf16`), else float32.

    Logs a warning when bfloat16 is asked for on a CPU without native support.

    Raises:
        ConfigError: an unknown name, or int8 on a device other than the CPU.
    """
    if name not in ("float32", "bfloat16", "float16", "int8", "auto"):
        raise ConfigError(f"{what} must be float32, bfloat16, float16, int8 or auto, got {name!r}")
    if name == "int8":
        if device.type != "cpu":
            raise ConfigError(
                f"{what} int8 runs on the CPU only (PyTorch's dynamic quantization); use --device "
                "cpu, or bfloat16/float16 on a GPU"
            )
        return torch.qint8
    native = (
        native_bf16()
        if device.type == "cpu"
        else device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if name == "auto":
        chosen = torch.bfloat16 if native else torch.float32
        log.info("%s auto: %s on %s", what, str(chosen).removeprefix("torch."), device)
        return chosen
    if name == "bfloat16" and device.type == "cpu" and native is False:
        log.warning(
            "warning: %s bfloat16 on a CPU without native bfloat16 (no AMX-BF16 or AVX512-BF16 "
            "flag in /proc/cpuinfo) "
            "runs several times slower than float32; use %s float32 or auto",
            what,
            what,
        )
    return getattr(torch, name)


class PackedLinear(nn.Module):
    """``F.linear(x, weight, bias)`` through oneDNN with ``weight`` ``(out, in)`` reordered once
    into oneDNN's blocked layout, for inference on the CPU (what CTranslate2 calls packed GEMM
    weights). On an AVX2 CPU with one thread the packed product is 10-30% faster than
    ``F.linear``'s MKL product at 32 rows or more, and up to 3x slower for a single row of a
    small matrix (``docs/performance.md``): inputs of fewer than ``min_rows`` rows go through
    ``F.linear``. The tied output matrix, read from memory at every decoding step, is packed for
    every row count. Results equal ``F.linear``'s to float32 rounding (another summation order),
    not bit for bit. Where autograd is recording, the dense weight is used.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, min_rows: int = 1):
        super().__init__()
        # a Linear's own Parameters stay its state_dict entries
        self.weight, self.bias, self.min_rows = (weight, bias, min_rows)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` → ``(..., out)``."""
        if (
            torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        ) or x.numel() < self.min_rows * x.size(-1):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


#: Rows from which a layer's product goes through its packed weight (see :class:`PackedLinear`).
#: Measured on whole searches (random `small` model, 1 thread, AVX2): one sentence at beam 1 (one
#: row a step) took 0.123 s with F.linear and 0.135 s packed, at beam 5 (five rows) 0.183 s and
#: 0.171 s.
PACKED_MIN_ROWS = 4


def pack_linear_layers(model: nn.Module, min_rows: int) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` replaced, in place, by a :class:`PackedLinear` of the same
    weight and bias Parameters (so ``state_dict`` is unchanged) that packs from ``min_rows`` rows
    on; returns ``model``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child.weight, child.bias, min_rows))
    return model


@functools.cache
def onednn_linear_works() -> bool:
    """Whether this torch build runs :class:`PackedLinear` (oneDNN present, its private ops as
    expected, results equal to ``F.linear`` on a small example); False falls back to
    ``F.linear``."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, bias, x = torch.randn(7, 5), torch.randn(7), torch.randn(2, 3, 5)
        with torch.inference_mode():
            return bool(
                torch.allclose(PackedLinear(weight, bias)(x), F.linear(x, weight, bias), atol=1e-5)
            )
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class Int8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamically quantized linear layer (int8 weights, activations quantized per
    call) with a shorter call: the operator's one overload directly, without the operator
    packet's per-call search of its arguments for script objects and the output's ``.to``
    (nmt's activations are float32, which the operator returns). One sentence at beam 5 (random
    `small` model, 1 thread) decoded in 0.096 s median against 0.102 s through the parent's call."""

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in)`` float32 → ``(..., out)`` float32."""
        # True: reduce_range, as the parent's version 4
        return torch.ops.quantized.linear_dynamic.default(
            x, self._packed_params._packed_params, True
        )


def to_dtype(model: Transformer, dtype: torch.dtype, per_channel: bool = True) -> nn.Module:
    """``model`` for inference in ``dtype`` (from :func:`resolve_dtype`): float32, bfloat16 or
    float16 weights and activations, or ``torch.qint8``: every ``nn.Linear`` dynamically
    quantized (an :class:`Int8Linear`) (int8 weights, one scale per output channel, or per matrix
    without ``per_channel``; activations quantized per batch on the fly) with PyTorch's own
    ``quantize_dynamic``, on the CPU, in ``torch.backends.quantized.engine``'s layout, and a
    quantized copy of the tied output matrix computes the logits. Embeddings, LayerNorm and the
    scores stay float32. In float32 on the CPU every linear layer becomes a :class:`PackedLinear`
    (:func:`pack_linear_layers`) and the logits come from a packed copy of the tied matrix.
    """
    if dtype != torch.qint8:
        model = model.to(dtype)
        if (
            dtype == torch.float32
            and next(model.parameters()).device.type == "cpu"
            and onednn_linear_works()
        ):
            pack_linear_layers(model, PACKED_MIN_ROWS)
            model.output_projection = PackedLinear(
                model.tgt_embed.weight.detach(), model.output_bias
            )
        return model
    from torch.ao.quantization import (
        default_dynamic_qconfig,
        per_channel_dynamic_qconfig,
        quantize_dynamic,
    )

    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    # torch.ao.quantization announces its move to torchao; it still works
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        mapping = {nn.Linear: Int8Linear}
        quantized = quantize_dynamic(
            model, {nn.Linear: qconfig}, dtype=torch.qint8, mapping=mapping
        )
        # The tied output matrix is the largest of all: a quantized copy of it computes the logits,
        # while the embeddings (and the checkpoint's tie) keep the float32 matrix.
        output = nn.Linear(
            model.cfg.d_model, model.cfg.tgt_vocab_size, bias=model.output_bias is not None
        )
        output.weight = nn.Parameter(model.tgt_embed.weight.detach().clone(), requires_grad=False)
        # an imported model's fixed logit bias (Marian's final_logits_bias)
        if model.output_bias is not None:
            output.bias = nn.Parameter(model.output_bias.detach().clone(), requires_grad=False)
        output.qconfig = qconfig
        quantized.output_projection = quantize_dynamic(
            nn.Sequential(output), {nn.Linear: qconfig}, dtype=torch.qint8, mapping=mapping
        )[0]
        return quantized


def fast_dropout(model: nn.Module) -> nn.Module:
    """Every ``nn.Dropout`` of ``model`` replaced, in place, by :class:`nmt.runtime.dropout.Dropout`
    (the same rate and inverted scaling, masks drawn four times faster on a CPU); returns
    ``model``."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, name, Dropout(child.p))
    return model


def for_training(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` ready to train on ``device``: on a CPU, :func:`fast_dropout`, and glibc told to
    keep freed memory (:func:`nmt.runtime.memory.keep_freed_memory`: a step's large tensors are not
    paged in again every step). Returns ``model``."""
    if device.type == "cpu":
        keep_freed_memory()
        fast_dropout(model)
    return model


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says that memory ran out: Python's ``MemoryError``, torch's
    ``OutOfMemoryError`` (a GPU's), or the ``RuntimeError`` torch's CPU allocator raises ("can't
    allocate memory")."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text
        or "not enough memory" in text
        or "out of memory" in text.lower()
    )


def check_fits(updater, batch, max_tokens: int) -> None:
    """Run the forward and backward pass of ``batch`` (the epoch's largest under
    ``train.max_tokens``) once before training, with the weights, optimizer and random generators
    left as they were; if it runs out of memory, halve the batch until a part fits and say, in one
    line, what does.

    Run on a GPU, where running out of memory is an error to recover from (a CPU's process is
    more often killed than told); :class:`~nmt.core.update.Updater` does the pass (:meth:`trial`).

    Raises:
        ConfigError: naming ``train.max_tokens`` and the largest budget found to fit.
    """
    device = updater.device
    states = (
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
    )

    def fits(part) -> bool:
        try:
            updater.trial(part)
            return True
        except (MemoryError, RuntimeError) as exc:
            if not out_of_memory(exc):
                raise
            updater.optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return False

    try:
        if fits(batch):
            return
        n = batch.src.size(0)
        while n > 1:
            n //= 2
            part = type(batch)(batch.src[:n], batch.tgt_in[:n], batch.tgt_out[:n])
            if fits(part):
                fitting = n * max(part.src.size(1), part.tgt_in.size(1))
                raise ConfigError(
                    f"train.max_tokens {max_tokens} does not fit in the memory of {device}: a "
                    f"batch of {fitting} tokens does; "
                    f"set train.max_tokens={fitting} or less (train.update_freq keeps the tokens "
                    "an update sees)"
                )
        raise ConfigError(
            f"train.max_tokens {max_tokens}: not even one sentence of the largest batch fits in "
            f"the memory of {device}; use a smaller model"
        )
    finally:
        torch.set_rng_state(states[0])
        if states[1] is not None:
            torch.cuda.set_rng_state_all(states[1])
