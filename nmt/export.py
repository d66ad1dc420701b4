"""Export to a Hugging Face ``MarianMTModel`` directory (weights, config, tokenizer).

Marian in ``transformers`` is the same Post-LN architecture with one difference: its
sinusoidal table puts all sines in the first half of the vector and all cosines in the
second, where nmt interleaves them (sine on even dimensions, cosine on odd, as in
Vaswani et al. 2017, §3.5). Every operation of the model commutes with a fixed
permutation of the model dimension (LayerNorm statistics are order-free, and each linear
map's rows or columns can be permuted with it), so the export permutes the whole
residual stream: ``marian[k] = ours[PERM[k]]`` with ``PERM = [0, 2, 4, …, 1, 3, 5, …]``.
The exported model computes exactly the same function. The directory also loads in
CTranslate2's ``ct2-transformers-converter``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .checkpoint import load_checkpoint, save_checkpoint
from .errors import Key, NmtError
from .model import Transformer
from .tokenizer import BOS, EOS, PAD, UNK, Tokenizer

log = logging.getLogger("nmt.export")


class ExportError(NmtError, ValueError):
    """The export cannot be made: the model uses a feature the target format cannot express, or a format, option or package is missing."""


def marian_permutation(d_model: int) -> torch.Tensor:
    """``PERM`` such that ``marian_vector = our_vector[PERM]``."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, with the model dimension permuted (see module doc)."""
    perm = marian_permutation(model.cfg.d_model)
    out: dict[str, torch.Tensor] = {}

    def reads(w):  # a linear map reading the residual stream: permute its input columns
        return w[:, perm].clone()

    def writes(prefix, linear):  # a linear map writing to the residual stream: permute its outputs
        out[f"{prefix}.weight"] = linear.weight[perm].clone()
        out[f"{prefix}.bias"] = linear.bias[perm].clone()

    def norm(prefix, ln):
        out[f"{prefix}.weight"], out[f"{prefix}.bias"] = ln.weight[perm].clone(), ln.bias[perm].clone()

    def projections(prefix, weights, biases):
        for name, w, b in zip(("q_proj", "k_proj", "v_proj"), weights, biases):
            out[f"{prefix}.{name}.weight"], out[f"{prefix}.{name}.bias"] = reads(w), b.clone()

    def ffn(prefix, layer):
        out[f"{prefix}.fc1.weight"], out[f"{prefix}.fc1.bias"] = reads(layer.ffn.fc1.weight), layer.ffn.fc1.bias.clone()
        writes(f"{prefix}.fc2", layer.ffn.fc2)

    for i, layer in enumerate(model.encoder):
        p = f"model.encoder.layers.{i}"
        sa = layer.self_attn
        projections(f"{p}.self_attn", sa.qkv.weight.chunk(3), sa.qkv.bias.chunk(3))
        writes(f"{p}.self_attn.out_proj", sa.out)
        norm(f"{p}.self_attn_layer_norm", layer.res_attn.norm)
        ffn(p, layer)
        norm(f"{p}.final_layer_norm", layer.res_ffn.norm)
    for i, layer in enumerate(model.decoder):
        p = f"model.decoder.layers.{i}"
        sa, ca = layer.self_attn, layer.cross_attn
        projections(f"{p}.self_attn", sa.qkv.weight.chunk(3), sa.qkv.bias.chunk(3))
        writes(f"{p}.self_attn.out_proj", sa.out)
        norm(f"{p}.self_attn_layer_norm", layer.res_self.norm)
        projections(f"{p}.encoder_attn", (ca.q.weight, *ca.kv.weight.chunk(2)), (ca.q.bias, *ca.kv.bias.chunk(2)))
        writes(f"{p}.encoder_attn.out_proj", ca.out)
        norm(f"{p}.encoder_attn_layer_norm", layer.res_cross.norm)
        ffn(p, layer)
        norm(f"{p}.final_layer_norm", layer.res_ffn.norm)
    embedding = reads(model.tgt_embed.weight)
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        out[name] = embedding
    out["final_logits_bias"] = torch.zeros(1, model.cfg.tgt_vocab_size)
    return out


