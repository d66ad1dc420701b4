"""Configuration: frozen dataclasses, YAML loading and typed ``--set`` overrides.

A run is described by one :class:`Config` with six sections (``model``, ``data``,
``tokenizer``, ``train``, ``decode``, ``eval``). Every field has a default that follows
Vaswani et al. 2017 where the paper fixes it; anything else (Pre-LN, GELU, the
inverse-sqrt schedule) must be asked for by name. Each field carries its own rules, its
type (choices as ``Literal``), range and help (:mod:`nmt.fields`), checked whenever its
section is built; :func:`validate` holds the rules that relate fields. Values are read by
their key's type, the same way from a YAML file and from ``--set`` (see :mod:`nmt.fields`:
``tgt_lang: no`` is Norwegian, ``010`` is ten). Unknown keys are an error, never silently
ignored, so a misspelt option cannot go unnoticed; so is a key or section written twice.

The resolved config is stored inside every checkpoint, so a checkpoint alone rebuilds
its model.
"""

# Size: module at most 890 lines, validate() at most 110: every section's fields, with their ranges
# and help, are declared here, as the one place they are; validate() states each rule that relates
# two fields once.

from __future__ import annotations

import dataclasses
import math
import os
import struct
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from .errors import Key
from .fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    LANGUAGE,
    NULL,
    POSITIVE,
    PROBABILITY,
    Checked,
    ConfigError,
    PathText,
    Plain,
    Range,
    as_written,
    did_you_mean,
    hints,
    kind,
    looks_like_test_data,
    read,
    read_override,
    read_yaml,
    setting,
    written,
)
from .files import is_stream

# Upper ends for numbers that size memory or OS resources, so that a typo is an error, not a crash:
BEAM = Range(
    1,
    1024,
    # hypotheses per sentence: a wider beam costs memory in proportion and only loses BLEU (Koehn &
    # Knowles 2017, §3.6)
)
THREADS = Range(0, 1024)  # torch.set_num_threads(100_000) crashes the process
SEED = Range(0, 2**32 - 1)  # NumPy's seed range
# α: |Y| ** α stays a finite float64 for every output length (at most 100 · src_len + 10,000)
LENGTH_PENALTY = Range(-10, 10)
PATIENCE = Range(0, 100)

PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3.
    "base": dict(
        d_model=512, d_ff=2048, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, dropout=0.1
    ),
    "big": dict(
        d_model=1024, d_ff=4096, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, dropout=0.3
    ),
    # Sized for Multi30k (29k pairs) on a few CPU cores.
    "small": dict(
        d_model=256, d_ff=1024, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, dropout=0.1
    ),
    # For tests and the shipped toy corpus.
    "tiny": dict(
        d_model=64, d_ff=256, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1
    ),
}
Preset = Literal[tuple(PRESETS)]
#: sacreBLEU's BLEU tokenizers (``sacrebleu.metrics.BLEU.TOKENIZERS``; tests/test_evaluate.py checks
#: that sacreBLEU has each), named here so that reading a config does not load sacreBLEU.
BLEU_TOKENIZERS = (
    "none",
    "zh",
    "13a",
    "intl",
    "char",
    "ja-mecab",
    "ko-mecab",
    "spm",
    "flores101",
    "flores200",
    "spBLEU-1K",
)
BleuTokenizer = Literal[("auto", *BLEU_TOKENIZERS)]


