"""``nmt profile``: where the time and memory of decoding and training go, part by part.

Timing is by forward hooks (and, for training, backward hooks) around the model's own
modules, on synthetic batches of fixed shape: ``batch`` sentences of ``src_len`` source
pieces (EOS included) each, decoded to exactly ``tgt_len`` pieces (EOS forbidden before,
forced after, as ``scripts/bench_decode.py`` does), so that every engine and every run does
the same work. On a GPU every hook synchronises, which costs a little of the time it measures.

Parts of a decode step: encoder self-attention (the encoder runs once, counted with the
decode), decoder self-attention, cross-attention (queries against the cached source side;
the source keys/values computed once per sentence count here too), feed-forward, output
projection and log-softmax, the search's own bookkeeping (restricting, top-k, finishing,
reordering the cache), and the rest (embeddings, residual sums, LayerNorm). A training
step's parts are the same, forward and backward, with the label-smoothed loss in the output
part and the Adam update as its own part.

The decoder cache is reported in bytes as measured (the filled positions of the
self-attention keys/values, and the capacity allocated) and by formula,
``2 · n_layers · batch · beam · n_heads · length · head_dim · bytes``, beside the source
side shared by each sentence's beams (``2 · n_layers · batch · n_heads · src_len ·
head_dim · bytes``) and what copying it per beam would take.
"""

# Size: module at most 500 lines: the parts profiled, their hooks, the timing step given to the
# search and the memory formulas printed beside them.

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from nmt.config import DecodeConfig, ModelConfig
from nmt.core.model import Transformer
from nmt.runtime.device import attention_backends, for_training

PARTS = (
    "encoder self-attention",
    "decoder self-attention",
    "cross-attention",
    "feed-forward",
    "output projection + log-softmax",
    "search bookkeeping",
    "other",
)
# On a GPU whose steps are captured: the decoder's parts run inside the graph replays.
CAPTURED_PARTS = ("encoder self-attention", "captured steps", "other")
TRAIN_PARTS = (
    "encoder self-attention",
    "decoder self-attention",
    "cross-attention",
    "feed-forward",
    "output projection + loss",
    "optimizer",
    "other",
)


@dataclass(frozen=True)
class Shape:
    """What is profiled: ``batch`` sentences of ``src_len`` source tokens (EOS included), decoded to
    ``tgt_len`` pieces with ``beam`` hypotheses each; a training batch has the same shape."""

    batch: int = 32
    src_len: int = 20
    tgt_len: int = 25
    beam: int = 5


