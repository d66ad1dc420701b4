"""``nmt import``: a Hugging Face Marian directory (an OPUS-MT model as downloaded, or one ``nmt
export`` wrote) read as an nmt checkpoint.

The weights go through :func:`nmt.interop.marian.from_marian`, the one weight map read backwards.
This module reads what surrounds them: ``config.json`` key by key (:func:`model_config`, with
transformers' default where the file is silent), the tokenizer files (:func:`read_tokenizer`), and
the generation settings that make ``nmt translate`` search as ``generate()`` does
(:func:`decode_config`). Every value that is cast is type-checked by one reader (:func:`_typed`),
naming the file and key.
"""

# Size: module at most 770 lines, read_tokenizer() at most 75, model_config() at most 125,
# import_huggingface() at most 75: Marian's config, tokenizer and generation files checked key by
# key, each key with transformers' default and the reason a value is refused; split further, the
# checks of one file would be apart from its reading.

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.config import (
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TokenizerConfig,
    config_to_dict,
    validate,
)
from nmt.data.tokenizer import BOS, PAD, TAG, UNK, TokenizerError
from nmt.data.vocab import MarianTokenizer
from nmt.errors import Key, first_line
from nmt.fields import LANGUAGE

from .marian import MarianError, Rows, from_marian

log = logging.getLogger("nmt.importing")