@dataclass(frozen=True)
class ModelConfig(Checked):
    """Transformer encoder-decoder hyper-parameters (Vaswani et al. 2017, §3 and Table 3).

    ``norm_position`` ``"post"`` is the paper's ``LayerNorm(x + Dropout(Sublayer(x)))``,
    ``"pre"`` is ``x + Dropout(Sublayer(LayerNorm(x)))``. ``dropout`` is the paper's P_drop;
    ``attention_dropout`` and ``activation_dropout`` are tensor2tensor's additions. ``activation:
    swish`` and ``output_bias`` are what Marian models (OPUS-MT) need (:mod:`nmt.interop.marian`).
    """

    section = "model"

    preset: Preset | None = setting(
        None, "fills the size keys and dropout from PRESETS before the keys written apply"
    )
    d_model: int = setting(
        512, "width of the embeddings and of every layer's input and output", AT_LEAST_1
    )
    d_ff: int = setting(2048, "width of the feed-forward layers' inner activation", AT_LEAST_1)
    n_heads: int = setting(
        8, "attention heads per layer; d_model must be a multiple of it", AT_LEAST_1
    )
    n_encoder_layers: int = setting(6, "encoder layers", AT_LEAST_1)
    n_decoder_layers: int = setting(6, "decoder layers", AT_LEAST_1)
    dropout: float = setting(
        0.1, "on the embedding sum and every residual branch (the paper's P_drop)", PROBABILITY
    )
    attention_dropout: float = setting(
        0.0, "on attention probabilities (off: the faster attention kernel)", PROBABILITY
    )
    activation_dropout: float = setting(0.0, "on the feed-forward activation", PROBABILITY)
    activation: Literal["relu", "gelu", "swish"] = setting(
        "relu", "feed-forward activation: relu (the paper), gelu, or swish (SiLU, Marian's default)"
    )
    norm_position: Literal["post", "pre"] = setting(
        "post",
        "LayerNorm after each residual sum (post, the paper) or at each branch's input (pre)",
    )
    share_embeddings: bool = setting(
        True, "tie the source embedding to the target's; in a Config, defaults to tokenizer.joint"
    )
    output_bias: bool = setting(
        False,
        "a fixed bias on the logits (Marian's final_logits_bias, kept as it was imported; never "
        "trained)",
    )
    src_vocab_size: int = setting(0, "source pieces; filled in from the tokenizer", AT_LEAST_0)
    tgt_vocab_size: int = setting(0, "target pieces; filled in from the tokenizer", AT_LEAST_0)


@dataclass(frozen=True)
class DataConfig(Checked):
    """Where the parallel text comes from and how it is cleaned.

    Exactly one source kind is used, in this order of precedence:

    * explicit files: ``train_src``/``train_tgt`` (and ``valid_src``/``valid_tgt``);
    * ``hf_dataset``: a Hugging Face dataset name (``hf_config``) or a loader such as
      ``"json"``/``"parquet"`` with ``hf_data_files`` (``{split: path}``), read through
      ``datasets.load_dataset``; rows hold a ``translation`` dict keyed by language;
    * ``dir``: a directory of ``{split}.{lang}`` or ``{split}.{lang}.gz`` files.

    ``max_len`` and ``max_len_ratio`` filter training pairs only; validation and test text
    is never dropped.

    ``directions`` trains one model for several language pairs (``[en-de, en-fr, de-en]``)
    in place of ``src_lang``/``tgt_lang``, each read from ``data.dir`` (its own files
    ``{split}.{src}-{tgt}.{lang}``, else the shared ``{split}.{lang}``) or from ``hf_dataset``;
    with more than one target language each source starts with its target's tag, ``>>de<<``
    (Johnson et al. 2017; see :mod:`nmt.data.multilingual`).
    """

    section = "data"

    src_lang: str = setting("en", "source language code", pattern=LANGUAGE)
    tgt_lang: str = setting(
        "de",
        "target language code (also picks the BLEU tokenizer when eval.tokenize is auto)",
        pattern=LANGUAGE,
    )
    dir: PathText | None = setting(None, "a directory of {split}.{lang} or {split}.{lang}.gz files")
    train_split: str = setting("train", "the training split's name in data.dir or data.hf_dataset")
    valid_split: str = setting(
        "valid", "the validation split's name in data.dir or data.hf_dataset"
    )
    train_src: PathText | None = setting(None, "training source file (with data.train_tgt)")
    train_tgt: PathText | None = setting(None, "training target file (with data.train_src)")
    valid_src: PathText | None = setting(None, "validation source file (with data.valid_tgt)")
    valid_tgt: PathText | None = setting(None, "validation target file (with data.valid_src)")
    hf_dataset: str | None = setting(
        None, "a Hugging Face dataset name, or a loader such as json or parquet"
    )
    hf_config: str | None = setting(None, "the Hugging Face dataset's configuration name")
    hf_data_files: dict[str, PathText] | None = setting(
        None, "files for a loader, by split: {train: a.jsonl, validation: b.jsonl}"
    )
    max_len: int = setting(128, "longest training pair kept, in pieces without BOS/EOS", AT_LEAST_1)
    max_len_ratio: float = setting(3.0, "largest length ratio of a training pair kept", Range(1))
    valid_max_sentences: int | None = setting(
        None, "validation sentences decoded for BLEU (null: all)", AT_LEAST_1
    )
    allow_test_names: bool = setting(
        False,
        "validate on a split or files whose name says test (a validation set named like one, e.g. "
        "newstest2013)",
    )
    workers: int = setting(
        0,
        "SentencePiece threads encoding training text; 0: train.threads, else one a CPU, <= 16",
        AT_LEAST_0,
    )
    cache_dir: PathText | None = setting(
        None, "encoded corpora (null: RUN_DIR/cache); share one across runs to encode once"
    )
    directions: tuple[str, ...] | None = setting(
        None,
        "one model for several language pairs, SRC-TGT each ([en-de, en-fr]); replaces src_lang "
        "and tgt_lang",
        pattern=(
            r"[A-Za-z][A-Za-z0-9_]*-[A-Za-z][A-Za-z0-9_]*",
            "SRC-TGT, two codes of letters, digits and _ (zh_TW, not zh-TW)",
        ),
    )
    sampling_temperature: float = setting(
        1.5,
        "with directions: each is drawn in proportion to (its pairs)^(1/T); 1: as the corpora are, "
        "larger: more even (fairseq's --sampling-temperature)",
        POSITIVE,
    )