class Timer:
    """Seconds spent inside modules, by part, from hooks; :meth:`part` times any other span."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self._open, self._handles = device, defaultdict(float), {}, []

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextlib.contextmanager
    def part(self, name: str):
        """Time the body as ``name``."""
        start = self._now()
        try:
            yield
        finally:
            self.seconds[name] += self._now() - start

    def watch(self, module: nn.Module, name: str, backward: bool = False) -> None:
        """Count ``module``'s forward (and, with ``backward``, its backward) as ``name``."""

        def begin(key):
            return lambda *args: self._open.__setitem__(key, self._now())

        def end(key):
            return lambda *args: self.seconds.__setitem__(
                name, self.seconds[name] + self._now() - self._open.pop(key)
            )

        self._handles += [
            module.register_forward_pre_hook(begin((id(module), "f"))),
            module.register_forward_hook(end((id(module), "f"))),
        ]
        if backward:
            self._handles += [
                module.register_full_backward_pre_hook(begin((id(module), "b"))),
                module.register_full_backward_hook(end((id(module), "b"))),
            ]

    def watch_model(self, model: Transformer, backward: bool = False) -> None:
        """Every attention and feed-forward module of ``model``, by part."""
        for layer in model.encoder:
            self.watch(layer.self_attn, "encoder self-attention", backward)
            self.watch(layer.ffn, "feed-forward", backward)
        for layer in model.decoder:
            self.watch(layer.self_attn, "decoder self-attention", backward)
            self.watch(layer.cross_attn, "cross-attention", backward)
            self.watch(layer.ffn, "feed-forward", backward)

    def close(self) -> None:
        """Remove the timing hooks from the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def shares(
    seconds: dict[str, float], total: float, parts: tuple[str, ...]
) -> dict[str, dict[str, float]]:
    """Each part's milliseconds and share of ``total``; ``other`` is what no part counted, so the
    shares sum to 1."""
    counted = {p: seconds.get(p, 0.0) for p in parts if p != "other"}
    counted["other"] = max(0.0, total - sum(counted.values()))
    whole = sum(counted.values()) or 1.0
    return {p: {"ms": 1000 * s, "share": s / whole} for p, s in counted.items()}


def peak_memory(device: torch.device, reset: bool = False) -> int:
    """Peak bytes: the GPU's ``max_memory_allocated``, or the process's peak resident set on the CPU
    (Linux resets it when ``reset``, through ``/proc/self/clear_refs``; elsewhere it is the
    process's peak)."""
    if device.type == "cuda":
        if reset:
            torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.max_memory_allocated(device)
    if reset:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    try:
        import resource  # POSIX only
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sources(shape: Shape, vocab: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``(batch, src_len)`` random source pieces, each row ending in EOS (no padding)."""
    from nmt.data.tokenizer import EOS

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (shape.batch, shape.src_len), generator=g)
    src[:, -1] = EOS
    return src.to(device)


def forced(shape: Shape, decode: DecodeConfig | None = None) -> DecodeConfig:
    """Search settings that generate exactly ``tgt_len`` pieces with ``beam`` hypotheses."""
    return replace(
        decode or DecodeConfig(),
        beam_size=shape.beam,
        n_best=1,
        length_penalty=0.0,
        max_len_a=0.0,
        max_len_b=shape.tgt_len,
        min_len=shape.tgt_len,
    )


def largest_tensors_bytes(cfg: ModelConfig, shape: Shape, dtype: str = "float32") -> int:
    """A lower bound on the memory a profile of ``shape`` needs, in bytes: the largest of the
    training step's logits with their gradient and log-softmax (3 × batch · tgt_len · vocab floats),
    its attention scores with their gradient and softmax (3 × batch · n_heads · max(src_len,
    tgt_len)²), both only where training is profiled (``dtype`` float32), and the decode's
    self-attention cache (the formula of :func:`cache_bytes`, in ``dtype``; int8 keeps float32
    activations) plus its step's scores over the vocabulary for every hypothesis (2 × batch · beam ·
    vocab, float32)."""
    head_dim, longest = cfg.d_model // cfg.n_heads, max(shape.src_len, shape.tgt_len)
    rows, element = shape.batch * shape.beam, {"bfloat16": 2, "float16": 2}.get(dtype, 4)
    training = (
        4
        * max(
            3 * shape.batch * shape.tgt_len * cfg.tgt_vocab_size,
            3 * shape.batch * cfg.n_heads * longest**2,
        )
        if dtype == "float32"
        else 0
    )
    decoding = (
        element * 2 * cfg.n_decoder_layers * rows * cfg.n_heads * shape.tgt_len * head_dim
        + 4 * 2 * rows * cfg.tgt_vocab_size
    )
    return max(training, decoding)


def available_memory(device: torch.device) -> int | None:
    """Bytes that can be allocated now: the GPU's free memory, or the system's ``MemAvailable``
    (Linux; None elsewhere)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo", encoding="ascii") as f:
            return 1024 * int(
                next(line for line in f if line.startswith("MemAvailable:")).split()[1]
            )
    return None


def cache_bytes(model: Transformer, shape: Shape, dtype: torch.dtype) -> dict[str, int]:
    """The decoder cache after ``tgt_len`` steps, measured, beside the formulas (module
    docstring)."""
    cfg = model.cfg
    element = torch.empty((), dtype=dtype).element_size()
    with torch.inference_mode():
        memory, mask = model.encode(
            sources(shape, cfg.src_vocab_size, next(model.parameters()).device)
        )
        cache = model.start_decoding(memory, mask, shape.beam)
        tokens = torch.full((shape.batch * shape.beam,), 5, device=memory.device)
        for _ in range(shape.tgt_len):
            _, cache = model.decode_step(tokens, cache)
    head_dim = cfg.d_model // cfg.n_heads
    return {
        "self_kv_bytes_measured": cache.self_kv[..., : cache.length, :].numel()
        * cache.self_kv.element_size(),
        "self_kv_bytes_formula": 2
        * cfg.n_decoder_layers
        * shape.batch
        * shape.beam
        * cfg.n_heads
        * shape.tgt_len
        * head_dim
        * element,
        "self_kv_bytes_allocated": cache.self_kv.numel() * cache.self_kv.element_size(),
        "source_kv_bytes_measured": cache.cross_kv.numel() * cache.cross_kv.element_size(),
        "source_kv_bytes_formula": 2
        * cfg.n_decoder_layers
        * shape.batch
        * cfg.n_heads
        * shape.src_len
        * head_dim
        * element,
        "source_kv_bytes_if_copied_per_beam": cache.cross_kv.numel()
        * cache.cross_kv.element_size()
        * shape.beam,
    }


class TimedStep:
    """The search's step, timed: its model's part (``score``) as ``scorer`` and each whole step
    (``run``) as ``step``; everything else is the step's own. What :func:`profile_decode` gives
    :func:`~nmt.decode.search.translate_batch` (``observe``)."""

    def __init__(self, step, timer: Timer):
        self._step, self._timer = step, timer

    def __getattr__(self, name):
        return getattr(self._step, name)

    def score(self, beams, step: int):
        """See the step's own ``score``."""
        with self._timer.part("scorer"):
            return self._step.score(beams, step)

    def run(self, step: int, fn, whole: bool, state):
        """See the step's own ``run``."""
        with self._timer.part("step"):
            return self._step.run(step, fn, whole, state)


def profile_decode(model, shape: Shape, device: torch.device) -> dict:
    """Time the parts of one batched decode (see the module docstring) and its peak memory, through
    the one way into the search with the step ``nmt translate`` runs on ``device`` (``decode.cache``
    auto): the dynamic cache on a CPU, the step of fixed shapes replayed as CUDA graphs on a GPU.
    A captured step's parts run inside one graph replay, so there they are reported as one,
    ``captured steps``."""
    from nmt.decode.search import translate_batch

    src, decode = sources(shape, model.cfg.src_vocab_size, device), forced(shape)
    # warm-up: first calls allocate, pick kernels and capture the graphs of the batch's bucket
    translate_batch(model, src, decode)
    timer = Timer(device)
    timer.watch_model(model)
    originals = ("encode", "start_decoding", "log_probs")
    steps = []

    def timed(name, function):
        def run(*args, **kwargs):
            with timer.part(name):
                return function(*args, **kwargs)

        return run

    def observe(step):
        steps.append(step)
        return TimedStep(step, timer)

    peak_memory(device, reset=True)
    try:
        model.encode, model.start_decoding = (
            timed("encode", model.encode),
            timed("source side", model.start_decoding),
        )
        model.log_probs = timed("output projection + log-softmax", model.log_probs)
        with timer.part("total"):
            translate_batch(model, src, decode, observe=observe)
    finally:
        for name in originals:
            delattr(model, name)  # the instance attributes go; the methods show through again
        timer.close()
    seconds = dict(timer.seconds)
    total = seconds["total"]
    # the source keys/values, computed once per sentence
    seconds["cross-attention"] += seconds.get("source side", 0.0)
    rest = total - seconds["encode"] - seconds.get("source side", 0.0)
    captured = bool(getattr(steps[0], "graphs", False))
    parts = CAPTURED_PARTS if captured else PARTS
    seconds["captured steps" if captured else "search bookkeeping"] = rest - seconds.get(
        "scorer", 0.0
    )
    return {
        "seconds": total,
        "step": steps[0].name + (", captured as CUDA graphs" if captured else ""),
        "parts": shares(seconds, total, parts),
        "peak_memory_bytes": peak_memory(device),
        "sentences_per_s": shape.batch / total,
        "tokens_per_s": shape.batch * shape.tgt_len / total,
    }


def latency(
    model, device: torch.device, src_len: int, tgt_len: int, beam: int, repeats: int = 3
) -> float:
    """Milliseconds per generated piece for one sentence alone (the fastest of ``repeats``)."""
    from nmt.decode.search import translate_batch

    shape = Shape(batch=1, src_len=src_len, tgt_len=tgt_len, beam=beam)
    src, decode = sources(shape, model.cfg.src_vocab_size, device, seed=1), forced(shape)
    translate_batch(model, src, decode)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        translate_batch(model, src, decode)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 1000 * best / tgt_len


def profile_train(cfg: ModelConfig, shape: Shape, device: torch.device) -> dict:
    """Time the parts of one training step (forward, backward, Adam) on a batch of ``shape``, and
    its peak memory.

    The output projection and loss, forward and backward, are timed by running them once
    more on the step's own decoder states (they are not a module that hooks can watch).
    """
    from nmt.config import TrainConfig
    from nmt.core.batching import Batch
    from nmt.core.update import Updater
    from nmt.data.tokenizer import BOS, EOS

    torch.manual_seed(0)
    model = for_training(Transformer(cfg).to(device), device)
    updater = Updater(model, TrainConfig(warmup_steps=1), device)
    src = sources(shape, cfg.src_vocab_size, device).cpu()
    tgt = sources(Shape(shape.batch, shape.tgt_len + 1), cfg.tgt_vocab_size, device, seed=2).cpu()
    tgt[:, 0], tgt[:, -1] = BOS, EOS
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:])
    updater.step([batch])  # warm-up
    timer = Timer(device)
    timer.watch_model(model, backward=True)
    optimizer_step = updater.optimizer.step

    def timed_optimizer(*args, **kwargs):
        with timer.part("optimizer"):
            return optimizer_step(*args, **kwargs)

    peak_memory(device, reset=True)
    try:
        updater.optimizer.step = timed_optimizer
        with timer.part("total"):
            updater.step([batch])
    finally:
        del updater.optimizer.step
        timer.close()
    peak = peak_memory(device)
    on_device = batch.to(device)
    with torch.no_grad():
        memory, mask = model.encode(on_device.src)
        states = model.decode_states(on_device.tgt_in, memory, mask)
    states.requires_grad_(True)
    with timer.part("output projection + loss"):
        updater.loss(states, on_device).loss.backward()
    model.zero_grad(set_to_none=True)
    seconds = dict(timer.seconds)
    total = seconds["total"]
    return {
        "seconds": total,
        "parts": shares(seconds, total, TRAIN_PARTS),
        "peak_memory_bytes": peak,
        "target_tokens_per_s": batch.n_tgt_tokens / total,
    }