#: What ``MarianConfig`` assumes for a key its ``config.json`` does not write (transformers 5).
MARIAN_DEFAULTS = {
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "scale_embedding": False,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "max_position_embeddings": 1024,
}
# transformers' name → nmt's (the same functions)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _json(path: Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise MarianError(
                f"{path.parent}: no {path.name}; a Hugging Face Marian directory has config.json, "
                "vocab.json, source.spm, target.spm "
                "and model.safetensors or pytorch_model.bin"
            )
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MarianError(f"{path}: not JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(value, dict):
        raise MarianError(f"{path}: a JSON {type(value).__name__}, not an object")
    return value


def resolve_directory(path: str | Path) -> Path:
    """``path`` itself, or, for a Hugging Face cache entry (``models--ORG--NAME``), the snapshot
    ``refs/main`` names.

    Raises:
        MarianError: ``path`` is not a directory.
    """
    path = Path(path)
    if not path.is_dir():
        raise MarianError(
            f"{path} is not a directory"
            + (" (give the directory that holds config.json)" if path.is_file() else "")
        )
    ref = path / "refs" / "main"
    if (
        not (path / "config.json").is_file()
        and ref.is_file()
        and (path / "snapshots" / ref.read_text().strip()).is_dir()
    ):
        return path / "snapshots" / ref.read_text().strip()
    return path


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict of ``directory`` (``model.safetensors``, ``pytorch_model.bin``, or their
    sharded forms), and the file it came from.

    Raises:
        MarianError: no weights file, one that cannot be read, or no ``safetensors`` package for a
            ``.safetensors`` file.
    """
    found = next((name for name in WEIGHT_FILES if (directory / name).is_file()), None)
    if found is None:
        raise MarianError(f"{directory}: no weights ({' or '.join(WEIGHT_FILES[::2])})")
    files = [found]
    if found.endswith(".index.json"):
        weight_map = _json(directory / found).get("weight_map")
        if not isinstance(weight_map, dict):
            raise MarianError(f"{directory / found}: no weight_map")
        files = sorted(set(map(str, weight_map.values())))
    state: dict[str, torch.Tensor] = {}
    for name in files:
        file = directory / name
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                part = load_file(str(file))
            else:
                part = torch.load(file, map_location="cpu", weights_only=True)
        except ImportError:
            raise MarianError(
                f"{file}: reading .safetensors files needs the safetensors package: pip install "
                "safetensors"
            ) from None
        # safetensors, torch and zipfile raise several types for damaged files
        except Exception as exc:
            raise MarianError(f"{file}: cannot read the weights ({first_line(exc)})") from None
        if not isinstance(part, dict) or not all(
            isinstance(v, torch.Tensor) for v in part.values()
        ):
            raise MarianError(f"{file}: not a state dict of tensors")
        state.update(part)
    if (
        state
        and not any(k.startswith("model.") for k in state)
        and any(k.startswith(("encoder.", "decoder.", "shared.")) for k in state)
    ):
        # saved from MarianModel
        state = {
            k if k in ("final_logits_bias", "lm_head.weight") else f"model.{k}": v
            for k, v in state.items()
        }
    return state, found


def _special_tokens(tok_config: dict, special_map: dict) -> dict[str, Any]:
    """The special tokens' spellings (``MarianTokenizer``'s defaults where neither file names them)
    and the added tokens."""

    def text(value):
        return value.get("content") if isinstance(value, dict) else value

    names = {}
    for key, default in (("eos", "</s>"), ("unk", "<unk>"), ("pad", "<pad>")):
        names[key] = (
            text(tok_config.get(f"{key}_token")) or text(special_map.get(f"{key}_token")) or default
        )
    extra = [
        text(t)
        for t in [
            *(tok_config.get("additional_special_tokens") or []),
            *(special_map.get("additional_special_tokens") or []),
        ]
    ]
    added = tok_config.get("added_tokens_decoder") or {}
    for entry in added.values():
        if isinstance(entry, dict):
            for flag in ("lstrip", "rstrip", "single_word"):
                if entry.get(flag):
                    raise MarianError(
                        "tokenizer_config.json: ",
                        Key(f"added_tokens_decoder {entry.get('content')!r} {flag}"),
                        " is true; nmt cuts text as MarianTokenizer does with plain special tokens "
                        "only",
                    )
            extra.append(entry.get("content"))
    names["special"] = sorted({t for t in [*names.values(), *extra] if isinstance(t, str) and t})
    return names


def read_tokenizer(directory: Path, config: dict[str, Any] | None = None) -> MarianTokenizer:
    """The tokenizer of a Marian directory (``source.spm``, ``target.spm``, ``vocab.json``,
    ``target_vocab.json``, ``tokenizer_config.json``), decoding from the piece ``config``
    (config.json) names as ``decoder_start_token_id`` (its ``<pad>`` when there is none).

    Raises:
        MarianError: a file is missing or unusable, or ``decoder_start_token_id`` is no piece's id.
    """
    tok_config = _json(directory / "tokenizer_config.json", required=False)
    special_map = _json(directory / "special_tokens_map.json", required=False)
    spec: dict[str, Any] = {
        "vocab": _json(directory / "vocab.json"),
        "target_vocab": None,
        **_special_tokens(tok_config, special_map),
        "split_special_tokens": bool(tok_config.get("split_special_tokens", False)),
        "source_lang": tok_config.get("source_lang"),
        "target_lang": tok_config.get("target_lang"),
    }
    if tok_config.get("separate_vocabs"):
        spec["target_vocab"] = _json(directory / "target_vocab.json")
    for name, vocab in (("vocab.json", spec["vocab"]), ("target_vocab.json", spec["target_vocab"])):
        bad = (
            next(((k, v) for k, v in vocab.items() if type(v) is not int), None)
            if isinstance(vocab, dict)
            else None
        )
        if bad is not None or (vocab is not None and not isinstance(vocab, dict)):
            what = f"the piece {bad[0]!r} has the id {bad[1]!r}" if bad else "it is not an object"
            raise MarianError(
                f"{directory / name}: not a mapping of pieces to integer ids ({what}); it is "
                "Marian's vocabulary, as its converter writes it"
            )
    protos = []
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise MarianError(
                f"{directory}: no {name} (the SentencePiece model MarianTokenizer segments with)"
            )
        protos.append((directory / name).read_bytes())
    start = _typed(
        config or {}, "decoder_start_token_id", int, None, str(directory / "config.json")
    )
    if start is not None:
        pieces = {i: p for p, i in (spec["target_vocab"] or spec["vocab"]).items()}
        if start not in pieces or pieces[start] in (spec["eos"], spec["unk"]):
            what = (
                f"{pieces[start]!r}, which cannot start decoding"
                if start in pieces
                else "no piece's id in the vocabulary"
            )
            raise MarianError(
                Key("decoder_start_token_id"),
                f" {start} is {what} (Marian starts from <pad>)",
                path=directory / "config.json",
            )
        spec["start"] = None if pieces[start] == spec["pad"] else pieces[start]
    special = [t for t in spec["special"] if t not in spec["vocab"]]
    if special:
        raise MarianError(
            f"{directory}: the special token(s) {', '.join(special)} are not in vocab.json; their "
            "ids would lie outside the model's vocabulary"
        )
    try:
        tokenizer = MarianTokenizer.build(*protos, spec, str(directory))
    except TokenizerError as exc:
        raise MarianError(str(exc)) from None
    for side, name in ((tokenizer.src, "source.spm"), (tokenizer.tgt, "target.spm")):
        sp, known = side.sp, side.layout.ids
        pieces = [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))
        ]
        missing = sum(p not in known for p in pieces)
        # OPUS-MT's vocab.json holds (nearly) every piece of both models
        if missing > len(pieces) / 2:
            raise MarianError(
                f"{directory}: {missing:,} of the {len(pieces):,} pieces of {name} are not in "
                "vocab.json, so most text would be <unk>: "
                "the two were not made for one model; take both from the same model directory"
            )
    return tokenizer


@dataclass
class Imported:
    """A Marian directory read and checked: nmt's config and weights, the tokenizer, and what ``nmt
    info`` says of its origin."""

    cfg: Config
    state: dict[str, torch.Tensor]
    tokenizer: MarianTokenizer
    origin: dict[str, Any]


def _refuse(file: str, key: str, text: str) -> MarianError:
    return MarianError(Key(key), f" {text}", path=file)


def _typed(settings: dict[str, Any], key: str, kind: type, default: Any, file: str) -> Any:
    """``settings[key]`` (``default`` when absent or null) as ``kind``: ``int`` takes a JSON
    integer, ``float`` any JSON number, ``list`` an array, ``str`` a string (the JSON types
    transformers writes for them).

    Raises:
        MarianError: the value is of another JSON type, naming ``file`` and ``key``.
    """
    value = settings.get(key)
    if value is None:
        return default
    fits = (
        type(value) is int
        if kind is int
        else (type(value) in (int, float) if kind is float else isinstance(value, kind))
    )
    if not fits:
        what = {int: "an integer", float: "a number", list: "a list", str: "a string"}[kind]
        raise _refuse(file, key, f"is {json.dumps(value)}, not {what}")
    return float(value) if kind is float else value


def model_config(
    config: dict[str, Any], tokenizer: MarianTokenizer, file: str = "config.json"
) -> ModelConfig:
    """Nmt's model section for ``config.json``'s values (transformers' defaults where it is silent).

    Raises:
        MarianError: one line naming the first key whose value nmt cannot represent.
    """

    def get(key):
        return config.get(key, MARIAN_DEFAULTS.get(key))

    if config.get("model_type", "marian") != "marian":
        raise _refuse(
            file,
            "model_type",
            f"is {config['model_type']!r}; nmt imports Marian models (MarianMTModel, model_type "
            "marian) only",
        )
    refused = {
        "normalize_before": (
            True,
            "is true: a Pre-LN model (transformers' MarianMTModel ignores the key and runs it "
            "Post-LN); nmt imports Post-LN ones",
        ),
        "normalize_embedding": (
            True,
            "is true: a LayerNorm on the embeddings, which nmt's model does not have",
        ),
        "add_final_layer_norm": (
            True,
            "is true: a final LayerNorm per stack, which nmt's Post-LN model does not have",
        ),
        "static_position_embeddings": (
            False,
            "is false: learned positions; nmt computes sinusoidal ones",
        ),
        "scale_embedding": (
            False,
            "is false (transformers' default when absent): embeddings not scaled by sqrt(d_model), "
            "as nmt's always are",
        ),
        "tie_word_embeddings": (
            False,
            "is false: an output projection of its own; nmt ties it to the target embedding",
        ),
        "is_encoder_decoder": (False, "is false: not an encoder-decoder"),
    }
    for key, (bad, why) in refused.items():
        if get(key) is bad:
            raise _refuse(file, key, why)
    activation = ACTIVATIONS.get(
        _typed(config, "activation_function", str, MARIAN_DEFAULTS.get("activation_function"), file)
    )
    if activation is None:
        raise _refuse(
            file,
            "activation_function",
            f"is {get('activation_function')!r}; nmt has relu, gelu and swish (silu)",
        )
    for ours, theirs in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if get(ours) != get(theirs):
            raise _refuse(
                file,
                theirs,
                f"{get(theirs)} differs from {ours} {get(ours)}; nmt has one value for both stacks",
            )
    src, tgt = tokenizer.src.layout, tokenizer.tgt.layout
    spec = tokenizer.spec
    vocab, target_vocab = spec["vocab"], spec["target_vocab"] or spec["vocab"]
    sizes = {
        "vocab_size": (get("vocab_size"), len(vocab), "vocab.json"),
        "decoder_vocab_size": (
            config.get("decoder_vocab_size") or get("vocab_size"),
            len(target_vocab),
            "target_vocab.json"
            if not tokenizer.joint
            else "vocab.json (one vocabulary for both sides)",
        ),
    }
    for key, (value, size, where) in sizes.items():
        if value != size:
            raise _refuse(file, key, f"is {value}; {where} has {size} pieces")
    for key, piece in (("pad_token_id", spec["pad"]), ("eos_token_id", spec["eos"])):
        if config.get(key) != vocab[piece]:
            raise _refuse(
                file,
                key,
                f"is {config.get(key)}, not {vocab[piece]} (the id vocab.json gives {piece!r})",
            )
    shared = bool(get("share_encoder_decoder_embeddings"))
    if shared and not tokenizer.joint:
        raise _refuse(
            file,
            "share_encoder_decoder_embeddings",
            "is true, but the sides have their own vocabularies (target_vocab.json)",
        )
    values = dict(
        d_model=get("d_model"),
        d_ff=get("encoder_ffn_dim"),
        n_heads=get("encoder_attention_heads"),
        n_encoder_layers=get("encoder_layers"),
        n_decoder_layers=get("decoder_layers"),
        dropout=_typed(config, "dropout", float, MARIAN_DEFAULTS.get("dropout"), file),
        attention_dropout=_typed(
            config, "attention_dropout", float, MARIAN_DEFAULTS.get("attention_dropout"), file
        ),
        activation_dropout=_typed(
            config, "activation_dropout", float, MARIAN_DEFAULTS.get("activation_dropout"), file
        ),
        activation=activation,
        norm_position="post",
        share_embeddings=shared,
        output_bias=True,
        src_vocab_size=len(src.pieces),
        tgt_vocab_size=len(tgt.pieces),
    )
    for key in (
        "d_model",
        "encoder_ffn_dim",
        "encoder_attention_heads",
        "encoder_layers",
        "decoder_layers",
    ):
        if type(get(key)) is not int or get(key) < 1:
            raise _refuse(file, key, f"is {get(key)!r}, not a positive integer")
    return ModelConfig(**values)


#: generate() settings nmt's search does not have: (key, the value that changes nothing, what nmt
#: does instead).
NOT_APPLIED = (
    (
        "early_stopping",
        True,
        "generate() stops a sentence by its own heuristic (the best running hypothesis scored at "
        "its current length); nmt searches until none running can change the result (exact, as "
        "early_stopping 'never')",
    ),
    (
        "renormalize_logits",
        False,
        "nmt does not renormalise the log-probabilities after banning <pad>",
    ),
    ("repetition_penalty", 1.0, ""),
    ("no_repeat_ngram_size", 0, ""),
    ("encoder_no_repeat_ngram_size", 0, ""),
    ("do_sample", False, ""),
    ("num_beam_groups", 1, ""),
    ("diversity_penalty", 0.0, ""),
    ("forced_bos_token_id", None, ""),
    ("begin_suppress_tokens", None, ""),
    ("exponential_decay_length_penalty", None, ""),
    ("num_return_sequences", 1, ""),
)


def not_applied(get, beam: int) -> list[str]:
    """The generation settings of :data:`NOT_APPLIED` that ``get`` (the settings' ``dict.get``)
    gives a value nmt does not apply, in words (a search of ``beam`` hypotheses)."""
    notes = []
    for key, neutral, why in NOT_APPLIED:
        # generate()'s default early_stopping is false; true and "never" are applied
        value = get(key, False) if key == "early_stopping" else get(key, neutral)
        if key == "early_stopping" and (beam == 1 or value == "never"):
            continue
        if value != neutral:
            notes.append(f"{key}={value!r}" + (f": {why}" if why else " is not applied"))
    return notes


def decode_config(
    generation: dict[str, Any],
    tokenizer: MarianTokenizer,
    file: str = "generation_config.json",
    max_positions: int = MARIAN_DEFAULTS["max_position_embeddings"],
) -> tuple[DecodeConfig, list[str]]:
    """The decode defaults that make ``nmt translate`` search as ``generate()`` does with
    ``generation`` (generation_config.json, or config.json's generation keys in older directories),
    and the settings it cannot apply, in words.

    ``num_beams`` → ``beam_size``; ``length_penalty`` α with ``length`` normalisation (``log P /
    |Y|^α``, |Y| counting EOS, as generate() divides); ``max_length`` L (absolute, counting the
    decoder's start token) → at most L - 2 pieces and EOS (``max_len_a`` 0, ``max_len_b`` L - 2),
    ``max_new_tokens`` N → N - 1 pieces, neither → nmt's own rule (``max_len_a`` and ``max_len_b``
    as :class:`~nmt.config.DecodeConfig` has them, not generate()'s 20 counting the start token);
    ``max_positions`` (config.json's ``max_position_embeddings``) P → ``max_input_pieces`` at most
    P - 1, so that a source line and its EOS fit the positions the model has;
    ``min_length`` M → M - 1 pieces;
    ``<unk>`` may be generated unless ``bad_words_ids`` bans it (generate() bans only what it lists;
    nmt always bans ``<pad>``, its BOS); ``early_stopping`` true → ``patience`` 1 (a sentence ends
    once ``num_beams`` hypotheses have), ``"never"`` → the exact rule.
    """
    get = generation.get

    def typed(key: str, kind: type, default: Any) -> Any:
        return _typed(generation, key, kind, default, file)

    tgt = tokenizer.tgt.layout
    bad_words, suppressed = (
        typed("bad_words_ids", list, []),
        [[i] for i in typed("suppress_tokens", list, [])],
    )
    bans = [*bad_words, *suppressed]
    banned = {
        ids[0] for ids in bans if isinstance(ids, list) and len(ids) == 1 and type(ids[0]) is int
    }
    limit = (
        (typed("max_new_tokens", int, 0) - 1)
        if get("max_new_tokens")
        else (typed("max_length", int, 0) - 2 if get("max_length") else None)
    )
    floor = (
        (typed("min_new_tokens", int, 0) - 1)
        if get("min_new_tokens")
        else (typed("min_length", int, 0) or 0) - 1
    )
    beam = typed("num_beams", int, 0) or 1
    decode = DecodeConfig(
        beam_size=beam,
        length_penalty=typed("length_penalty", float, 1.0),
        length_normalization="length",
        # without a limit of generate()'s, nmt's: 18 pieces would cut most translations
        **({} if limit is None else {"max_len_a": 0.0, "max_len_b": max(limit, 1)}),
        max_input_pieces=min(DecodeConfig.max_input_pieces, max(max_positions - 1, 1)),
        min_len=max(floor, 0),
        n_best=1,
        # generate()'s early_stopping true is fairseq's rule, nmt's patience 1; "never" is exact
        patience=1.0 if beam > 1 and get("early_stopping", False) is True else None,
        allow_unk=tgt.marian_ids[UNK] not in banned,
    )
    if limit is None:
        log.warning(
            "warning: %s: no max_length or max_new_tokens: translations are limited by nmt's "
            "rule, %g x source pieces + %d (generate() would stop at 18 pieces); "
            "--max-len-a and --max-len-b change it",
            file,
            decode.max_len_a,
            decode.max_len_b,
        )
    notes = not_applied(get, beam)
    return decode, notes + bans_not_applied(
        tgt, {"bad_words_ids": bad_words, "suppress_tokens": suppressed}
    )


def bans_not_applied(tgt, listed: dict[str, list]) -> list[str]:
    """The bans of ``listed`` (``bad_words_ids``, ``suppress_tokens``: lists of token id lists)
    that nmt does not apply, in words, one per key: nmt bans its padding and start pieces, the
    target-language tags (>>fr<<) of ``tgt`` (a target segmenter's layout) and ``<unk>`` unless
    ``decode.allow_unk``, nothing else."""
    tag_ids = [tgt.marian_ids[i] for i, piece in enumerate(tgt.pieces) if TAG.fullmatch(piece)]
    always = {tgt.marian_ids[PAD], tgt.marian_ids[BOS], tgt.marian_ids[UNK], *tag_ids}
    notes = []
    for key, bans in listed.items():
        other = [
            ids
            for ids in bans
            if not (isinstance(ids, list) and len(ids) == 1 and ids[0] in always)
        ]
        if other:
            notes.append(
                f"{key} {other} is not applied (nmt bans its padding and start pieces, language "
                "tags and, unless decode.allow_unk, <unk>)"
            )
    return notes


GENERATION_KEYS = (
    "num_beams",
    "max_length",
    "max_new_tokens",
    "min_length",
    "min_new_tokens",
    "length_penalty",
    "bad_words_ids",
    "suppress_tokens",
    "early_stopping",
    "renormalize_logits",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "do_sample",
    "num_return_sequences",
)


def tokenizer_config(tokenizer: MarianTokenizer) -> TokenizerConfig:
    """The tokenizer section an imported model's config shows (``nmt info``): its segmenters'
    SentencePiece type (read with protobuf, which SentencePiece's model description needs;
    OPUS-MT's, unigram, without it) and vocabulary size."""
    kind = "unigram"
    try:
        from sentencepiece import sentencepiece_model_pb2 as model_pb2

        proto = model_pb2.ModelProto()
        proto.ParseFromString(tokenizer.src.serialized_model_proto())
        # word and char models segment as well; the type is only shown
        kind = {2: "bpe"}.get(proto.trainer_spec.model_type, "unigram")
    except ImportError:
        pass
    return TokenizerConfig(
        type=kind, vocab_size=tokenizer.src.get_piece_size(), joint=tokenizer.joint
    )


def import_huggingface(
    path: str | Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> Imported:
    """Read a Hugging Face Marian directory (an OPUS-MT model as downloaded, or one ``nmt export``
    wrote) as an nmt model.

    The languages come from ``tokenizer_config.json`` (``source_lang``, ``target_lang``), else from
    a directory named ``opus-mt-SRC-TGT``, unless given; ``und`` (ISO 639: undetermined) where none
    says. A vocabulary with two or more target-language tags (``>>de<<``, ``>>fr<<``) and no target
    language among them (``mul``, ``ROMANCE`` or none) makes a model of one direction per tag
    (``data.directions``), the target chosen with ``--tgt-lang``, unless ``tgt_lang`` is given or
    the vocabularies are separate.

    Raises:
        MarianError: a file is missing or unreadable, or a setting nmt cannot represent (one line
            naming the file and key).
    """
    directory = resolve_directory(path)
    config = _json(directory / "config.json")
    generation = _json(directory / "generation_config.json", required=False) or {
        k: config[k] for k in GENERATION_KEYS if k in config
    }
    tokenizer = read_tokenizer(directory, config)
    model = model_config(config, tokenizer, str(directory / "config.json"))
    settings_file = directory / (
        "generation_config.json"
        if (directory / "generation_config.json").is_file()
        else "config.json"
    )
    positions = _typed(config, "max_position_embeddings", int, 0, str(directory / "config.json"))
    positions = positions or int(MARIAN_DEFAULTS["max_position_embeddings"])
    decode, notes = decode_config(generation, tokenizer, str(settings_file), positions)
    for note in notes:
        log.warning("warning: %s: %s", settings_file, note)
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if config.get(key):
            log.warning(
                "warning: %s: %s=%s is not applied when fine-tuning (nmt has no layer dropout)",
                directory / "config.json",
                key,
                config[key],
            )
    # opus-mt-en-de, opus-mt-tc-big-en-de
    named = (
        directory.name.split("-")[-2:] if directory.name.startswith("opus-mt-") else [None, None]
    )
    # a hub cache entry: models--Helsinki-NLP--opus-mt-en-de/snapshots/HASH
    if "snapshots" in directory.parts:
        entry = directory.parent.parent.name.split("--")[-1]
        named = entry.split("-")[-2:] if entry.startswith("opus-mt-") else named
    found = [
        tokenizer.spec.get("source_lang") or named[0],
        tokenizer.spec.get("target_lang") or named[1],
    ]
    # a code nmt can name files by
    found = [
        guess if isinstance(guess, str) and re.fullmatch(LANGUAGE[0], guess) else None
        for guess in found
    ]
    langs = [str(given or guess or "und") for given, guess in zip((src_lang, tgt_lang), found)]
    # Target-language tags in the vocabulary (>>fr<<, as nmt's multilingual export and OPUS-MT's
    # multi-target models have them): one direction per tag, chosen with --tgt-lang, unless a target
    # language is given. A named target that is one of the tags (an OPUS-MT en-de whose vocabulary
    # also lists >>fr<<) keeps the one pair.
    targets = [
        piece[2:-2]
        for piece in tokenizer.src.layout.pieces
        if TAG.fullmatch(piece) and piece[2:-2] != langs[0]
    ]
    if len(targets) > 1 and tgt_lang is None and tokenizer.joint and found[1] not in targets:
        data = DataConfig(directions=tuple(f"{langs[0]}-{t}" for t in targets))
    else:
        data = DataConfig(src_lang=langs[0], tgt_lang=langs[1])
    cfg = Config(model=model, data=data, tokenizer=tokenizer_config(tokenizer), decode=decode)
    validate(cfg)
    state_dict, weights = read_weights(directory)
    state = from_marian(state_dict, model, Rows.of(tokenizer), directory / weights)
    origin = {
        "format": "huggingface",
        "path": str(directory.absolute()),
        "weights": weights,
        "model_type": "marian",
        "vocab_size": len(tokenizer.spec["vocab"]),
        "name_or_path": str(config.get("_name_or_path") or directory.name),
        "transformers_version": config.get("transformers_version"),
        "max_position_embeddings": positions,
        "not_applied": notes,
    }
    return Imported(cfg, state, tokenizer, origin)


def import_checkpoint(
    path: str | Path,
    out: str | Path,
    format: str = "huggingface",
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> dict:
    """Write the model of the ``format`` directory ``path`` as an nmt checkpoint at ``out`` (no
    training state:
    ``nmt train --init-from`` fine-tunes it; translate, evaluate, serve, average and export read
    it).

    Returns:
        The payload written (``imported_from`` says where it came from).

    Raises:
        MarianError: an unknown ``format``, or see :func:`import_huggingface`.
        nmt.files.OutputError: ``out`` cannot be written (checked before anything is read).
    """
    from nmt.files import check_not_an_input, check_writable
    from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors

    if format != "huggingface":
        raise MarianError(
            Key("format"),
            f" {format!r} is not supported; use huggingface (a MarianMTModel directory, such as an "
            "OPUS-MT model)",
        )
    check_writable(Path(out), Key("out"))
    if Path(path).is_dir():  # --out inside the directory it reads would replace one of its files
        check_not_an_input(
            Path(out), [("DIR", f) for f in Path(path).rglob("*") if f.is_file()], "--out"
        )
    imported = import_huggingface(path, src_lang, tgt_lang)
    payload = {
        "model": imported.state,
        "config": config_to_dict(imported.cfg),
        "tokenizer": tokenizer_to_tensors(imported.tokenizer.protos()),
        "imported_from": imported.origin,
    }
    save_checkpoint(payload, Path(out))
    return payload
