#!/usr/bin/env python
r"""Training throughput: nmt's update step against Hugging Face's MarianMTModel and Eole, with MFU.

Each engine runs in its own process on the same batches: Multi30k train encoded with a
joint 8,000-piece BPE model, cut by nmt's token-budget sampler (``--max-tokens``, padding
included; several budgets, comma-separated, run in turn in each process), the first ``--warmup +
--steps`` batches of epoch 0 (then epoch 1, ...). nmt and Hugging Face start from the same
weights (the Marian model is nmt's export, which computes the same function); Eole builds its
own Transformer of the same sizes (Pre-LN, ``scripts/eole_engine.py``). All use fused Adam and
the noam schedule through nmt's update step. Each uses its own toolkit's label smoothing (ε
0.1): nmt's loss (whole logits, chunks with ``nmt-chunked``, Liger-Kernel's fused kernel made
to compute it with ``nmt-liger``), transformers' ``LabelSmoother`` (what ``Seq2SeqTrainer``
runs with ``label_smoothing_factor``) and Eole's ``LossCompute``; HF's and Eole's spread ε over
all ``V`` classes, nmt's over ``V − 2``. Engines run in turn ``--rounds`` times and the fastest
run of each is reported (this machine's speed drifts by up to 15%). Prints one JSON line per
engine and budget, then the ratios to Hugging Face and Eole at each budget; an engine that
cannot run prints an error line and the others go on (the exit status is 1 only when one of
nmt's failed).
On a CPU the nmt engines keep freed memory for reuse (glibc ``mallopt``, ``nmt/memory.py``), as
``nmt train`` does; ``hf`` runs with glibc's defaults, as a Hugging Face script would, and
``hf-heap`` with the same setting as nmt (``freed_memory_kept`` in each record).
With ``--products N`` each engine also reports the share of its step spent in matrix
products (torch.profiler over N more steps): a step can get no faster than those products.

FLOPs of a step count the matrix products of the batch's padded shapes: with ``B``
sentences, ``S`` source and ``T`` target positions, width ``d``, ``d_ff``, vocabulary
``V``, ``L_e``/``L_d`` layers, the forward pass is

    L_e · (2BS(4d² + 2d·d_ff) + 4BS²d)                       encoder
  + L_d · (2BT(6d² + 2d·d_ff) + 4BSd² + 4BT²d + 4BTSd)       decoder (self, cross, FFN)
  + 2BTdV                                                      output projection

and a training step is 3× that (backward = 2× forward). Causal self-attention is counted
in full, as the CPU kernels compute it. MFU is achieved FLOP/s over the rate of a large
square matrix product in the training dtype measured in the same process. ``mfu_6n`` is the
common rule instead: 6 FLOPs per parameter per token it sees (the encoder's and the source
embedding per source token, the decoder's and the output matrix per target token; padding
not counted) against the card's published dense bf16 peak (``PEAK_BF16_TFLOPS``; None on a
CPU).

Example (CPU, 2 threads)::

    python scripts/bench_train.py --preset small --max-tokens 2500 --steps 20 --engines nmt,hf

On a GPU (what ``scripts/gpu_check.py`` runs)::

    python scripts/bench_train.py --device cuda --precision bf16 --preset base \
        --max-tokens 40000 --rounds 1

Data: ``--data`` or $MULTI30K (default ``../shared/data/multi30k`` beside the checkout),
a directory with ``train.en`` and ``train.de`` (plain or ``.gz``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def step_flops(m, batch_size: int, src_len: int, tgt_len: int) -> int:
    """Training FLOPs of one batch (module doc formula); ``m`` is a ModelConfig."""
    B, S, T, d, f, V = batch_size, src_len, tgt_len, m.d_model, m.d_ff, m.tgt_vocab_size
    enc = m.n_encoder_layers * (2 * B * S * (4 * d * d + 2 * d * f) + 4 * B * S * S * d)
    dec = m.n_decoder_layers * (
        2 * B * T * (6 * d * d + 2 * d * f)
        + 4 * B * S * d * d
        + 4 * B * T * T * d
        + 4 * B * T * S * d
    )
    return 3 * (enc + dec + 2 * B * T * d * V)


def matmul_ceiling(device, dtype, size: int, trials: int = 5) -> float:
    """Best FLOP/s of ``(size × size) @ (size × size)`` in ``dtype`` on ``device``.

    On a GPU each trial times 10 products between two synchronisations (one is too short
    to time alone), on a CPU one; the best of ``trials`` after one warm-up trial. Inputs
    are random: zeros run faster than real data on some GPUs.
    """
    import torch

    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    repeats = 10 if device.type == "cuda" else 1
    best = float("inf")
    for _ in range(trials + 1):
        sync(device)
        t = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - t) / repeats)
    return 2 * size**3 / best


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# nmt's engines: the TrainConfig settings each runs with ("nmt-liger": the loss is Liger-Kernel's
# fused linear cross entropy, :func:`uniform_smoothing_loss`).
NMT_ENGINES = {
    "nmt": {},
    "nmt-chunked": {"loss_chunk_tokens": "chunk"},
    "nmt-compile-loss": {"compile_loss": True},
    "nmt-compile": {"compile": True},
    "nmt-compile-chunked": {"compile": True, "compile_loss": True, "loss_chunk_tokens": "chunk"},
    "nmt-liger": {},
    "nmt-compile-liger": {"compile": True},
}
# The card's dense bf16 peak (TFLOP/s, without sparsity) by a part of its name, for the 6·N MFU.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}


def uniform_smoothing_loss(states, target, smoothing: float, model, cross_entropy=None):
    """The label-smoothed loss of nmt (:func:`nmt.core.loss.label_smoothed_loss`: ε over the
    ``V − 2`` classes that are neither the reference nor PAD) from a cross entropy that spreads its
    smoothing over all ``V`` classes (PyTorch's ``label_smoothing``, Liger-Kernel's): with ``ε' =
    εV/(V − 2)`` the two differ per token by ``ε/(V − 2) · (z_PAD − z_ref)``, a difference of two
    logits that needs no softmax. ``cross_entropy(weight, bias, states, target, smoothing')`` is
    the summed loss of ``states`` ``(tokens, d_model)`` projected by ``weight`` and ``bias`` (PAD
    targets ignored); None: Liger's fused kernel on a GPU, PyTorch's on the whole logits elsewhere
    (its CPU twin). Returns a :class:`~nmt.core.loss.LossOutput` whose NLL is the loss (not
    computed)."""
    import torch

    from nmt.core.loss import LossOutput
    from nmt.core.pieces import PAD

    h, t = states.reshape(-1, states.size(-1)), target.reshape(-1)
    weight = model.tgt_embed.weight
    vocab = weight.size(0)
    wider = smoothing * vocab / (vocab - 2)
    if cross_entropy is None:
        cross_entropy = liger_cross_entropy if h.is_cuda else torch_cross_entropy
    loss = cross_entropy(weight, model.output_bias, h, t, wider)
    keep = t != PAD
    # z_PAD − z_ref (the output bias, if any, enters both): the logits' difference in float32
    w = weight.float()
    gap = (h.float() * (w[PAD] - w[torch.where(keep, t, PAD)])).sum(-1)
    if model.output_bias is not None:
        gap = gap + model.output_bias[PAD] - model.output_bias[t]
    loss = loss + smoothing / (vocab - 2) * torch.where(keep, gap, 0.0).sum()
    return LossOutput(loss, loss.detach(), keep.sum())


def torch_cross_entropy(weight, bias, h, t, smoothing):
    """PyTorch's cross entropy of the whole logits (Liger's CPU twin), summed."""
    import torch.nn.functional as F

    logits = F.linear(h, weight, bias).float()
    return F.cross_entropy(logits, t, ignore_index=0, label_smoothing=smoothing, reduction="sum")


def liger_cross_entropy(weight, bias, h, t, smoothing):
    """Liger-Kernel's fused linear cross entropy (chunked, Triton), summed."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    kernel = LigerFusedLinearCrossEntropyLoss(
        ignore_index=0, label_smoothing=smoothing, reduction="sum"
    )
    return kernel(weight, h, t, bias)