def profile(model, shape: Shape, device: torch.device, dtype_name: str = "float32") -> dict:
    """Everything ``nmt profile`` reports, as one JSON-ready dict; with ``cpu``, the process's CPU
    seconds (all threads) against the wall's, which on a busy machine fall short of the threads'
    count times the wall time."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype_name, torch.float32)
    cpu, wall = time.process_time(), time.perf_counter()
    with attention_backends(
        device
    ):  # the kernels decoding and training choose from (nmt.runtime.device)
        result = _profile(model, shape, device, dtype_name, dtype)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return result | {"cpu": {"cpu_seconds": cpu, "wall_seconds": wall, "threads_busy": cpu / wall}}


def _profile(
    model, shape: Shape, device: torch.device, dtype_name: str, dtype: torch.dtype
) -> dict:
    cfg = model.cfg
    keys = ("d_model", "d_ff", "n_heads", "n_encoder_layers", "n_decoder_layers", "tgt_vocab_size")
    return {
        "model": {k: getattr(cfg, k) for k in keys},
        "shape": asdict(shape),
        "device": str(device),
        "dtype": dtype_name,
        "threads": torch.get_num_threads(),
        "decode": profile_decode(model, shape, device),
        "train": profile_train(cfg, shape, device) if dtype_name == "float32" else None,
        "cache": cache_bytes(model, shape, dtype),
        "latency_ms_per_piece": {
            f"beam {b}": latency(model, device, shape.src_len, shape.tgt_len, b) for b in (1, 5)
        },
    }
