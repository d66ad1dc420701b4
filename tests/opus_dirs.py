"""Hugging Face Marian directories in the OPUS-MT layout, built offline with random weights.

They are made as ``transformers``' Marian converter makes OPUS-MT's: two SentencePiece
unigram models (``source.spm``, ``target.spm``) that only segment; a vocabulary of their
own (``vocab.json``: ``</s>`` 0, ``<unk>`` 1, the pieces Marian counted in the training
text, most frequent first, so that some pieces the SentencePiece models know are missing,
language codes such as ``>>fr<<``, then ``<pad>`` last); ``config.json`` with the keys an
OPUS-MT ``config.json`` has (the older generation keys and Bart's flags included);
``generation_config.json`` as the hub has them; ``tokenizer_config.json`` as the converter
writes it. The weights are random, with a non-zero ``final_logits_bias`` (its ``<pad>``
entry 0 and the ``<pad>`` row zero, as the converter adds them), then trained for a few steps
with transformers' own loss on the toy corpus: untrained random models either end at once or
repeat one piece to the length limit, and an exactness test wants outputs of several lengths.
"""

from __future__ import annotations

import collections
import functools
import io
import json
from pathlib import Path

import sentencepiece as spm
import torch
from conftest import TOY

SOURCE = (TOY / "train.en").read_text(encoding="utf-8").splitlines()[:800]
TARGET = (TOY / "train.de").read_text(encoding="utf-8").splitlines()[:800]
CODES = (">>fr<<", ">>de<<")


@functools.lru_cache(maxsize=None)
def segmenter(side: str, size: int) -> bytes:
    """A SentencePiece unigram model (SentencePiece's own special ids, as OPUS-MT's have) of
    ``size`` pieces."""
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SOURCE if side == "source" else TARGET),
        model_writer=buffer,
        vocab_size=size,
        model_type="unigram",
        minloglevel=2,
        num_threads=1,
    )
    return buffer.getvalue()


def marian_vocab(
    protos: list[bytes], lines: list[list[str]], codes: tuple[str, ...], size: int | None = None
) -> dict[str, int]:
    """What Marian counts: ``</s>`` 0, ``<unk>`` 1, the pieces of the first half of the text by
    frequency, the codes, and ``<pad>`` last (``size`` pieces in all, when given: the rarest left
    out, or made-up ones added)."""
    counts: collections.Counter = collections.Counter()
    for proto, text in zip(protos, lines):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for piece_list in sp.encode(text[: len(text) // 2], out_type=str):
            counts.update(piece_list)
    pieces = [piece for piece, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    if size is not None:
        room = size - 3 - len(codes)
        pieces = (pieces + [f"\u2581made{i}" for i in range(room)])[:room]
    return {p: i for i, p in enumerate(dict.fromkeys(["</s>", "<unk>", *pieces, *codes, "<pad>"]))}


def _train(model, tokenizer, steps: int, seed: int) -> None:
    """A few Adam steps on the toy corpus with transformers' own loss: enough for outputs that end,
    of several lengths."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        # the last 100 lines stay unseen
        rows = torch.randint(0, len(SOURCE) - 100, (24,), generator=generator).tolist()
        batch = tokenizer(
            [SOURCE[i] for i in rows],
            text_target=[TARGET[i] for i in rows],
            padding=True,
            return_tensors="pt",
        )
        batch["labels"][batch["labels"] == model.config.pad_token_id] = -100
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def make_opus_dir(
    out: Path,
    d_model: int = 32,
    layers: tuple[int, int] = (2, 2),
    heads: int = 4,
    ffn: int = 64,
    activation: str = "swish",
    separate_vocabs: bool = False,
    weights: str = "safetensors",
    seed: int = 0,
    num_beams: int = 4,
    max_length: int = 40,
    eos_bias: float = 0.0,
    gain: float = 1.0,
    train_steps: int = 40,
    **config_changes,
) -> Path:
    """Write an OPUS-MT-like directory at ``out`` (see the module docstring) and return it."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    protos = [segmenter("source", 150), segmenter("target", 170)]
    if separate_vocabs:
        vocab = marian_vocab(protos[:1], [SOURCE], CODES)
        # the converter assumes one size for both (one pad id)
        target_vocab = marian_vocab(protos[1:], [TARGET], (), size=len(vocab))
        (out / "target_vocab.json").write_text(
            json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8"
        )
    else:
        vocab, target_vocab = marian_vocab(protos, [SOURCE, TARGET], CODES), None
    size, pad = len(vocab), vocab["<pad>"]
    assert sorted(vocab.values()) == list(range(size)) and (
        target_vocab is None or len(target_vocab) == size
    )
    (out / "source.spm").write_bytes(protos[0])
    (out / "target.spm").write_bytes(protos[1])
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps({"target_lang": "de", "source_lang": "en", "separate_vocabs": separate_vocabs})
    )
    config = dict(
        vocab_size=size,
        decoder_vocab_size=size,
        max_position_embeddings=128,
        d_model=d_model,
        encoder_layers=layers[0],
        decoder_layers=layers[1],
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        activation_function=activation,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=0.2,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        share_encoder_decoder_embeddings=not separate_vocabs,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**config))
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() == 2 and "embed" not in name and "shared" not in name:
                weight.normal_(0.0, gain / weight.size(1) ** 0.5)
        bias = torch.randn(1, size) * 0.5
        bias[0, 0] += eos_bias
        model.final_logits_bias.copy_(bias)
    if train_steps:
        _train(model, MarianTokenizer.from_pretrained(out), train_steps, seed)
    with torch.no_grad():  # as the converter adds it: a <pad> row of zeros, without bias
        for embedding in {model.model.encoder.embed_tokens, model.model.decoder.embed_tokens}:
            embedding.weight[pad] = 0.0
        model.final_logits_bias[0, pad] = 0.0
    model.eval()
    # what transformers 4 wrote: every tensor, tied and position tables included
    if weights == "bin":
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    else:
        model.save_pretrained(out)
        (out / "generation_config.json").unlink(missing_ok=True)
    # config.json and generation_config.json with the keys OPUS-MT's have (written by transformers
    # 4).
    legacy = dict(
        architectures=["MarianMTModel"],
        model_type="marian",
        add_bias_logits=False,
        add_final_layer_norm=False,
        normalize_before=False,
        normalize_embedding=False,
        static_position_embeddings=True,
        is_encoder_decoder=True,
        bad_words_ids=[[pad]],
        num_beams=num_beams,
        max_length=max_length,
        classif_dropout=0.0,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        transformers_version="4.22.0.dev0",
        _name_or_path=f"opus-mt-test-{d_model}",
    )
    (out / "config.json").write_text(json.dumps({**config, **legacy, **config_changes}, indent=2))
    generation = dict(
        bad_words_ids=[[pad]],
        bos_token_id=0,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=max_length,
        num_beams=num_beams,
        pad_token_id=pad,
        transformers_version="4.32.0.dev0",
    )
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out
