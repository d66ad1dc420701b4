"""``nmt info``: what a checkpoint holds, read without running the model."""

# Size: format_info() at most 75: format_info() writes one line per field of a checkpoint, in the
# order printed.

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt.config import config_from_dict
from nmt.core.model import count_parameters, uninitialised_model
from nmt.data.multilingual import directions, tags, target_languages
from nmt.runs.checkpoint import load_checkpoint


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """Describe a checkpoint file (or a run directory's ``best.pt``).

    Returns:
        ``file``, ``size_bytes``; ``step``, ``epoch`` and ``best_bleu`` (best validation
        BLEU so far; None before the first validation or where the checkpoint has no
        progress record); ``parameters`` (distinct trainable, tied matrices counted once);
        ``dtype`` of the weights; ``tokenizer`` (type, vocabulary sizes, joint or not);
        ``optimizer_state`` (True: ``nmt train --resume`` can continue from it); the
        ``averaged_from`` list where the checkpoint is an average, and then ``progress_of``,
        ``"last averaged"``: ``step``, ``epoch`` and ``best_bleu`` are the last input's, as the
        average itself was never validated; ``init_from`` (``path``,
        ``step``) where its run was started from a checkpoint (``nmt train --init-from``);
        ``imported_from`` (``format``, ``path``, ``name_or_path``, ...) where its weights come
        from a model ``nmt import`` read; ``directions`` trained (``SRC-TGT``), ``tgt_langs``
        (what ``--tgt-lang`` may ask for) and their ``tags`` (none for a model of one target
        language); the resolved ``config``.

    Raises:
        nmt.runs.checkpoint.CheckpointError: the file is missing or not an nmt checkpoint.
    """
    loaded = load_checkpoint(path)
    file, payload = loaded.path, loaded.payload
    cfg = config_from_dict(payload["config"], str(file))
    parameters = count_parameters(uninitialised_model(cfg.model))
    progress = payload.get("progress", {})
    best = progress.get("best_bleu")
    weights = [v for v in payload["model"].values() if torch.is_floating_point(v)]
    info = {
        "file": str(file),
        "size_bytes": file.stat().st_size,
        "step": progress.get("step"),
        "epoch": progress.get("epoch"),
        "best_bleu": best if best is not None and best >= 0 else None,
        "parameters": parameters,
        "dtype": str(weights[0].dtype).removeprefix("torch.") if weights else None,
        "tokenizer": {
            "type": cfg.tokenizer.type,
            # marian: vocab.json's ids over two segmenters (nmt.data.vocab)
            "vocabulary": "marian" if "vocab" in payload["tokenizer"] else "sentencepiece",
            "joint": cfg.tokenizer.joint,
            "src_vocab_size": cfg.model.src_vocab_size,
            "tgt_vocab_size": cfg.model.tgt_vocab_size,
        },
        "optimizer_state": "optimizer" in payload,
        "directions": list(map(str, directions(cfg.data))),
        "tgt_langs": list(target_languages(cfg.data)),
        "tags": list(tags(cfg.data)),
        "config": payload["config"],
    }
    if "averaged_from" in payload:
        info["averaged_from"] = list(payload["averaged_from"])
        info["progress_of"] = "last averaged"
    for key in ("init_from", "imported_from"):
        if key in payload:
            info[key] = dict(payload[key])
    return info


def format_info(info: dict[str, Any]) -> str:
    """:func:`checkpoint_info` as lines of text for a person, the config as YAML at the end."""
    import yaml

    tk = info["tokenizer"]
    m = info["config"]["model"]
    # An average's progress record is its last input's: say so, as its own weights were never
    # validated.
    of_last = (
        " (of the last checkpoint averaged, not of the average)" if "averaged_from" in info else ""
    )
    vocab = (
        f"{tk['src_vocab_size']:,} pieces"
        if tk["joint"]
        else f"{tk['src_vocab_size']:,} source / {tk['tgt_vocab_size']:,} target pieces"
    )
    lines = [
        f"file: {info['file']} ({info['size_bytes'] / 1e6:.1f} MB)",
        f"step: {info['step'] if info['step'] is not None else 'unknown'}"
        + (f" (epoch {info['epoch']})" if info["epoch"] is not None else "")
        + of_last,
        (
            f"best validation BLEU: {info['best_bleu']:.2f}"
            if info["best_bleu"] is not None
            else "best validation BLEU: none (no validation yet)"
        )
        + of_last,
        f"parameters: {info['parameters']:,} ({info['dtype']}; d_model {m['d_model']}, d_ff "
        f"{m['d_ff']}, {m['n_heads']} heads, "
        f"{m['n_encoder_layers']}+{m['n_decoder_layers']} layers, {m['norm_position']}-LN)",
        f"tokenizer: {'joint' if tk['joint'] else 'separate'} SentencePiece {tk['type']}, {vocab}"
        if tk.get("vocabulary") != "marian"
        else "tokenizer: Marian's vocabulary "
        f"({'one for both sides' if tk['joint'] else 'one per side'}; {vocab}, nmt's padding "
        "row included) over source and "
        f"target SentencePiece {tk['type']} segmenters",
        "optimizer state: "
        + (
            "yes (nmt train --resume can continue from it)"
            if info["optimizer_state"]
            else "no (for translate and evaluate only)"
        ),
        f"directions: {', '.join(info['directions'])}"
        + (
            f" (into {', '.join(info['tgt_langs'])}: choose with --tgt-lang, the tags "
            f"{', '.join(info['tags'])}; any other source language is zero-shot)"
            if info["tags"]
            else ""
        ),
    ]
    if "averaged_from" in info:
        lines.append(f"averaged from: {', '.join(info['averaged_from'])}")
    if "init_from" in info:
        step = info["init_from"].get("step")
        lines.append(
            f"initialised from: {info['init_from']['path']} "
            f"({f'step {step}' if step is not None else 'not trained by nmt'}; nmt train "
            "--init-from)"
        )
    if "imported_from" in info:
        origin = info["imported_from"]
        lines.append(
            f"imported from: {origin['path']} ({origin.get('format')} "
            f"{origin.get('model_type', '')} {origin.get('name_or_path', '')}, "
            f"{origin.get('weights')}; nmt import)".replace("  ", " ")
        )
        lines += [
            f"  not applied from its generation settings: {note}"
            for note in origin.get("not_applied", [])
        ]
    lines.append("config:")
    lines += ["  " + line for line in yaml.safe_dump(info["config"], sort_keys=False).splitlines()]
    return "\n".join(lines)