@dataclass(frozen=True)
class TokenizerConfig(Checked):
    """SentencePiece settings (Kudo and Richardson 2018).

    ``character_coverage: auto`` picks 0.9995 for text with a large character set (Chinese,
    Japanese, Korean) and 1.0 otherwise, as SentencePiece recommends (see
    :func:`nmt.data.tokenizer.auto_character_coverage`); ``byte_fallback`` spells characters
    outside the vocabulary as UTF-8 byte pieces (256 of the pieces) instead of UNK.
    ``subword_alpha`` > 0 cuts every training pair anew each epoch with a sampled segmentation
    (BPE-dropout, Provilkov et al. 2020; unigram sampling, Kudo 2018), drawn on rank 0 and kept
    in each checkpoint, since SentencePiece's draws differ between processes; validation and
    translation keep the best segmentation (see :mod:`nmt.data.subwords`).
    """

    section = "tokenizer"

    type: Literal["bpe", "unigram"] = setting("bpe", "SentencePiece model type")
    vocab_size: int = setting(8000, "pieces, the four special ones included", Range(5))
    character_coverage: Literal["auto"] | float = setting(
        "auto",
        "share of characters covered, the rest UNK (auto: from the text)",
        Range(0, 1, low_open=True),
    )
    byte_fallback: Literal["auto"] | bool = setting(
        "auto", "byte pieces for characters outside the vocabulary (auto: when coverage < 1)"
    )
    joint: bool = setting(True, "one model for both languages (else one per language)")
    model: PathText | None = setting(None, "a trained joint .model file to reuse")
    src_model: PathText | None = setting(
        None, "a trained source .model file to reuse (tokenizer.joint: false)"
    )
    tgt_model: PathText | None = setting(
        None, "a trained target .model file to reuse (tokenizer.joint: false)"
    )
    subword_alpha: float = setting(
        0.0,
        "subword regularisation of the training pairs, cut anew every epoch: BPE-dropout's "
        "probability (type bpe) or unigram sampling's alpha; 0: off",
        PROBABILITY,
    )
    input_sentence_size: int = setting(
        2_000_000, "sentences sampled (with train.seed) to train the model", AT_LEAST_1
    )
    sampling_temperature: float = setting(
        1.5,
        "with data.directions: each language's share of those sentences is in proportion to (its "
        "sentences)^(1/T), a small language's repeated",
        POSITIVE,
    )


