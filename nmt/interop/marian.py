"""Hugging Face Marian (``MarianMTModel``, the OPUS-MT models) ↔ nmt, both directions.

Marian in ``transformers`` is the Post-LN Transformer of Vaswani et al. 2017 with a few
differences, each of which nmt represents:

* **Positions.** Its sinusoidal table puts all sines in the first half of the vector and all
  cosines in the second (``MarianSinusoidalPositionalEmbedding``), where nmt interleaves them
  (sine on even dimensions, cosine on odd, §3.5); the frequencies are the same. Every
  operation of the model commutes with a fixed permutation of the model dimension (LayerNorm
  statistics are order-free, and each linear map's rows or columns can be permuted with it),
  so the whole residual stream is permuted: ``marian[k] = ours[PERM[k]]`` with ``PERM = [0, 2,
  4, …, 1, 3, 5, …]`` (:func:`permutation`). The model code keeps the paper's layout.
* **Vocabulary.** One embedding matrix for encoder, decoder and output, its ``<pad>`` row
  zero, decoding started from ``<pad>``, and ids from ``vocab.json``. nmt renumbers the rows
  into its own layout (PAD 0, UNK 1, BOS 2, EOS 3: :class:`nmt.data.vocab.Layout`), adding a PAD
  row of zeros whose output bias is :data:`NEVER` (so its probability is exactly 0 and the
  log-softmax normaliser is Marian's); Marian's ``<pad>`` becomes nmt's BOS, the token
  decoding starts from, which the search never generates (``transformers`` bans it with
  ``bad_words_ids``, after the log-softmax, as nmt does).
* **Output bias** ``final_logits_bias``: ``model.output_bias``. **Activation** swish (SiLU):
  ``model.activation: swish``.

:func:`to_marian` and :func:`from_marian` are one table (:func:`links`) read both ways:
``nmt export`` writes with the first, ``nmt import`` reads with the second. A model nmt
trained keeps its own ids and starts from BOS when exported; an imported one gets Marian's
layout back, so export after import gives the weights it was imported from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.config import ModelConfig
from nmt.data.tokenizer import Tokenizer
from nmt.data.vocab import MarianTokenizer
from nmt.errors import NmtError

log = logging.getLogger("nmt.marian")

#: The output bias of nmt's PAD row in an imported model: finite, so that no -inf ever enters
#: the loss, and low enough that ``exp`` of it is exactly 0 in float32 (and bfloat16).
NEVER = -1.0e4


class MarianError(NmtError, ValueError):
    """A Hugging Face directory nmt cannot import, or a model nmt cannot export to Marian; the
    message names the file and key."""


def permutation(d_model: int) -> torch.Tensor:
    """``PERM`` such that ``marian_vector = our_vector[PERM]``."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# A tensor's role decides how the permutation applies to it: a linear map READS the residual
# stream (its input columns permute) or WRITES to it (its output rows and bias permute); a
# LayerNorm's weight and bias permute. Embeddings read (their columns permute), by vocabulary rows.
READS, WRITES, NORM = "reads", "writes", "norm"


def links(cfg: ModelConfig) -> list[tuple[str, int, int, str, str]]:
    """Every linear map and LayerNorm as ``(nmt module, chunk, chunks, Marian module, role)``: the
    Marian module is chunk ``chunk`` of ``chunks`` of the nmt module's output rows (nmt fuses
    Q/K/V)."""
    out = []

    def attention(ours: str, theirs: str, fused: list[tuple[str, str]]) -> None:
        for name, parts in fused:
            out.extend(
                (f"{ours}.{name}", k, len(parts), f"{theirs}.{p}_proj", READS)
                for k, p in enumerate(parts)
            )
        out.append((f"{ours}.out", 0, 1, f"{theirs}.out_proj", WRITES))

    for i in range(cfg.n_encoder_layers):
        p, m = f"encoder.{i}", f"model.encoder.layers.{i}"
        attention(f"{p}.self_attn", f"{m}.self_attn", [("qkv", "qkv")])
        out += [
            (f"{p}.res_attn.norm", 0, 1, f"{m}.self_attn_layer_norm", NORM),
            (f"{p}.ffn.fc1", 0, 1, f"{m}.fc1", READS),
            (f"{p}.ffn.fc2", 0, 1, f"{m}.fc2", WRITES),
            (f"{p}.res_ffn.norm", 0, 1, f"{m}.final_layer_norm", NORM),
        ]
    for i in range(cfg.n_decoder_layers):
        p, m = f"decoder.{i}", f"model.decoder.layers.{i}"
        attention(f"{p}.self_attn", f"{m}.self_attn", [("qkv", "qkv")])
        out.append((f"{p}.res_self.norm", 0, 1, f"{m}.self_attn_layer_norm", NORM))
        attention(f"{p}.cross_attn", f"{m}.encoder_attn", [("q", "q"), ("kv", "kv")])
        out += [
            (f"{p}.res_cross.norm", 0, 1, f"{m}.encoder_attn_layer_norm", NORM),
            (f"{p}.ffn.fc1", 0, 1, f"{m}.fc1", READS),
            (f"{p}.ffn.fc2", 0, 1, f"{m}.fc2", WRITES),
            (f"{p}.res_ffn.norm", 0, 1, f"{m}.final_layer_norm", NORM),
        ]
    return out