def child(args) -> None:
    import torch

    from nmt.config import config_from_dict, with_vocab
    from nmt.core.batching import TokenBatchSampler, collate
    from nmt.core.model import Transformer, count_parameters
    from nmt.core.update import Updater
    from nmt.data.corpus import ParallelText
    from nmt.data.encoded import encode_corpus
    from nmt.data.vocab import tokenizer_from_dir
    from nmt.runtime.compiled import compiling
    from nmt.runtime.device import attention_backends, for_training
    from nmt.runtime.memory import keep_freed_memory

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # What `nmt train` does on a CPU (nmt/memory.py); "hf-heap" gives Hugging Face's step the same
    # allocator.
    kept = (
        device.type == "cpu"
        and (args.engine == "hf-heap" or not args.engine.startswith("hf"))
        and keep_freed_memory()
    )
    tokenizer = tokenizer_from_dir(Path(args.work))
    corpus, _ = encode_corpus(
        ParallelText.files(*train_files(args.data)),
        tokenizer,
        Path(args.work) / "cache",
        max_len=100,
        max_len_ratio=3.0,
        threads=1,
    )
    settings = {
        key: args.chunk_tokens if value == "chunk" else value
        for key, value in NMT_ENGINES.get(args.engine, {}).items()
    }
    overrides = {
        "model": {"preset": args.preset, "dropout": 0.1},
        "train": {"precision": args.precision, "warmup_steps": 4000, **settings},
    }
    cfg = with_vocab(
        config_from_dict(overrides), tokenizer.src.get_piece_size(), tokenizer.tgt.get_piece_size()
    )
    torch.manual_seed(0)
    # as nmt train: the CPU's dropout masks (nmt.runtime.device)
    model = for_training(Transformer(cfg.model).to(device), device)
    # as nmt train: the step compiled with train.compile, the loss's passes with compile_loss
    loss_fn, compile_step = compiling(cfg.train, device)
    loss_kernel = "nmt" + (
        f", chunks of {args.chunk_tokens}" if cfg.train.loss_chunk_tokens else ""
    )
    parameters = count_parameters(model)
    if args.engine.endswith("liger"):
        loss_fn = uniform_smoothing_loss
        loss_kernel = "liger" if device.type == "cuda" else "torch (liger's CPU twin)"
    elif args.engine.startswith("hf"):
        model, loss_fn = hf_engine(model, tokenizer, cfg, device)
        loss_kernel = "transformers LabelSmoother"
    elif args.engine == "eole":
        from eole_engine import build

        torch.manual_seed(0)
        model, loss_fn = build(cfg.model, cfg.model.tgt_vocab_size, device)
        parameters = count_parameters(model)
        loss_kernel = "eole"
    updater = Updater(
        model,
        cfg.train,
        device,
        loss_fn=loss_fn,
        context=lambda: attention_backends(device),
        compile_step=compile_step,
    )
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    ceiling = (
        args.ceiling_tflops * 1e12
        if args.ceiling_tflops
        else matmul_ceiling(device, dtype, args.matmul_size)
    )
    peak = peak_flops(device, args.precision)
    counts = split_parameters(cfg.model)
    for max_tokens in (int(n) for n in str(args.max_tokens).split(",")):
        sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens, seed=1)
        indices, epoch = [], 0
        # a large budget leaves fewer batches in an epoch than a run needs
        while len(indices) < args.warmup + args.steps:
            indices += sampler.epoch_batches(epoch)
            epoch += 1
        indices = indices[: args.warmup + args.steps]
        pin = device.type == "cuda"
        batches = [
            collate(corpus, b, pin_memory=pin, multiple=args.pad_to_multiple) for b in indices
        ]
        record = timed_steps(updater, batches, args, device)
        timed = batches[args.warmup :]
        seconds = record.pop("seconds")
        tgt_tokens = sum(b.n_tgt_tokens for b in timed)
        src_tokens = sum(int(b.src.ne(0).sum()) for b in timed)
        padded = sum(b.src.numel() + b.tgt_out.numel() for b in timed)
        flops = sum(
            step_flops(cfg.model, b.src.size(0), b.src.size(1), b.tgt_out.size(1)) for b in timed
        )
        # the common 6·N rule: each parameter costs 6 FLOPs a token it sees (encoder: source
        # tokens; decoder and output matrix: target tokens), padding not counted
        flops_6n = 6 * (counts["encoder"] * src_tokens + counts["decoder"] * tgt_tokens)
        record = {
            "engine": args.engine,
            "device": str(device),
            "precision": args.precision,
            "threads": args.threads,
            "freed_memory_kept": kept,
            "preset": args.preset,
            "parameters": parameters,
            "loss_kernel": loss_kernel,
            "max_tokens": max_tokens,
            "steps": len(timed),
            **record,
            "tgt_tokens_per_s": round(tgt_tokens / seconds, 1),
            "tgt_tokens_per_step": round(tgt_tokens / len(timed), 1),
            "src_tokens_per_step": round(src_tokens / len(timed), 1),
            "padding_fraction": round(1 - (src_tokens + tgt_tokens) / padded, 4),
            "tflops_per_s": float(f"{flops / seconds / 1e12:.4g}"),
            "matmul_ceiling_tflops": float(f"{ceiling / 1e12:.4g}"),
            "mfu": round(flops / seconds / ceiling, 4),
            # 6·N against the card's published dense peak (None where it is not known)
            "peak_tflops": peak and peak / 1e12,
            "mfu_6n": peak and round(flops_6n / seconds / peak, 4),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        if args.products:
            record |= product_share(updater, timed[-args.products :])
        if args.profile_steps and device.type == "cuda":
            record["profile"] = gpu_profile(updater, timed[-args.profile_steps :], device)
        if device.type == "cuda":
            record["gpu"] = torch.cuda.get_device_name(device)
        print(json.dumps(record), flush=True)


def timed_steps(updater, batches, args, device) -> dict:
    """Run ``batches``' updates, timing those after ``args.warmup``: their seconds (summed and
    the median), the first update's loss, the graphs torch.compile built and those after the
    warm-up, and on a GPU the peak memory of these updates."""
    import torch
    from torch._dynamo.utils import counters  # graphs torch.compile built (recompiles included)

    times, first_loss, warm_graphs = [], None, counters["stats"]["unique_graphs"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i, batch in enumerate(batches):
        if i == args.warmup:
            warm_graphs = counters["stats"]["unique_graphs"]
        sync(device)
        t = time.perf_counter()
        out = updater.step([batch])[0]
        sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
        if first_loss is None:
            first_loss = float(out.loss) / float(out.n_tokens)
    record = {
        "seconds": sum(times),
        "step_time_s": round(statistics.median(times), 4),
        "first_step_loss": round(first_loss, 5),
        # torch.compile's graphs, and those compiled after the warm-up steps: with lengths
        # bounded (--pad-to-multiple), a step that stopped recompiling shows 0
        "compiled_graphs": counters["stats"]["unique_graphs"],
        "recompiles_after_warmup": counters["stats"]["unique_graphs"] - warm_graphs,
    }
    if device.type == "cuda":
        record["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        record["cuda_max_reserved_mb"] = round(torch.cuda.max_memory_reserved(device) / 2**20, 1)
    return record


def split_parameters(m) -> dict:
    """Parameters of a ModelConfig ``m`` by the tokens they see: ``encoder`` (its layers and the
    source embedding) and ``decoder`` (its layers and the output matrix), a shared matrix counted
    on each side that uses it, as the 6·N rule counts work, not storage."""
    from nmt.core.model import uninitialised_model

    model = uninitialised_model(m)
    size = lambda module: sum(p.numel() for p in module.parameters())
    embedding = m.tgt_vocab_size * m.d_model
    return {
        "encoder": size(model.encoder) + size(model.encoder_norm) + m.src_vocab_size * m.d_model,
        "decoder": size(model.decoder) + size(model.decoder_norm) + embedding,
    }


def peak_flops(device, precision: str) -> float | None:
    """The card's published dense peak (FLOP/s) in bf16/fp16 by its name, None on a CPU, in
    fp32 or for a card not in ``PEAK_BF16_TFLOPS``."""
    import torch

    if device.type != "cuda" or precision == "fp32":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v * 1e12 for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def hf_engine(model, tokenizer, cfg, device):
    """Hugging Face's MarianMTModel with ``model``'s weights (nmt's export, the same function)
    behind nmt's ``(src, tgt_in, project)`` interface, and transformers' ``LabelSmoother`` (what
    ``Seq2SeqTrainer(label_smoothing_factor=0.1)`` computes) as a sum."""
    import torch

    from nmt.core.loss import LossOutput
    from nmt.interop.export import marian_model

    hf = marian_model(model, tokenizer).to(device)
    hf.config._attn_implementation = "sdpa"

    class Marian(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf, self.cfg = hf, model.cfg

        def forward(self, src, tgt_in, project=True):  # always logits: the smoother projects none
            return self.hf(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=tgt_in).logits

    from transformers.trainer_pt_utils import LabelSmoother

    smoother = LabelSmoother(epsilon=cfg.train.label_smoothing, ignore_index=0)

    def hf_loss(logits, target, smoothing, _model):
        loss = smoother({"logits": logits}, target, num_items_in_batch=1)
        return LossOutput(loss, loss.detach(), (target != 0).sum())

    return Marian(), hf_loss


# the matrix products of a step: linear layers, their gradients
PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def product_share(updater, batches) -> dict:
    """How much of the time of ``batches``' updates (under torch.profiler, CPU) the matrix products
    take, and the fastest such a step could be if everything else took no time at all."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            updater.step([batch])
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.key in PRODUCTS)
    return {
        "profiled_steps": len(batches),
        "products_share": round(products / total, 4),
        "products_s_per_step": round(products / 1e6 / len(batches), 4),
    }


def gpu_profile(updater, batches, device, top: int = 12) -> dict:
    """Where the GPU's time goes in ``batches``' updates (torch.profiler): wall and kernel seconds
    per step (their difference is the GPU idling: launches, host work, synchronisation) and the
    kernels and host operators that take the most, in ms per step."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for batch in batches:
            updater.step([batch])
        sync(device)
    wall = (time.perf_counter() - start) / len(batches)
    events = prof.key_averages()
    device_time = lambda e: (
        getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
    )
    kernels = sorted((e for e in events if device_time(e) > 0), key=device_time, reverse=True)
    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    per_step = lambda us: round(us / 1e3 / len(batches), 3)
    return {
        "steps": len(batches),
        "wall_ms_per_step": round(wall * 1e3, 3),
        "gpu_busy_ms_per_step": per_step(sum(device_time(e) for e in events)),
        "launches_per_step": round(
            sum(
                e.count
                for e in events
                if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")
            )
            / len(batches),
            1,
        ),
        "top_gpu_ms": {e.key[:80]: per_step(device_time(e)) for e in kernels[:top]},
        "top_host_ms": {e.key[:80]: per_step(e.self_cpu_time_total) for e in host[:top]},
    }


def train_files(data: str) -> tuple[Path, Path]:
    """The English and German training files of ``data`` (plain or ``.gz``)."""
    from nmt.data.corpus import find_split_file

    return find_split_file(data, "train", "en"), find_split_file(data, "train", "de")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
    )
    parser.add_argument("--preset", default="small")
    parser.add_argument(
        "--max-tokens",
        default="2500",
        help="tokens a batch, padding included; several, comma-separated, run in turn in each "
        "engine's process (one record each)",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=8192,
        help="train.loss_chunk_tokens of the chunked engines",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument(
        "--matmul-size",
        type=int,
        default=2048,
        help="side of the square product that measures the ceiling",
    )
    parser.add_argument(
        "--ceiling-tflops",
        type=float,
        default=0.0,
        help="MFU against this matrix-product rate (TFLOP/s) instead of one measured in each "
        "engine's process",
    )
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint BPE pieces")
    parser.add_argument(
        "--engines",
        default="nmt,hf",
        help="nmt, nmt-chunked (train.loss_chunk_tokens), nmt-compile (train.compile), "
        "nmt-compile-chunked (and compile_loss), nmt-compile-loss (train.compile_loss), nmt-liger "
        "and nmt-compile-liger (Liger-Kernel's fused linear cross entropy made nmt's loss; "
        "PyTorch's on a CPU), hf (MarianMTModel), hf-heap (the same with freed memory kept, as nmt "
        "keeps it on a CPU), eole (Eole's Transformer and loss, scripts/eole_engine.py)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs per engine, alternating; the fastest is reported",
    )
    parser.add_argument(
        "--products",
        type=int,
        default=0,
        help="then profile the last N timed batches again (CPU) and report the matrix products' "
        "share of a step and their seconds per step",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="on a GPU, profile N more steps of each engine: where the GPU's time goes (kernels, "
        "idling)",
    )
    parser.add_argument(
        "--pad-to-multiple",
        type=int,
        default=1,
        help="round each batch's lengths up to a multiple of this (train.pad_to_multiple)",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        child(args)
        return
    from nmt.config import TokenizerConfig
    from nmt.data.corpus import read_parallel
    from nmt.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as work:
        src, tgt = read_parallel(*train_files(args.data))
        train_tokenizer(src, tgt, TokenizerConfig(vocab_size=args.vocab_size)).save(Path(work))
        records = {}  # (engine, max_tokens) -> the fastest record
        failed = []
        # engines alternate, so a slow spell of the machine hits all of them
        for round_ in range(args.rounds):
            for engine in args.engines.split(","):
                cmd = [sys.executable, __file__, *sys.argv[1:], "--engine", engine, "--work", work]
                env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    # one engine that cannot run (a kernel package missing, a peer that fails)
                    # leaves the table to the others
                    said = (out.stderr.strip() or "no message").splitlines()[-1]
                    print(json.dumps({"engine": engine, "error": said[-500:]}), flush=True)
                    failed.append(engine)
                    continue
                for line in out.stdout.strip().splitlines():
                    if not line.startswith("{"):
                        continue
                    record = json.loads(line)
                    key = (engine, record["max_tokens"])
                    best = records.get(key)
                    if best is None or record["step_time_s"] < best["step_time_s"]:
                        records[key] = {**record, "rounds": args.rounds}
                    if round_ == args.rounds - 1:  # final: printed now, so a run cut short keeps it
                        print(json.dumps(records[key]), flush=True)
        ratios = {}
        for (engine, max_tokens), r in records.items():
            for peer in ("hf", "hf-heap", "eole"):
                other = records.get((peer, max_tokens))
                if other and engine != peer and not (engine.startswith("hf") and peer != "eole"):
                    ratios[f"{engine}/{peer} tokens_per_s @{max_tokens}"] = round(
                        r["tgt_tokens_per_s"] / other["tgt_tokens_per_s"], 3
                    )
            # The same batches: were a step nothing but its products, its ratio would be at most
            # this.
            hf = records.get(("hf", max_tokens))
            if hf and not engine.startswith("hf") and "products_s_per_step" in r:
                ratios[f"{engine}/hf bound, products only @{max_tokens}"] = round(
                    hf["step_time_s"] / r["products_s_per_step"], 3
                )
        if ratios:
            print(json.dumps({"ratios": ratios}), flush=True)
        if any(engine.startswith("nmt") for engine in failed):
            sys.exit(f"nmt's engines failed: {', '.join(sorted(set(failed)))}")


if __name__ == "__main__":
    main()