@dataclass(frozen=True)
class TrainConfig(Checked):
    """Optimisation and bookkeeping (Vaswani et al. 2017, §5.3-5.4).

    ``schedule="noam"`` is the paper's ``lr = lr_scale · d_model^-0.5 · min(step^-0.5,
    step · warmup_steps^-1.5)``; ``schedule="inverse_sqrt"`` warms up linearly to the peak
    ``lr`` and decays as ``lr · sqrt(warmup_steps / step)``; ``schedule="linear"`` warms up linearly
    to ``lr`` and decays linearly, reaching 0 just after ``max_steps``; ``schedule="constant"``
    warms up linearly to ``lr`` and stays there (fine-tuning). Intervals are in optimizer steps.
    ``reset_optimizer`` applies to ``nmt train --init-from`` only.
    """

    section = "train"

    run_dir: PathText = setting("runs/default", "checkpoints, tokenizer, logs and cache of the run")
    seed: int = setting(1, "seed of every random choice", SEED)
    device: str = setting(
        "auto",
        "where to train",
        pattern=(r"auto|cpu|cuda(:\d+)?|mps", "auto, cpu, cuda, cuda:N or mps"),
    )
    threads: int = setting(0, "torch intra-op threads on the CPU; 0 keeps torch's default", THREADS)
    max_tokens: int = setting(
        4096, "batch budget per micro-batch and process, in tokens, padding included", AT_LEAST_1
    )
    max_steps: int = setting(100_000, "optimizer steps to train for", AT_LEAST_1)
    max_epochs: int = setting(1000, "epochs to train for at most", AT_LEAST_1)
    max_time_s: float = setting(
        0.0, "seconds of training before stopping; 0 or inf: no limit", Range(0, unbounded=True)
    )
    schedule: Literal["noam", "inverse_sqrt", "constant", "linear"] = setting(
        "noam",
        "learning-rate schedule: noam (the paper), inverse_sqrt, constant after warm-up, or linear "
        "(decays to 0 by the end of max_steps)",
    )
    lr_scale: float = setting(1.0, "factor on the noam schedule", AT_LEAST_0)
    lr: float = setting(5e-4, "peak learning rate of inverse_sqrt, constant and linear", AT_LEAST_0)
    warmup_steps: int = setting(4000, "steps of linear warm-up", AT_LEAST_1)
    reset_optimizer: bool = setting(
        True,
        "with --init-from: Adam starts afresh (true) or keeps the checkpoint's moments when it has "
        "them (false)",
    )
    adam_betas: tuple[float, float] = setting((0.9, 0.98), "Adam's beta1 and beta2", PROBABILITY)
    adam_eps: float = setting(1e-9, "Adam's epsilon", POSITIVE)
    weight_decay: float = setting(0.0, "AdamW's decoupled weight decay", AT_LEAST_0)
    clip_norm: float = setting(0.0, "largest gradient norm; 0: no clipping", AT_LEAST_0)
    nonfinite_loss: Literal["stop", "skip"] = setting(
        "stop",
        "a NaN or infinite gradient: stop the run before that update (saving last.pt), or skip the "
        "update",
    )
    max_skipped_updates: int = setting(
        100,
        "updates skipped in a row (non-finite gradients with nonfinite_loss: skip, fp16 overflow) "
        "after which the run stops",
        AT_LEAST_1,
    )
    label_smoothing: float = setting(
        0.1, "share of probability spread over the other pieces (the paper's ε_ls)", PROBABILITY
    )
    log_every: int = setting(100, "steps between log lines", AT_LEAST_1)
    validate_every: int = setting(1000, "steps between validations", AT_LEAST_1)
    save_every: int = setting(
        0, "steps between extra step_N.pt checkpoints; 0: only last.pt and best.pt", AT_LEAST_0
    )
    keep_last: int = setting(3, "step_N.pt checkpoints kept", AT_LEAST_1)
    valid_beam_size: int = setting(4, "beam size of validation BLEU", BEAM)
    patience: int = setting(
        0, "stop after this many validations without a BLEU gain; 0: never", AT_LEAST_0
    )
    precision: Literal["fp32", "bf16", "fp16"] = setting(
        "fp32", "fp32, bf16 (autocast) or fp16 (autocast and gradient scaling)"
    )
    update_freq: int = setting(1, "micro-batches accumulated per optimizer step", AT_LEAST_1)
    compile: bool = setting(
        False,
        "torch.compile the training forward and backward (dynamic shapes; checked first, and "
        "eager, said once, where compiling fails)",
    )
    compile_loss: bool = setting(
        False,
        "torch.compile the loss's two passes over tokens x vocab (fused: no float32 copies of the "
        "logits; eager, said once, where compiling fails)",
    )
    loss_chunk_tokens: int = setting(
        0,
        "project and score this many target tokens at a time, holding chunk x vocab logits "
        "instead of tokens x vocab, their gradients formed as each chunk is scored; 0: all at once",
        AT_LEAST_0,
    )
    pad_to_multiple: int = setting(
        1,
        "round each batch's lengths up to a multiple of this (8: a GPU's tensor-core tiles, fewer "
        "shapes to compile); 1: no more padding",
        Range(1, 128),
    )
    progress_bar: bool = setting(True, "a progress bar on a terminal")
    tensorboard: bool = setting(
        True, "scalars under run_dir/tensorboard when the tensorboard package is installed"
    )