def _embedding_names(shared: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Marian's names of the source embedding and of the target embedding (with the output
    projection, tied to it)."""
    if shared:
        names = (
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        )
        return names, names
    return ("model.encoder.embed_tokens.weight",), (
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
    )


@dataclass(frozen=True)
class Rows:
    """How vocabulary rows meet: ``src``/``tgt`` hold, for each Marian id, its nmt id (None: the
    same ids, a model nmt trained)."""

    src: list[int] | None = None
    tgt: list[int] | None = None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Rows:
        """The row maps of an imported model's tokenizer; None on both sides (the same ids) for a
        tokenizer nmt trained."""
        if isinstance(tokenizer, MarianTokenizer):
            return cls(tokenizer.src.layout.to_marian(), tokenizer.tgt.layout.to_marian())
        return cls()


def to_marian(
    state: dict[str, torch.Tensor], cfg: ModelConfig, rows: Rows = Rows()
) -> dict[str, torch.Tensor]:
    """Nmt's weights ``state`` under Marian's names: the model dimension permuted, vocabulary rows
    in Marian's order.

    ``final_logits_bias`` is the output bias (zeros for a model without one).
    """
    perm = permutation(cfg.d_model)
    out: dict[str, torch.Tensor] = {}
    for ours, k, n, theirs, role in links(cfg):
        w, b = state[f"{ours}.weight"].chunk(n)[k], state[f"{ours}.bias"].chunk(n)[k]
        out[f"{theirs}.weight"] = (w[:, perm] if role == READS else w[perm]).clone()
        out[f"{theirs}.bias"] = (b if role == READS else b[perm]).clone()

    def vocabulary(weight: torch.Tensor, order: list[int] | None) -> torch.Tensor:
        return (weight if order is None else weight[order])[:, perm].clone()

    src_names, tgt_names = _embedding_names(cfg.share_embeddings)
    src, tgt = (
        vocabulary(state["src_embed.weight"], rows.src),
        vocabulary(state["tgt_embed.weight"], rows.tgt),
    )
    out |= dict.fromkeys(src_names, src) | dict.fromkeys(tgt_names, tgt)
    bias = state.get("output_bias", torch.zeros(cfg.tgt_vocab_size))
    out["final_logits_bias"] = (bias if rows.tgt is None else bias[rows.tgt]).clone().view(1, -1)
    return out


def from_marian(
    marian: dict[str, torch.Tensor], cfg: ModelConfig, rows: Rows, path: Path | str = "weights"
) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_marian`: Marian's weights ``marian`` as nmt's state dict (float32).

    Raises:
        MarianError: a tensor is missing, unexpected (an embedding LayerNorm, a final LayerNorm:
            a model nmt cannot represent), of the wrong shape, or tied tensors that differ.
    """
    _check_names(marian, cfg, path)
    inverse = torch.argsort(permutation(cfg.d_model))
    parts: dict[str, list[list[torch.Tensor | None]]] = {}
    for ours, k, n, theirs, role in links(cfg):
        w, b = marian[f"{theirs}.weight"].float(), marian[f"{theirs}.bias"].float()
        pair = parts.setdefault(ours, [[None] * n, [None] * n])
        pair[0][k], pair[1][k] = (
            (w[:, inverse] if role == READS else w[inverse]),
            (b if role == READS else b[inverse]),
        )
    state = {
        f"{ours}.{suffix}": torch.cat(chunks)
        for ours, (weights, biases) in parts.items()
        for suffix, chunks in (("weight", weights), ("bias", biases))
    }

    def vocabulary(names: tuple[str, ...], order: list[int], size: int) -> torch.Tensor:
        given = [name for name in names if name in marian]
        first = marian[given[0]].float()
        for name in given[1:]:  # tied in Marian: one matrix under several names
            if not torch.equal(marian[name].float(), first):
                raise MarianError(
                    f"{path}: {name} differs from {given[0]}, which config.json ties it to; nmt "
                    "ties them"
                )
        if first.shape != (len(order), cfg.d_model):
            raise MarianError(
                f"{path}: {given[0]} has shape {tuple(first.shape)}, config.json and the "
                f"vocabulary say ({len(order)}, {cfg.d_model})"
            )
        weight = torch.zeros(size, cfg.d_model)  # the PAD row nmt adds stays zero
        weight[order] = first[:, inverse]
        return weight

    src_names, tgt_names = _embedding_names(cfg.share_embeddings)
    state["src_embed.weight"] = vocabulary(src_names, rows.src, cfg.src_vocab_size)
    state["tgt_embed.weight"] = (
        state["src_embed.weight"]
        if cfg.share_embeddings
        else vocabulary(tgt_names, rows.tgt, cfg.tgt_vocab_size)
    )
    bias = marian["final_logits_bias"].float().view(-1)
    if bias.numel() != len(rows.tgt):
        raise MarianError(
            f"{path}: final_logits_bias has {bias.numel()} entries, the target vocabulary "
            f"{len(rows.tgt)}"
        )
    # what no Marian row fills: the PAD row nmt adds, if it adds one
    state["output_bias"] = torch.full((cfg.tgt_vocab_size,), NEVER)
    state["output_bias"][rows.tgt] = bias
    _check_positions(marian, cfg.d_model, path)
    return state


