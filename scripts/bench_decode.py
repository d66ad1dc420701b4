#!/usr/bin/env python
r"""Decoding benchmark: nmt's beam search against its references, Hugging Face and CTranslate2.

Prints one JSON object per line per engine and batch size, as soon as it is measured.
Each engine runs in its own process, so peak resident memory is that engine's alone. For
speed comparisons every engine generates exactly ``--forced-len`` pieces per sentence
(EOS banned before, forced after), so random or undertrained weights compare fairly;
``--forced-len 0`` decodes freely and reports BLEU (use a trained ``--checkpoint`` for that).

Example (CPU, 2 threads, random `small` model, Multi30k test_2016_flickr):

    python scripts/bench_decode.py --preset small --lines 256 --beam 5 --batch 32 --forced-len 25

On a GPU, several batch sizes in one run (what ``scripts/gpu_check.py`` runs)::

    python scripts/bench_decode.py --device cuda --dtype bfloat16 --preset base --lines 1000 \
        --batch 1,32,64,128 --max-batches 32 --latency-sentences 0 --engines nmt,hf,ct2-float16

Engines: nmt (production, what ``nmt translate`` runs: on a GPU the step of fixed shapes replayed
as CUDA graphs, on a CPU the dynamic cache; source shared by the beams), nmt-dynamic (the dynamic
cache), nmt-static (the step of fixed shapes, eager on a CPU), nmt-tiled (source copied per beam),
nmt-recompute (no cache), hf (transformers MarianMTModel.generate on the exported model),
ct2-float32, ct2-int8, ct2-float16, ct2-bfloat16 (CTranslate2 on the converted model). An nmt
engine followed by ``@DTYPE`` (``nmt@float16``) runs in that dtype instead of ``--dtype``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def prepare(args, work: Path) -> None:
    """Write the model (checkpoint, HF export, CTranslate2 conversions) and the inputs into
    ``work``."""
    import torch

    from nmt.config import TokenizerConfig, config_from_dict, config_to_dict, with_vocab
    from nmt.core.model import Transformer
    from nmt.data.corpus import find_split_file, read_lines, read_parallel
    from nmt.interop.export import export_ctranslate2, export_huggingface
    from nmt.runs.checkpoint import load_checkpoint, save_checkpoint, tokenizer_to_tensors

    src = read_lines(find_split_file(args.data, args.split, "en"))[: args.lines]
    ref = read_lines(find_split_file(args.data, args.split, "de"))[: args.lines]
    (work / "src.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (work / "ref.txt").write_text("\n".join(ref) + "\n", encoding="utf-8")
    if args.checkpoint:
        loaded = load_checkpoint(args.checkpoint)
        model, tokenizer = loaded.model, loaded.tokenizer
        path = Path(args.checkpoint)
    else:
        from nmt.data.tokenizer import train_tokenizer

        train_src, train_tgt = read_parallel(
            find_split_file(args.data, "train", "en"), find_split_file(args.data, "train", "de")
        )
        tokenizer = train_tokenizer(
            train_src, train_tgt, TokenizerConfig(vocab_size=args.vocab_size)
        )
        cfg = config_from_dict({"model": {"preset": args.preset}})
        cfg = with_vocab(cfg, tokenizer.src.get_piece_size(), tokenizer.tgt.get_piece_size())
        torch.manual_seed(0)
        model = Transformer(cfg.model).eval()
        path = work / "model.pt"
        save_checkpoint(
            {
                "model": model.state_dict(),
                "config": config_to_dict(cfg),
                "tokenizer": tokenizer_to_tensors(tokenizer.protos()),
            },
            path,
        )
    (work / "checkpoint").write_text(str(path))
    engines = args.engines.split(",")
    if any(e == "hf" or e.startswith("ct2") for e in engines):
        export_huggingface(model, tokenizer, work / "hf")
    for e in engines:
        if e.startswith("ct2-"):
            quant = e.split("-", 1)[1]
            export_ctranslate2(
                work / "hf", work / e, None if quant == "float32" else quant, args.shortlist
            )


def peak_rss_bytes() -> int:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss, not inherited across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return -1


def batches(n_items: int, lengths: list[int], size: int, max_batches: int = 0) -> list[list[int]]:
    """Length-sorted batches of ``size`` items; with ``max_batches``, that many spread evenly
    over the sorted order (so short and long sentences are both represented)."""
    order = sorted(range(n_items), key=lambda i: lengths[i])
    plan = [order[i : i + size] for i in range(0, n_items, size)]
    if max_batches and len(plan) > max_batches:
        stride = len(plan) / max_batches
        plan = [plan[int(k * stride)] for k in range(max_batches)]
    return plan


def worker(args, work: Path) -> None:
    """Measure one engine at each batch size; prints one JSON record per batch size."""
    import torch

    from nmt.core.batching import pad_sources
    from nmt.decode.search import translate_batch
    from nmt.runs.checkpoint import load_checkpoint
    from nmt.runtime.device import attention_backends, resolve_dtype, to_dtype

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # nmt@float16: this engine in another dtype than --dtype
    engine, _, dtype_name = args.worker.partition("@")
    dtype_name = dtype_name or args.dtype
    # int8: float32 activations between quantized matmuls
    dtype = {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "int8": torch.float32,
    }[dtype_name]
    loaded = load_checkpoint(
        (work / "checkpoint").read_text()
    )  # in its own dtype: each engine casts it (to_dtype below)
    model, tokenizer, cfg = loaded.model.to(device), loaded.tokenizer, loaded.config
    del loaded  # its entries (the weights as read) are not the engine's memory
    lines = (work / "src.txt").read_text(encoding="utf-8").splitlines()
    ids = tokenizer.encode_src(lines)
    forced = args.forced_len
    beam = args.beam
    sp = tokenizer.src

    if engine.startswith("nmt"):
        from nmt.translation.shortlist import Shortlist

        if args.quantized_engine:
            # before quantizing: the weights are packed for it
            torch.backends.quantized.engine = args.quantized_engine
        model = to_dtype(
            model, resolve_dtype(dtype_name, device), per_channel=args.int8_weights == "per-channel"
        )
        shortlist = Shortlist.read(args.shortlist, tokenizer) if args.shortlist else None
        # nmt: what nmt.translation.inference runs on this device (decode.cache auto: the static
        # step with CUDA graphs on a GPU, the dynamic cache on a CPU); the others name the step.
        step = None if engine == "nmt" else engine.removeprefix("nmt-")

        def run(idx):
            src = pad_sources([ids[i] for i in idx]).to(device)
            if forced:
                decode = replace(
                    cfg.decode,
                    beam_size=beam,
                    length_penalty=0.0,
                    max_len_a=0.0,
                    max_len_b=forced,
                    min_len=forced,
                    n_best=1,
                )
            else:
                decode = replace(cfg.decode, beam_size=beam, length_penalty=args.alpha, n_best=1)
            columns = shortlist.columns([ids[i] for i in idx]) if shortlist is not None else None
            with attention_backends(device):
                hyps = translate_batch(
                    model, src, decode, step=step, rules=tokenizer.output_rules, columns=columns
                )
            return [h[0].tokens for h in hyps]

    elif engine == "hf":
        from transformers import MarianMTModel

        hf = MarianMTModel.from_pretrained(work / "hf", dtype=dtype).to(device).eval()

        def run(idx):
            src = pad_sources([ids[i] for i in idx]).to(device)
            kw = (
                dict(min_new_tokens=forced, max_new_tokens=forced + 1)
                if forced
                else dict(
                    max_new_tokens=int(cfg.decode.max_len_a * src.size(1) + cfg.decode.max_len_b)
                    + 1,
                    length_penalty=args.alpha,
                )
            )
            with torch.inference_mode():
                out = hf.generate(
                    input_ids=src,
                    attention_mask=(src != 0).long(),
                    num_beams=beam,
                    do_sample=False,
                    **kw,
                )
            return [[t for t in row[1:] if t > 3] for row in out.tolist()]

    else:
        import ctranslate2

        compute = engine.split("-", 1)[1]
        translator = ctranslate2.Translator(
            str(work / engine),
            device="cuda" if device.type == "cuda" else "cpu",
            compute_type=compute,
            intra_threads=args.threads,
        )

        def run(idx):
            pieces = [[sp.id_to_piece(t) for t in ids[i]] + ["</s>"] for i in idx]
            longest = max(len(p) for p in pieces)
            kw = (
                dict(min_decoding_length=forced, max_decoding_length=forced)
                if forced
                else dict(
                    max_decoding_length=int(cfg.decode.max_len_a * longest + cfg.decode.max_len_b),
                    length_penalty=args.alpha,
                )
            )
            results = translator.translate_batch(
                pieces, beam_size=beam, max_batch_size=len(idx), use_vmap=bool(args.shortlist), **kw
            )
            # target pieces (one model per side when not joint)
            return [[tokenizer.tgt.piece_to_id(p) for p in r.hypotheses[0]] for r in results]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    lengths = [len(s) for s in ids]
    for size in [int(b) for b in str(args.batch).split(",")]:
        plan = batches(len(ids), lengths, size, args.max_batches)
        # warm-up: the first batch, or every one (what CUDA graphs capture once)
        for idx in plan if args.warm_all else plan[:1]:
            run(idx)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        outputs: dict[int, list[int]] = {}
        for idx in plan:
            for i, toks in zip(idx, run(idx)):
                outputs[i] = toks
        sync()
        seconds = time.perf_counter() - start
        record = {
            "engine": args.worker,
            "device": args.device,
            "dtype": dtype_name if not engine.startswith("ct2") else engine.split("-", 1)[1],
            "threads": args.threads,
            "beam": beam,
            "batch_sentences": size,
            "sentences": len(outputs),
            "forced_len": forced,
            "shortlist": args.shortlist,
            **(
                {
                    "quantized_engine": torch.backends.quantized.engine,
                    "int8_weights": args.int8_weights,
                }
                if dtype_name == "int8" and engine.startswith("nmt")
                else {}
            ),
            # equal outputs, equal digests
            "outputs_digest": hashlib.sha256(
                json.dumps([outputs[i] for i in sorted(outputs)]).encode()
            ).hexdigest()[:16],
            "sentences_per_s": round(len(outputs) / seconds, 2),
            "tgt_tokens_per_s": round(sum(map(len, outputs.values())) / seconds, 1),
            "seconds": round(seconds, 3),
            "peak_rss_bytes": peak_rss_bytes(),
        }
        if device.type == "cuda":
            record["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            record["gpu"] = torch.cuda.get_device_name()
        if args.latency_sentences:
            single = list(range(min(args.latency_sentences, len(ids))))
            sync()
            t0 = time.perf_counter()
            for i in single:
                run([i])
            sync()
            record["latency_s_batch1"] = round((time.perf_counter() - t0) / len(single), 4)
        if args.profile and device.type == "cuda" and engine.startswith("nmt"):
            middle = plan[len(plan) // 2]
            record["profile"] = gpu_profile(lambda: run(middle), sync)  # noqa: B023 (called here, before the loop moves on)
        if engine.startswith("nmt") and device.type == "cuda":
            from nmt.decode.static import graph_report

            # captured so far: slabs, graphs, their buffers and pools
            record["cuda_graphs"] = graph_report(model)
            record["model_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        if engine == "nmt":
            record.update(
                cache_bytes(
                    model, cfg.model, [ids[i] for i in plan[-1]], beam, forced or 25, dtype, device
                )
            )
        if not forced and len(outputs) == len(ids):
            from nmt.scoring.evaluate import score

            hyps = tokenizer.decode_tgt([outputs[i] for i in range(len(ids))])
            refs = (work / "ref.txt").read_text(encoding="utf-8").splitlines()
            record.update({k: score(hyps, [refs])[k] for k in ("bleu", "chrf", "bleu_signature")})
        print(json.dumps(record), flush=True)


def gpu_profile(call, sync, top: int = 10) -> dict:
    """One batch decoded under torch.profiler: wall and kernel milliseconds (their difference is
    the GPU idling), kernel launches and graph replays, and the operators that take the most."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        sync()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    device_time = lambda e: (
        getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
    )
    count = lambda *names: sum(e.count for e in events if e.key in names)
    return {
        "wall_ms": round(wall * 1e3, 2),
        "gpu_busy_ms": round(sum(device_time(e) for e in events) / 1e3, 2),
        "kernel_launches": count("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"),
        "graph_replays": count("cudaGraphLaunch"),
        "syncs": count("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync"),
        "top_host_ms": {
            e.key[:80]: round(e.self_cpu_time_total / 1e3, 2)
            for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        },
        "top_gpu_ms": {
            e.key[:80]: round(device_time(e) / 1e3, 2)
            for e in sorted(events, key=device_time, reverse=True)[:top]
        },
    }