@dataclass(frozen=True)
class DecodeConfig(Checked):
    """Beam search settings.

    Output length is capped at ``max_len_a · src_len + max_len_b`` pieces per sentence.
    Finished hypotheses are ranked by ``log P(Y|X) / lp(|Y|)``, ``|Y|`` counting EOS, where
    ``length_normalization`` picks ``lp``: ``"gnmt"``, ``((5 + |Y|) / 6) ** length_penalty``
    (Wu et al. 2016, §7); ``"length"``, ``|Y| ** length_penalty`` (fairseq, Hugging Face,
    CTranslate2); ``"none"``, 1. When a sentence's search ends: :mod:`nmt.decode.beams`. UNK is
    never generated (like PAD and BOS) unless ``allow_unk``; EOS is not generated before
    ``min_len`` output pieces (fairseq's ``--min-len``, Hugging Face's ``min_length``).
    """

    section = "decode"

    beam_size: int = setting(5, "hypotheses kept per sentence (1: greedy)", BEAM)
    # fairseq's, Hugging Face's and CTranslate2's; 2.0 makes the exact search prefer long output
    # (docs/quality.md: val BLEU 37.71 at 2.0, 40.16 at 1.0)
    length_penalty: float = setting(
        1.0, "the exponent α of the length normalisation", LENGTH_PENALTY
    )
    length_normalization: Literal["gnmt", "length", "none"] = setting(
        "length", "how finished hypotheses are ranked (see above)"
    )
    max_len_a: float = setting(
        1.5, "output limit per source piece (at most 100: no translation is longer)", Range(0, 100)
    )
    max_len_b: int = setting(10, "output limit added, in pieces (at most 10,000)", Range(0, 10_000))
    # beam search: at most beam_size; sampling: samples
    n_best: int = setting(1, "hypotheses written per sentence", Range(1, 10_000))
    patience: float | None = setting(
        None,
        "also end a sentence once beam_size x patience hypotheses have finished (CTranslate2's "
        "patience; 1: fairseq's rule, faster, not exact); 0 or null: only when no running "
        "hypothesis can still enter the n-best (exact)",
        PATIENCE,
    )
    min_len: int = setting(0, "EOS is forbidden before this many output pieces", AT_LEAST_0)
    max_tokens: int = setting(
        4096, "source-side batch budget in tokens, padding included", AT_LEAST_1
    )
    max_input_pieces: int = setting(
        1024, "a longer source line is not translated (its output line stays empty)", AT_LEAST_1
    )
    allow_unk: bool = setting(False, "let translations contain the unknown piece")
    alignment_layer: int | None = setting(
        None,
        "decoder layer (1-based) alignments are read from; null: the penultimate of 3 or more, "
        "else the last",
        AT_LEAST_1,
    )
    cache: Literal["auto", "static", "dynamic"] = setting(
        "auto",
        "the decode step: static (fixed shapes, CUDA graphs on a GPU), dynamic (a growing cache); "
        "auto: static on a GPU, else dynamic",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patience == 0:  # 0 and null are the one exact rule
            object.__setattr__(self, "patience", None)

    def finished_cap(self) -> int | None:
        """The finished hypotheses after which ``patience`` ends a sentence's beam search:
        ``beam_size · patience`` rounded as CTranslate2 rounds it (in float32, halves away from
        zero), at least 1; None under the exact rule."""
        if self.patience is None:
            return None
        product = _float32(_float32(self.beam_size) * _float32(self.patience))
        return max(1, math.floor(product + 0.5))


@dataclass(frozen=True)
class EvalConfig(Checked):
    """Scoring, for validation and ``nmt evaluate --checkpoint``."""

    section = "eval"

    tokenize: BleuTokenizer = setting(
        "auto",
        "sacreBLEU's BLEU tokenizer; auto: from data.tgt_lang as sacreBLEU picks it (zh, ja-mecab, "
        "ko-mecab, else 13a)",
    )


@dataclass(frozen=True)
class Config:
    """A whole run: one frozen value per section, stored in every checkpoint
    (:func:`config_to_dict`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


SECTIONS: dict[str, type] = {
    cls.section: cls
    for cls in (ModelConfig, DataConfig, TokenizerConfig, TrainConfig, DecodeConfig, EvalConfig)
}


def _sections(raw: Any) -> dict[str, dict[str, Any]]:
    """``raw`` as ``{section: {key: value}}`` (copied), or a :class:`ConfigError` saying what is
    wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"expected a mapping of sections ({', '.join(SECTIONS)}), got {kind(raw)}"
        )
    out = {}
    for name, values in raw.items():
        name = str(name)
        if values is None or isinstance(values, Plain) and values.strip() in NULL:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(
                f"section [{written(name)}] must be a mapping of key: value, got {kind(values)}",
                key=name,
            )
        bad = [k for k in values if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"section [{written(name)}] has non-text key(s) {bad}", key=name)
        out[name] = dict(values)
    return out