MARIAN_LAYERS = {
    "n_encoder_layers": r"model\.encoder\.layers\.(\d+)\.",
    "n_decoder_layers": r"model\.decoder\.layers\.(\d+)\.",
}
MARIAN_WIDTHS = {
    "d_model": ("model.encoder.layers.0.fc1.weight", 1),
    "d_ff": ("model.encoder.layers.0.fc1.weight", 0),
}


def _check_names(marian: dict[str, torch.Tensor], cfg: ModelConfig, path) -> None:
    """Refuse a state dict with tensors the model config does not describe, or without ones it does;
    sizes first, before a layer count of config.json (10^9) is looped over
    (:func:`nmt.runs.checkpoint.size_mismatches`)."""
    from nmt.runs.checkpoint import size_mismatches

    wrong = size_mismatches(cfg, marian, MARIAN_LAYERS, MARIAN_WIDTHS, "config.json")
    if wrong:
        raise MarianError(
            f"{path}: the weights do not fit the model config.json describes ({'; '.join(wrong)})"
        )
    src_names, tgt_names = _embedding_names(cfg.share_embeddings)
    expected = {
        f"{theirs}.{s}" for _, _, _, theirs, _ in links(cfg) for s in ("weight", "bias")
    } | {"final_logits_bias"}
    optional = {
        *src_names,
        *tgt_names,
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_positions.weight",
    }
    unexpected = sorted(set(marian) - expected - optional)
    missing = sorted(expected - set(marian))
    missing += [
        f"{names[0]} (or {', '.join(names[1:])})"
        for names in (src_names, tgt_names)
        if not any(n in marian for n in names)
    ]
    if unexpected or missing:

        def listed(names):
            return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")

        what = "; ".join(
            f"{label}: {listed(names)}"
            for label, names in (("unexpected", unexpected), ("missing", missing))
            if names
        )
        hint = (
            " (an embedding or final LayerNorm, or another part nmt's Post-LN Transformer does not "
            "have)"
            if unexpected
            else ""
        )
        raise MarianError(
            f"{path}: the weights do not fit the model config.json describes ({what}){hint}"
        )


def marian_positions(length: int, d_model: int) -> torch.Tensor:
    """``MarianSinusoidalPositionalEmbedding``'s table ``(length, d_model)``: sines in the first
    half, cosines in the second."""
    from nmt.core.layers import sinusoidal_positions

    return sinusoidal_positions(length, d_model)[:, permutation(d_model)]


def _check_positions(marian: dict[str, torch.Tensor], d_model: int, path) -> None:
    """Stored position tables (older files have them) must be the sinusoids nmt computes: learned
    positions are refused."""
    for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        if name in marian:
            table = marian[name].float()
            expected = marian_positions(table.size(0), d_model)
            # 2e-3: float16 files round sin/cos
            if table.shape != expected.shape or (table - expected).abs().max() > 2e-3:
                raise MarianError(
                    f"{path}: {name} is not the sinusoidal table (learned positions?), which nmt "
                    "computes and cannot replace"
                )


# ---------------------------------------------------------------------------------------------
# Reading a directory