def cache_bytes(model, m, sources, beam: int, length: int, dtype, device) -> dict:
    """The decoder cache of one batch of ``sources`` after ``length`` steps, measured, beside
    the formula 2 · layers · batch · beam · heads · len · head_dim · bytes."""
    import torch

    from nmt.core.batching import pad_sources
    from nmt.runtime.device import attention_backends

    with torch.inference_mode(), attention_backends(device):
        src = pad_sources(sources).to(device)
        memory, mask = model.encode(src)
        cache = model.start_decoding(memory, mask, beam)
        tokens = torch.full((len(sources) * beam,), 5, device=device)
        for _ in range(length):
            _, cache = model.decode_step(tokens, cache)
    shared = cache.cross_kv.numel() * cache.cross_kv.element_size()
    return {
        "self_cache_bytes_measured": cache.self_kv[..., : cache.length, :].numel()
        * cache.self_kv.element_size(),
        "self_cache_bytes_allocated": cache.self_kv.numel() * cache.self_kv.element_size(),
        "self_cache_bytes_formula": 2
        * m.n_decoder_layers
        * len(sources)
        * beam
        * m.n_heads
        * length
        * (m.d_model // m.n_heads)
        * (torch.finfo(dtype).bits // 8),
        "cross_cache_bytes_shared": shared,
        "cross_cache_bytes_if_tiled": shared * beam,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data",
        default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")),
        help="Multi30k directory",
    )
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--lines", type=int, default=256, help="first N sentences of the split")
    p.add_argument(
        "--checkpoint", help="trained nmt checkpoint; default: a random model of --preset"
    )
    p.add_argument("--preset", default="small")
    p.add_argument("--engines", default="nmt,nmt-tiled,nmt-recompute,hf,ct2-float32,ct2-int8")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--batch",
        default="32",
        help="sentences per batch; several, comma-separated, are measured in turn",
    )
    p.add_argument(
        "--max-batches",
        type=int,
        default=0,
        help="decode at most this many batches per batch size, spread over the length-sorted input "
        "(0 = all)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=8000,
        help="joint BPE pieces of the random model's tokenizer",
    )
    p.add_argument(
        "--forced-len",
        type=int,
        default=25,
        help="pieces generated per sentence (0 = free decoding + BLEU)",
    )
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty for free decoding")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16", "int8"],
        help="nmt and hf engines; int8: nmt only (dynamic quantization of linear layers, CPU)",
    )
    p.add_argument(
        "--quantized-engine",
        choices=["x86", "fbgemm", "onednn", "qnnpack"],
        help="with --dtype int8: PyTorch's quantized engine (default: torch's)",
    )
    p.add_argument(
        "--int8-weights",
        choices=["per-channel", "per-tensor"],
        default="per-channel",
        help="with --dtype int8: one weight scale per output channel or per matrix",
    )
    p.add_argument(
        "--shortlist",
        help="a vocabulary shortlist (nmt shortlist) for nmt's engines and, as a vocabulary map, "
        "CTranslate2's",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="on a GPU, profile one batch of each size per nmt engine (idle, launches, host time)",
    )
    p.add_argument(
        "--warm-all",
        action="store_true",
        help="warm up on every batch of a size before timing it (CUDA graphs are captured once per "
        "bucket)",
    )
    p.add_argument(
        "--latency-sentences",
        type=int,
        default=16,
        help="sentences decoded one at a time for latency (0 = none)",
    )
    p.add_argument("--workdir", help="reuse a prepared directory (internal)")
    p.add_argument("--worker", help="measure this engine only (internal)")
    args = p.parse_args()
    if args.worker:
        worker(args, Path(args.workdir))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        prepare(args, work)
        for engine in args.engines.split(","):
            cmd = [
                sys.executable,
                __file__,
                *sys.argv[1:],
                "--workdir",
                str(work),
                "--worker",
                engine,
            ]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            sys.stdout.flush()
            # the worker's records go straight to stdout
            result = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, env=env)
            if result.returncode != 0:
                print(
                    json.dumps(
                        {"engine": engine, "error": result.stderr.strip().splitlines()[-1:]}
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