def _unknown_key(section: str, name: str) -> ConfigError:
    elsewhere = [s for s, cls in SECTIONS.items() if name in {f.name for f in fields(cls)}]
    known = sorted(f.name for f in fields(SECTIONS[section]))
    hint = (
        f"; did you mean {elsewhere[0]}.{name}?"
        if elsewhere
        else did_you_mean(name, known, f"{section}.")
    )
    return ConfigError(
        "unknown key ",
        Key(f"{section}.{written(name)}"),
        hint or f"; the keys of [{section}] are {', '.join(known)}",
    )


def _build(cls: type, values: dict[str, Any], section: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    for name in values:
        if name not in known:
            raise _unknown_key(section, name)
    types = hints(cls)
    if cls is ModelConfig and "preset" in values:
        preset = read(values["preset"], types["preset"], "model.preset")
        values = {**PRESETS.get(preset, {}), **values}
    kwargs = {
        k: read(v, types[k], f"{section}.{k}", known[k].metadata["range"])
        for k, v in values.items()
    }
    return cls(**kwargs)


def config_from_dict(raw: dict[str, Any], source: str | None = None) -> Config:
    """Build a validated :class:`Config` from nested dictionaries (as :func:`config_to_dict` writes
    them).

    Args:
        source: where ``raw`` comes from (a checkpoint), named in front of any error.

    Raises:
        ConfigError: an unknown section or key, a value of the wrong type or out of range, or an
            inconsistent setting (e.g. ``d_model`` not divisible by ``n_heads``).
    """
    try:
        raw = _sections(raw)
        for name in raw:
            if name not in SECTIONS:
                hint = (
                    did_you_mean(name, list(SECTIONS))
                    or f"; the sections are {', '.join(SECTIONS)}"
                )
                raise ConfigError(f"unknown section {written(name)}{hint}", key=name)
        parts = {name: _build(cls, raw.get(name, {}), name) for name, cls in SECTIONS.items()}
        written_data = raw.get("data", {})
        if written_data.get("directions") not in (None, *NULL) and {"src_lang", "tgt_lang"} & set(
            written_data
        ):
            given = "data.src_lang" if "src_lang" in written_data else "data.tgt_lang"
            raise ConfigError(
                Key("data.directions"),
                " replaces ",
                Key(given),
                ": write the language pairs in one of them, not both",
            )
        # the default: tie exactly when there is one vocabulary
        if "share_embeddings" not in raw.get("model", {}):
            parts["model"] = replace(parts["model"], share_embeddings=parts["tokenizer"].joint)
        cfg = Config(**parts)
        validate(cfg)
    except ConfigError as exc:
        if source is not None and exc.path is None:
            exc.located(source)
        raise
    return cfg


def validate(cfg: Config) -> None:
    """Check the rules that relate fields (each field's own rules are checked when its section is
    built).

    Raises:
        ConfigError: one line naming the keys and what they need.
    """
    m, d, data, tk = cfg.model, cfg.decode, cfg.data, cfg.tokenizer
    if m.share_embeddings and not tk.joint:
        raise ConfigError(
            Key("model.share_embeddings"),
            " needs ",
            Key("tokenizer.joint"),
            "=true: separate vocabularies give one id different pieces on each side; set "
            "model.share_embeddings=false",
        )
    for a, b in (("train_src", "train_tgt"), ("valid_src", "valid_tgt")):
        if bool(getattr(data, a)) != bool(getattr(data, b)):
            raise ConfigError(
                Key(f"data.{a}"),
                " and ",
                Key(f"data.{b}"),
                " go together: set both (or neither, to use data.dir or data.hf_dataset)",
            )
    if tk.joint and (tk.src_model or tk.tgt_model):
        given = "tokenizer.src_model" if tk.src_model else "tokenizer.tgt_model"
        raise ConfigError(
            Key(given), " needs tokenizer.joint=false; a joint model is tokenizer.model"
        )
    if not tk.joint and tk.model:
        raise ConfigError(
            Key("tokenizer.model"),
            " is a joint model; with tokenizer.joint=false give src_model and tgt_model",
        )
    if not tk.joint and bool(tk.src_model) != bool(tk.tgt_model):
        raise ConfigError(
            Key("tokenizer.src_model"),
            " and ",
            Key("tokenizer.tgt_model"),
            " go together: set both (or neither, to train them)",
        )
    if m.d_model % m.n_heads:
        raise ConfigError(
            Key("model.d_model"),
            f"={m.d_model} must be divisible by ",
            Key("model.n_heads"),
            f"={m.n_heads}",
        )
    if m.d_model % 2:
        raise ConfigError(
            Key("model.d_model"), f"={m.d_model} must be even for sinusoidal positions"
        )
    _validate_directions(data, tk)
    if (
        data.src_lang == data.tgt_lang
        and not data.directions
        and not (data.train_src and data.valid_src)
    ):
        raise ConfigError(
            Key("data.src_lang"),
            " and ",
            Key("data.tgt_lang"),
            f" are both {data.src_lang}: each split's one file would be read as source and target; "
            "set the languages of the two sides, or give data.train_src/train_tgt and "
            "valid_src/valid_tgt",
        )
    named = next(
        (
            n
            for n in (data.valid_split, data.valid_src, data.valid_tgt)
            if n and looks_like_test_data(n)
        ),
        None,
    )
    if named and not data.allow_test_names:
        raise ConfigError(
            Key("data.valid_split" if named == data.valid_split else "data.valid_src"),
            f" {named} names test data: choosing checkpoints on it overstates "
            "its score; validate on a validation split (e.g. val), or set "
            "data.allow_test_names=true if it is one named like a test set",
        )
    if d.n_best > d.beam_size:
        raise ConfigError(
            Key("decode.n_best"),
            " must be <= ",
            Key("decode.beam_size"),
            f" (got {d.n_best} > {d.beam_size})",
        )
    if d.beam_size > 1 and d.n_best > (d.finished_cap() or d.n_best):
        raise ConfigError(
            Key("decode.n_best"),
            f" {d.n_best} is above the {d.finished_cap()} finished hypotheses after which ",
            Key("decode.patience"),
            " ends a sentence; lower it or raise the patience",
        )
    if d.max_len_a == 0 and d.max_len_b == 0:
        raise ConfigError(
            Key("decode.max_len_a"),
            " and ",
            Key("decode.max_len_b"),
            " are both 0: every translation would be empty; raise ",
            Key("decode.max_len_b"),
        )
    if d.max_len_a == 0 and d.min_len > d.max_len_b:
        raise ConfigError(
            Key("decode.min_len"),
            f" {d.min_len} is above the output limit ",
            Key("decode.max_len_b"),
            f" {d.max_len_b}: every translation would be cut there; lower one or raise the other",
        )
    if d.alignment_layer is not None and d.alignment_layer > m.n_decoder_layers:
        raise ConfigError(
            Key("decode.alignment_layer"),
            f" {d.alignment_layer} is beyond the model's {m.n_decoder_layers} decoder layers",
        )


def _validate_directions(data: DataConfig, tk: TokenizerConfig) -> None:
    """The rules of ``data.directions``: distinct pairs of two languages; several need one
    vocabulary and a split per language."""
    pairs = data.directions or ()
    for i, pair in enumerate(pairs):
        src, tgt = pair.split("-")
        if src == tgt:
            raise ConfigError(
                Key(f"data.directions[{i}]"),
                f" {pair} translates {src} into itself; give two languages",
            )
        if pair in pairs[:i]:
            raise ConfigError(
                Key(f"data.directions[{i}]"), f" {pair} is written twice; write each direction once"
            )
    if data.directions is not None and not pairs:
        raise ConfigError(
            Key("data.directions"),
            " is empty; give at least one SRC-TGT pair, or null for data.src_lang-data.tgt_lang",
        )
    if len(pairs) > 1 and (data.train_src or data.valid_src):
        given = "data.train_src" if data.train_src else "data.valid_src"
        raise ConfigError(
            Key(given),
            " names the files of one direction; with several data.directions use data.dir "
            "({split}.{src}-{tgt}.{lang} or {split}.{lang} files) or data.hf_dataset",
        )
    if len(pairs) > 1 and not tk.joint:
        raise ConfigError(
            Key("data.directions"),
            " of several pairs share one vocabulary: set ",
            Key("tokenizer.joint"),
            "=true",
        )


MAX_CONFIG_BYTES = 1 << 20  # read no further: /dev/zero or a mistaken data file is not a config
_STREAMS: dict[str, bytes] = {}  # what each config given as a pipe or device held, by its name


def _read_head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_CONFIG_BYTES + 1)


