"""``nmt profile``: time, memory and cache bytes per part of decoding and training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nmt.config import BEAM, PRESETS, ConfigError
from nmt.fields import MAX_INT, Range

from .options import CKPT_HELP, Asked, DType, Threads, standard_output

WHOLE = Range(1, MAX_INT)


def profile(
    checkpoint: Annotated[
        Path | None, typer.Option("--checkpoint", help=f"{CKPT_HELP} Or give --preset.")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset", help=f"A random model of this size: {', '.join(PRESETS)} (8,000 pieces)."
        ),
    ] = None,
    beam_size: Annotated[
        int, typer.Option("--beam-size", "-b", help="Hypotheses per sentence.")
    ] = 5,
    batch: Annotated[
        int, typer.Option("--batch", help="Sentences decoded together (and in the training batch).")
    ] = 32,
    src_len: Annotated[
        int, typer.Option("--src-len", help="Source tokens per sentence, EOS included.")
    ] = 20,
    tgt_len: Annotated[
        int,
        typer.Option(
            "--tgt-len",
            help="Target pieces generated per sentence (EOS forbidden before, forced after).",
        ),
    ] = 25,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of the table.")
    ] = False,
    device_name: Annotated[
        str, typer.Option("--device", help="cpu, cuda, cuda:N or auto.")
    ] = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
) -> None:
    """Where decoding and training spend their time and memory, part by part, on batches of a fixed
    shape.

    Each row of the decode table is milliseconds and share of one batched decode: encoder
    self-attention; decoder self-attention; cross-attention (the source keys/values, computed
    once per sentence, included); feed-forward; output projection + log-softmax; search
    bookkeeping (restricting, top-k, finishing, reordering the cache); other (embeddings,
    residual sums, LayerNorm). The training table is one step, forward and backward, with the
    loss and the Adam update. Then: peak memory (resident set on a CPU, allocated on a GPU),
    throughput, milliseconds per generated piece for one sentence alone at beam 1 and 5, and
    the decoder cache in bytes, measured beside 2 · n_layers · batch · beam · n_heads · length
    · head_dim · bytes and the source side shared by each sentence's beams.
    """
    import torch

    from nmt.core.model import Transformer
    from nmt.runtime.device import to_dtype
    from nmt.tools.profiling import Shape, available_memory, largest_tensors_bytes
    from nmt.tools.profiling import profile as run_profile
    from nmt.translation.inference import Inference

    standard_output()
    if (checkpoint is None) == (preset is None):
        raise ConfigError(
            "give a model to profile: --checkpoint CKPT or --preset NAME (one of them)"
        )
    for flag, value, allowed in (
        ("--beam-size", beam_size, BEAM),
        ("--batch", batch, WHOLE),
        ("--src-len", src_len, WHOLE),
        ("--tgt-len", tgt_len, WHOLE),
    ):
        if value not in allowed:
            raise ConfigError(f"{flag} must be {allowed}, got {value}")
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r} is not one of {', '.join(PRESETS)}")
    dev, torch_dtype = Asked(device=device_name, threads=threads, dtype=dtype).device_and_dtype()
    if checkpoint is not None:
        model = Inference.load([checkpoint], dev, torch_dtype).model
    else:
        from nmt.config import ModelConfig

        torch.manual_seed(0)
        model = to_dtype(
            Transformer(ModelConfig(**PRESETS[preset], src_vocab_size=8000, tgt_vocab_size=8000))
            .to(dev)
            .eval(),
            torch_dtype,
        )
    shape = Shape(batch, src_len, tgt_len, beam_size)
    needed, available = largest_tensors_bytes(model.cfg, shape, dtype), available_memory(dev)
    if available is not None and needed > available:
        raise ConfigError(
            f"--batch {batch}, --src-len {src_len}, --tgt-len {tgt_len} and --beam-size "
            f"{beam_size} need at least {needed / 2**30:.1f} GiB"
            f" for their largest tensors, more than the {available / 2**30:.1f} GiB available on "
            f"{dev}; make them smaller"
        )
    result = run_profile(model, shape, dev, dtype)
    typer.echo(json.dumps(result) if as_json else format_profile(result))


def format_profile(result: dict) -> str:
    """:func:`profile`'s result as a table for a terminal."""
    lines = [
        f"{result['device']}, {result['dtype']}, {result['threads']} thread(s); batch "
        f"{result['shape']['batch']}, "
        f"beam {result['shape']['beam']}, {result['shape']['src_len']} source and "
        f"{result['shape']['tgt_len']} target pieces"
    ]
    for name, parts in (("decode", result["decode"]), ("training step", result["train"])):
        if parts is None:
            continue
        step = f" ({parts['step']})" if "step" in parts else ""
        lines.append(
            f"\n{name}{step}: {1000 * parts['seconds']:.1f} ms, peak memory "
            f"{parts['peak_memory_bytes'] / 2**20:.0f} MiB"
        )
        lines += [
            f"  {part:<32} {v['ms']:>9.1f} ms {100 * v['share']:>6.1f}%"
            for part, v in parts["parts"].items()
        ]
    d = result["decode"]
    lines.append(
        f"\nthroughput: {d['sentences_per_s']:.1f} sentences/s, {d['tokens_per_s']:.0f} target "
        "pieces/s"
    )
    lines.append(
        "latency, one sentence: "
        + ", ".join(f"{k} {v:.2f} ms a piece" for k, v in result["latency_ms_per_piece"].items())
    )
    c = result["cache"]
    lines.append(
        f"decoder cache: self-attention {c['self_kv_bytes_measured']:,} bytes measured, "
        f"{c['self_kv_bytes_formula']:,} by formula "
        f"({c['self_kv_bytes_allocated']:,} allocated); source side "
        f"{c['source_kv_bytes_measured']:,} shared "
        f"({c['source_kv_bytes_formula']:,} by formula; "
        f"{c['source_kv_bytes_if_copied_per_beam']:,} if copied per beam)"
    )
    return "\n".join([*lines, *busy_machine(result)])


def busy_machine(result: dict) -> list[str]:
    """On a CPU, a line saying how many of its threads the profile kept busy, and a warning where
    under 80% of them were (other work took the cores: every time above is longer than on an idle
    machine)."""
    if not result["device"].startswith("cpu") or "cpu" not in result:
        return []
    busy, threads = result["cpu"]["threads_busy"], result["threads"]
    said = [
        f"CPU time: {result['cpu']['cpu_seconds']:.1f} s in {result['cpu']['wall_seconds']:.1f} s "
        f"of wall time, {busy:.2f} of {threads} thread(s) busy"
    ]
    if busy < 0.8 * threads:
        said.append(
            f"warning: only {busy:.2f} of {threads} thread(s) were busy: other work shares these "
            "cores, and the times above are longer than on an idle machine; profile again when it "
            "is idle, or with fewer --threads"
        )
    return said