def marian_model(model: Transformer, max_positions: int = 1024):
    """A ``transformers.MarianMTModel`` computing the same function as ``model`` (its weights
    permuted as the module doc says).

    Raises:
        ExportError: the model is Pre-LN or has separate source and target embeddings
            (Marian in ``transformers`` is Post-LN; separate embeddings are not exported yet).
        ImportError: ``transformers`` is not installed (``pip install transformers``).
    """
    from transformers import MarianConfig, MarianMTModel

    cfg = model.cfg
    if cfg.norm_position != "post":
        raise ExportError("Marian is a Post-LN model; a Pre-LN model cannot be exported to it")
    if model.src_embed is not model.tgt_embed:
        raise ExportError("only models with one embedding for source and target (tokenizer.joint: true, model.share_embeddings: true) can be exported")
    config = MarianConfig(
        vocab_size=cfg.tgt_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        max_position_embeddings=max_positions,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        scale_embedding=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=EOS,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    hf = MarianMTModel(config)
    missing, unexpected = hf.load_state_dict(marian_state_dict(model), strict=False)
    missing = [k for k in missing if "embed_positions" not in k]
    if missing or unexpected:
        raise ExportError(f"weight mapping incomplete: missing {missing}, unexpected {unexpected}")
    return hf


def export_huggingface(model: Transformer, tokenizer: Tokenizer, out_dir: Path, max_positions: int = 1024, tags: tuple[str, ...] = ()) -> None:
    """Write ``out_dir`` so that ``MarianMTModel.from_pretrained(out_dir)`` and
    ``MarianTokenizer.from_pretrained(out_dir)`` load it.

    Generation starts from BOS (``decoder_start_token_id``), stops at EOS, and never emits
    PAD, BOS or a target tag (``suppress_tokens``), as nmt's own search does.

    A multilingual model's target ``tags`` (``>>de<<``; :mod:`nmt.multilingual`) stay pieces of
    the vocabulary, so the export takes its input as OPUS-MT's multi-target models do,
    ``">>fr<< A dog runs."``: ``MarianTokenizer`` turns a leading tag into its id and encodes
    the rest, the ids ``nmt translate --tgt-lang fr`` gives the model.

    The tokenizer gives the ids nmt gives for any text (special-token spellings such as
    ``</s>`` and ``<pad>`` and very long words included) with two exceptions that
    ``MarianTokenizer`` cannot be configured out of: it removes a leading ``>>...<<``
    (Marian's target-language tag), which nmt reads as text; and it hands control
    characters to SentencePiece as they are, where nmt reads them as spaces
    (:func:`nmt.tokenizer.controls_as_spaces`). The export warns about both; for such
    lines, encode with nmt (or ``controls_as_spaces`` and ``source.spm``) and pass ``input_ids``.

    Raises:
        ExportError: as :func:`marian_model`, or the tokenizer is not joint.
        ImportError: ``transformers`` is not installed (``pip install transformers``).
    """
    from transformers import GenerationConfig, MarianTokenizer

    if not tokenizer.joint:
        raise ExportError("only models with a joint vocabulary (tokenizer.joint: true) can be exported")
    hf = marian_model(model, max_positions)
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, forced_eos_token_id=EOS,
        suppress_tokens=[PAD, BOS, *(tokenizer.tgt.piece_to_id(t) for t in tags)], max_length=max_positions,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    proto = tokenizer.protos()["joint"]
    (out_dir / "source.spm").write_bytes(proto)
    (out_dir / "target.spm").write_bytes(proto)
    sp = tokenizer.tgt
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    # split_special_tokens: a literal "</s>" or "<pad>" in the text is text, as nmt reads it, not an id.
    hf_tok = MarianTokenizer(
        source_spm=str(out_dir / "source.spm"), target_spm=str(out_dir / "target.spm"), vocab=str(out_dir / "vocab.json"),
        eos_token=sp.id_to_piece(EOS), unk_token=sp.id_to_piece(UNK), pad_token=sp.id_to_piece(PAD), model_max_length=max_positions,
        split_special_tokens=True,
    )
    hf_tok.save_pretrained(out_dir)
    if tags:
        log.warning("%s: a multilingual model: start each input with its target's tag (%s), as for OPUS-MT's multi-target models; MarianTokenizer "
                    "keeps control characters, which nmt reads as spaces; for such lines give the exported model the ids nmt's tokenizer gives",
                    out_dir, ", ".join(tags))
        return
    log.warning(
        "%s: MarianTokenizer removes a leading '>>...<<' (Marian's language tag) from its input, where nmt reads it as text, "
        "and keeps control characters, which nmt reads as spaces; for such lines give the exported model the ids nmt's tokenizer gives", out_dir,
    )


def export_slim(path: str | Path, out: str | Path) -> dict:
    """Write a checkpoint with only what ``nmt translate`` and ``nmt evaluate`` need: the
    model weights, config and tokenizer (plus the progress record and ``averaged_from``, a few
    bytes, for ``nmt info``). Without the optimizer's two moment estimates per weight and the
    RNG states it is about a third of the size; it cannot be resumed.

    Returns:
        The payload written.

    Raises:
        nmt.checkpoint.CheckpointError: ``path`` is not a readable checkpoint.
    """
    payload = load_checkpoint(path)
    slim = {key: payload[key] for key in ("model", "config", "tokenizer", "progress", "averaged_from", "run") if key in payload}
    save_checkpoint(slim, Path(out))
    return slim


def export_ctranslate2(hf_dir: Path, out_dir: Path, quantization: str | None = None) -> None:
    """Convert an exported Marian directory to a CTranslate2 model (C++ inference).

    CTranslate2's stock Marian loader assumes Marian's own conventions: the decoder starts
    from a zero embedding and the last vocabulary row is an extra PAD that it deletes.
    nmt models start from BOS and have no extra row, so this conversion uses the stock
    loader with those two conventions switched off; the result computes what nmt does.

    Args:
        quantization: None (float32), ``"int8"``, ``"float16"``, ``"bfloat16"``, ...

    Raises:
        ImportError: ``ctranslate2`` (and ``transformers``) are not installed.
    """
    import ctranslate2.converters.transformers as ct2t

    class NmtMarianLoader(ct2t.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2t.BartLoader.get_model_spec(self, model)

        def set_config(self, config, model, tokenizer):
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(BOS)

        def set_decoder(self, spec, decoder):
            ct2t.BartLoader.set_decoder(self, spec, decoder)

    stock = ct2t._MODEL_LOADERS["MarianConfig"]
    ct2t._MODEL_LOADERS["MarianConfig"] = NmtMarianLoader()
    try:
        ct2t.TransformersConverter(str(hf_dir)).convert(str(out_dir), quantization=quantization, force=True)
    finally:
        ct2t._MODEL_LOADERS["MarianConfig"] = stock


FORMATS = ("huggingface", "ctranslate2", "nmt")


def export(checkpoint: str | Path, out: str | Path, format: str = "huggingface", quantization: str | None = None) -> None:
    """Write ``checkpoint`` (a file, or a run directory's ``best.pt``) for deployment, as ``format``:
    a Hugging Face MarianMTModel directory, a CTranslate2 model directory (through the Marian one)
    or a slim nmt checkpoint (:func:`export_slim`).

    Raises:
        ExportError: an unknown ``format``, a ``quantization`` without ctranslate2 or one CTranslate2
            rejects, ``out`` the checkpoint itself, a missing package, or a model the format cannot express.
        nmt.checkpoint.CheckpointError: the checkpoint is missing or damaged.
        nmt.files.OutputError: ``out`` cannot be written.
    """
    import tempfile

    from .files import check_writable
    from .translate import load_model

    checkpoint, out = Path(checkpoint), Path(out)
    if format not in FORMATS:
        raise ExportError(Key("format"), f" {format!r} is not supported; use {', '.join(FORMATS)}")
    if quantization is not None and format != "ctranslate2":
        raise ExportError(Key("quantization"), " applies to ", Key("format"), f" ctranslate2 only, not {format}")
    if format == "nmt":
        check_writable(out, Key("out"))
        source = checkpoint / "best.pt" if checkpoint.is_dir() else checkpoint
        if out.exists() and source.exists() and out.samefile(source):
            raise ExportError(Key("out"), f" {out} is the checkpoint being exported; give another file name")
        export_slim(checkpoint, out)
        return
    model, tokenizer, cfg = load_model(checkpoint, torch.device("cpu"))
    from .multilingual import tags

    try:
        if format == "huggingface":
            export_huggingface(model, tokenizer, out, tags=tags(cfg.data))
            return
        with tempfile.TemporaryDirectory() as hf_dir:
            export_huggingface(model, tokenizer, Path(hf_dir), tags=tags(cfg.data))
            try:
                export_ctranslate2(Path(hf_dir), out, quantization)
            except ValueError as exc:  # CTranslate2 rejects an unknown quantization with a ValueError
                if quantization is None:
                    raise
                raise ExportError(Key("quantization"), f" {quantization!r}: {exc}") from None
    except ImportError as exc:
        raise ExportError(f"exporting to {format} needs {exc.name or 'transformers and ctranslate2'}: pip install -e \".[export]\"") from None