def read_config_file(path: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """A YAML config's sections, values as text (:func:`nmt.fields.read_yaml`), and the line of each
    section and key.

    Raises:
        ConfigError: the file is missing, unreadable, not UTF-8 or not YAML, or writes a key twice.
    """
    p = Path(path)
    if not p.is_file() and not is_stream(p):  # a pipe or <(...) is read once, as a file is
        what = (
            "is a directory"
            if p.is_dir()
            else "is a link to nothing (or a loop of links)"
            if p.is_symlink()
            else "is not a regular file"
        )
        raise ConfigError(f"config file {p} " + (what if os.path.lexists(p) else "does not exist"))
    try:
        if p.is_file():
            data = _read_head(p)
        else:  # a pipe yields its text once: --resume and --init-from read the config again
            if str(p) not in _STREAMS:
                _STREAMS[str(p)] = _read_head(p)
            data = _STREAMS[str(p)]
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"larger than {MAX_CONFIG_BYTES // 2**20} MiB, which no config is; is it the right "
                "file?",
                path=p,
            )
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start}); save it as UTF-8", path=p) from None
    except OSError as exc:
        raise ConfigError(f"cannot read it ({exc.strerror or exc})", path=p) from None
    raw, lines = read_yaml(text, p)
    try:
        return _sections(raw), lines
    except ConfigError as exc:
        raise exc.located(p, lines.get(exc.key or "")) from None


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``section.key=value`` applied (the value read as
    :func:`load_config` reads a file's).

    Raises:
        ConfigError: an override not of the form ``section.key=value``, or a value that does not
            parse.
    """
    raw = _sections(raw)
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name or not section:
            raise ConfigError(
                f"override {item!r}: expected section.key=value, e.g. train.max_steps=1000"
            )
        try:
            raw.setdefault(section, {})[name] = read_override(value, f"{section}.{name}")
        except ConfigError as exc:
            # a line break in it would split the one line
            raise exc.located(f"--set {item if item.isprintable() else repr(item)}") from None
    return raw


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config and apply ``section.key=value`` overrides.

    Raises:
        ConfigError: the file is missing or not YAML, a key is written twice, a key or value
            is invalid (named with the file and line it is on, unless an override set it),
            or ``data.cache_dir`` names a file.
    """
    overrides = overrides or []
    raw, lines = read_config_file(path) if path is not None else ({}, {})
    raw = apply_overrides(raw, overrides)
    for item in overrides:
        lines.pop(item.partition("=")[0].strip(), None)
    try:
        cfg = config_from_dict(raw)
        if (
            cfg.data.cache_dir
            and Path(cfg.data.cache_dir).exists()
            and not Path(cfg.data.cache_dir).is_dir()
        ):
            raise ConfigError(
                Key("data.cache_dir"),
                f" {cfg.data.cache_dir} is a file; name a directory (it is created if missing)",
            )
    except ConfigError as exc:
        keys = [str(p).partition("[")[0] for p in exc.parts if isinstance(p, Key)] + [exc.key or ""]
        line = next((lines[k] for k in keys if k in lines), None)
        raise (exc.located(path, line) if line else exc) from None
    return cfg


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (tuples as lists), as stored in checkpoints and ``config.yaml``."""
    out = dataclasses.asdict(cfg)
    out["train"]["adam_betas"] = list(cfg.train.adam_betas)
    # they replace src_lang and tgt_lang, which would only mislead a reader
    if cfg.data.directions is not None:
        out["data"]["directions"] = list(cfg.data.directions)
        del out["data"]["src_lang"], out["data"]["tgt_lang"]
    return out


def config_to_yaml(cfg: Config) -> str:
    """``config.yaml``'s text: :func:`config_to_dict` as YAML, keys in the sections' order, every
    non-ASCII character escaped. Written raw (``allow_unicode``), U+0085 and the other YAML line
    breaks would read back as spaces (PyYAML folds them), so a value would not survive its own run
    directory. A path's ``$`` is written ``$$``, as a config writes the text ``$``."""
    import yaml

    out = {name: as_written(values, SECTIONS[name]) for name, values in config_to_dict(cfg).items()}
    return yaml.safe_dump(out, sort_keys=False)


def with_vocab(cfg: Config, src_vocab_size: int, tgt_vocab_size: int) -> Config:
    """``cfg`` with the model's vocabulary sizes set (from the trained tokenizer)."""
    return replace(
        cfg, model=replace(cfg.model, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)
    )


def _float32(x: float) -> float:
    """``x`` rounded to the nearest float32, as a C++ ``float`` holds it."""
    return struct.unpack("f", struct.pack("f", x))[0]
