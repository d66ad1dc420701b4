"""Configuration: frozen dataclasses, YAML loading and typed ``--set`` overrides.

A run is described by one :class:`Config` with six sections (``model``, ``data``,
``tokenizer``, ``train``, ``decode``, ``eval``). Every field has a default that follows
Vaswani et al. 2017 where the paper fixes it; anything else (Pre-LN, GELU, the
inverse-sqrt schedule) must be asked for by name. Unknown keys are an error, never
silently ignored, so a misspelt option cannot go unnoticed.

The resolved config is stored inside every checkpoint, so a checkpoint alone rebuilds
its model.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from .evaluate import TOKENIZERS as BLEU_TOKENIZERS


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says which key and why."""


@dataclass(frozen=True)
class ModelConfig:
    """Transformer encoder-decoder hyper-parameters (Vaswani et al. 2017, §3 and Table 3).

    ``preset`` fills the size fields from :data:`PRESETS` before explicit keys apply.
    ``norm_position`` is ``"post"`` (the paper, ``LayerNorm(x + Dropout(Sublayer(x)))``)
    or ``"pre"``; ``activation`` is ``"relu"`` (the paper) or ``"gelu"``.
    ``dropout`` is the paper's P_drop (embedding sum and every residual branch);
    ``attention_dropout`` (on attention probabilities) and ``activation_dropout`` (on
    the feed-forward activation) are tensor2tensor's additions, off unless set.
    """

    preset: str | None = None
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_position: str = "post"
    share_embeddings: bool = True  # tie source, target and output when the vocabulary is joint
    src_vocab_size: int = 0  # filled in from the tokenizer
    tgt_vocab_size: int = 0


PRESETS: dict[str, dict[str, Any]] = {
    # Vaswani et al. 2017, Table 3.
    "base": dict(d_model=512, d_ff=2048, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, dropout=0.1),
    "big": dict(d_model=1024, d_ff=4096, n_heads=16, n_encoder_layers=6, n_decoder_layers=6, dropout=0.3),
    # Sized for Multi30k (29k pairs) on a few CPU cores.
    "small": dict(d_model=256, d_ff=1024, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, dropout=0.1),
    # For tests and the shipped toy corpus.
    "tiny": dict(d_model=64, d_ff=256, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1),
}


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel text comes from and how it is cleaned.

    Exactly one source kind is used, in this order of precedence:

    * explicit files: ``train_src``/``train_tgt`` (and ``valid_src``/``valid_tgt``);
    * ``hf_dataset``: a Hugging Face dataset name (``hf_config``) or a loader such as
      ``"json"``/``"parquet"`` with ``hf_data_files`` (``{split: path}``), read through
      ``datasets.load_dataset``; rows hold a ``translation`` dict keyed by language;
    * ``dir``: a directory of ``{split}.{lang}`` or ``{split}.{lang}.gz`` files.

    ``max_len`` (pieces, without BOS/EOS) and ``max_len_ratio`` filter training pairs
    only; validation and test text is never dropped. ``workers`` processes encode the
    training text in blocks into a memory-mapped cache (0: one per usable CPU, at most 16).
    """

    src_lang: str = "en"
    tgt_lang: str = "de"
    dir: str | None = None
    train_split: str = "train"
    valid_split: str = "valid"
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_data_files: dict[str, str] | None = None
    max_len: int = 128
    max_len_ratio: float = 3.0
    valid_max_sentences: int | None = None  # cap on validation sentences decoded for BLEU
    workers: int = 0  # processes encoding the training text; 0: one per usable CPU, at most 16
    cache_dir: str | None = None  # encoded corpora; None: RUN_DIR/cache. Share one across runs to encode once


@dataclass(frozen=True)
class TokenizerConfig:
    """SentencePiece settings (Kudo and Richardson 2018).

    ``joint`` trains one model on both sides; otherwise one per language.
    ``model`` (joint) or ``src_model``/``tgt_model`` reuse trained ``.model`` files.
    ``character_coverage`` is the share of characters the model covers, the rest
    becoming UNK; ``"auto"`` picks 0.9995 for text with a large character set (Chinese,
    Japanese, Korean) and 1.0 otherwise, as SentencePiece recommends (see
    :func:`nmt.tokenizer.auto_character_coverage`). ``byte_fallback`` spells characters
    outside the vocabulary as UTF-8 byte pieces instead of UNK (256 of the pieces);
    ``"auto"`` turns it on exactly when the character coverage is below 1.0.
    """

    type: str = "bpe"
    vocab_size: int = 8000
    character_coverage: float | str = "auto"
    byte_fallback: bool | str = "auto"
    joint: bool = True
    model: str | None = None
    src_model: str | None = None
    tgt_model: str | None = None
    input_sentence_size: int = 2_000_000  # sentences sampled for training the model


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping (Vaswani et al. 2017, §5.3-5.4).

    ``schedule="noam"`` is the paper's ``lr = lr_scale · d_model^-0.5 · min(step^-0.5,
    step · warmup_steps^-1.5)``; ``schedule="inverse_sqrt"`` warms up linearly to the peak
    ``lr`` and decays as ``lr · sqrt(warmup_steps / step)``. ``max_tokens`` is the batch
    budget in tokens, padding included. Intervals are in optimizer steps.
    """

    run_dir: str = "runs/default"
    seed: int = 1
    device: str = "auto"
    threads: int = 0  # torch intra-op threads on CPU; 0 keeps torch's default
    max_tokens: int = 4096
    max_steps: int = 100_000
    max_epochs: int = 1000
    max_time_s: float = 0.0  # stop after this many seconds of training; 0 = no limit
    schedule: str = "noam"
    lr_scale: float = 1.0
    lr: float = 5e-4  # peak lr, inverse_sqrt only
    warmup_steps: int = 4000
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping
    label_smoothing: float = 0.1
    log_every: int = 100
    validate_every: int = 1000
    save_every: int = 0  # extra step checkpoints every N steps; 0 = only last/best
    keep_last: int = 3
    valid_beam_size: int = 4
    patience: int = 0  # stop after this many validations without a BLEU improvement; 0 = never
    precision: str = "fp32"  # fp32, bf16 (autocast) or fp16 (autocast + gradient scaling)
    update_freq: int = 1  # micro-batches accumulated per optimizer step
    compile: bool = False  # torch.compile the training forward/backward (dynamic shapes)
    progress_bar: bool = True
    tensorboard: bool = True  # scalars under run_dir/tensorboard when the tensorboard package is installed


@dataclass(frozen=True)
class DecodeConfig:
    """Beam search settings.

    Output length is capped at ``max_len_a · src_len + max_len_b`` pieces per sentence.
    Finished hypotheses are ranked by ``log P(Y|X) / lp(Y)`` with GNMT's length penalty
    ``lp(Y) = ((5 + |Y|) / 6) ** length_penalty`` (Wu et al. 2016, §7), ``|Y|`` counting EOS.
    ``max_tokens`` is the source-side batch budget in tokens, padding included.
    UNK is never generated (like PAD and BOS) unless ``allow_unk``.
    """

    beam_size: int = 5
    length_penalty: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10
    n_best: int = 1
    max_tokens: int = 4096
    allow_unk: bool = False


@dataclass(frozen=True)
class EvalConfig:
    """Scoring, for validation and ``nmt evaluate --checkpoint``.

    ``tokenize`` is sacreBLEU's BLEU tokenizer; ``"auto"`` picks it from ``data.tgt_lang``
    as sacreBLEU does (``zh``, ``ja-mecab``, ``ko-mecab``, else ``13a``; see
    :func:`nmt.evaluate.bleu_tokenizer`).
    """

    tokenize: str = "auto"


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def _parse(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(f"{where}: cannot parse {text!r} as a value") from None


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from YAML or a ``--set`` string) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        for option in inner[:-1]:  # the first type that takes the value, e.g. 0.9995 before "auto"
            try:
                return _coerce(value, option, where)
            except ConfigError:
                pass
        return _coerce(value, inner[-1], where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp in (int, float, str):
        if isinstance(value, str) and tp is not str:
            value = _parse(value, where)
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, tp) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = _parse(value, where)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if origin is dict:
        if isinstance(value, str):
            value = _parse(value, where)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}
    raise ConfigError(f"{where}: unsupported type {tp}")


def _build(cls: type, values: dict[str, Any], section: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{section}]: {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
    if cls is ModelConfig and values.get("preset") is not None:
        preset = values["preset"]
        if preset not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        values = {**PRESETS[preset], **values}
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}
    return cls(**kwargs)


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "tokenizer": TokenizerConfig, "train": TrainConfig, "decode": DecodeConfig, "eval": EvalConfig}


def _sections(raw: Any, source: str) -> dict[str, dict[str, Any]]:
    """``raw`` as ``{section: {key: value}}``, or a :class:`ConfigError` saying what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(_SECTIONS)}), got {type(raw).__name__}")
    out = {}
    for name, values in raw.items():
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section [{name}] must be a mapping of key: value, got {type(values).__name__}")
        bad = [k for k in values if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{source}: section [{name}] has non-text key(s) {bad}")
        out[str(name)] = dict(values)
    return out


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Config:
    """Build a validated :class:`Config` from nested dictionaries.

    Raises:
        ConfigError: on an unknown section or key, a value of the wrong type, or an
            inconsistent setting (e.g. ``d_model`` not divisible by ``n_heads``).
    """
    raw = _sections(raw, source)
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {', '.join(unknown)}; known: {', '.join(_SECTIONS)}")
    parts = {}
    for name, cls in _SECTIONS.items():
        parts[name] = _build(cls, raw.get(name, {}), name)
    cfg = Config(**parts)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Check cross-field consistency. Raises :class:`ConfigError`."""
    m, t, d = cfg.model, cfg.train, cfg.decode
    positive = {
        "model.d_model": m.d_model, "model.d_ff": m.d_ff, "model.n_heads": m.n_heads, "model.n_encoder_layers": m.n_encoder_layers,
        "model.n_decoder_layers": m.n_decoder_layers, "train.max_tokens": t.max_tokens, "train.warmup_steps": t.warmup_steps,
        "train.log_every": t.log_every, "train.validate_every": t.validate_every, "train.keep_last": t.keep_last, "train.update_freq": t.update_freq,
        "train.adam_eps": t.adam_eps, "train.valid_beam_size": t.valid_beam_size, "decode.max_tokens": d.max_tokens, "tokenizer.vocab_size": cfg.tokenizer.vocab_size,
        "data.max_len": cfg.data.max_len,
    }
    for name, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{name} must be positive, got {value}")
    non_negative = {"train.weight_decay": t.weight_decay, "train.clip_norm": t.clip_norm, "train.save_every": t.save_every, "train.patience": t.patience,
                    "train.max_time_s": t.max_time_s, "data.workers": cfg.data.workers, "decode.max_len_a": d.max_len_a, "decode.max_len_b": d.max_len_b, "train.threads": t.threads}
    for name, value in non_negative.items():
        if not value >= 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    for name, value in {"model.dropout": m.dropout, "model.attention_dropout": m.attention_dropout, "model.activation_dropout": m.activation_dropout,
                        "train.adam_betas[0]": t.adam_betas[0], "train.adam_betas[1]": t.adam_betas[1]}.items():
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{name} must be in [0, 1), got {value}")
    coverage = cfg.tokenizer.character_coverage
    if coverage != "auto" and not (isinstance(coverage, float) and 0.0 < coverage <= 1.0):
        raise ConfigError(f"tokenizer.character_coverage must be auto or a number in (0, 1], got {coverage!r}")
    if cfg.tokenizer.byte_fallback not in (True, False, "auto"):
        raise ConfigError(f"tokenizer.byte_fallback must be auto, true or false, got {cfg.tokenizer.byte_fallback!r}")
    if cfg.eval.tokenize != "auto" and cfg.eval.tokenize not in BLEU_TOKENIZERS:
        raise ConfigError(f"eval.tokenize must be auto or one of {', '.join(BLEU_TOKENIZERS)}, got {cfg.eval.tokenize!r}")
    if not math.isfinite(d.length_penalty):
        raise ConfigError(f"decode.length_penalty must be a finite number, got {d.length_penalty}")
    for a, b in (("train_src", "train_tgt"), ("valid_src", "valid_tgt")):
        if bool(getattr(cfg.data, a)) != bool(getattr(cfg.data, b)):
            raise ConfigError(f"data.{a} and data.{b} go together: set both (or neither, to use data.dir or data.hf_dataset)")
    tk = cfg.tokenizer
    if tk.joint and (tk.src_model or tk.tgt_model):
        raise ConfigError("tokenizer.src_model/tgt_model need tokenizer.joint=false; a joint model is tokenizer.model")
    if not tk.joint and tk.model:
        raise ConfigError("tokenizer.model is a joint model; with tokenizer.joint=false give src_model and tgt_model")
    if not tk.joint and bool(tk.src_model) != bool(tk.tgt_model):
        raise ConfigError("tokenizer.src_model and tokenizer.tgt_model go together: set both (or neither, to train them)")
    if cfg.data.valid_max_sentences is not None and cfg.data.valid_max_sentences < 1:
        raise ConfigError(f"data.valid_max_sentences must be >= 1 or null, got {cfg.data.valid_max_sentences}")
    if t.device != "auto" and not re.fullmatch(r"cpu|cuda(:\d+)?|mps", t.device):
        raise ConfigError(f"train.device must be auto, cpu, cuda, cuda:N or mps, got {t.device!r}")
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} must be divisible by model.n_heads={m.n_heads}")
    if m.d_model % 2:
        raise ConfigError(f"model.d_model={m.d_model} must be even for sinusoidal positions")
    if m.activation not in ("relu", "gelu"):
        raise ConfigError(f"model.activation must be relu or gelu, got {m.activation!r}")
    if m.norm_position not in ("post", "pre"):
        raise ConfigError(f"model.norm_position must be post or pre, got {m.norm_position!r}")
    if t.schedule not in ("noam", "inverse_sqrt"):
        raise ConfigError(f"train.schedule must be noam or inverse_sqrt, got {t.schedule!r}")
    if t.precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"train.precision must be fp32, bf16 or fp16, got {t.precision!r}")
    if t.update_freq < 1:
        raise ConfigError(f"train.update_freq must be >= 1, got {t.update_freq}")
    if not 0.0 <= t.label_smoothing < 1.0:
        raise ConfigError(f"train.label_smoothing must be in [0, 1), got {t.label_smoothing}")
    if d.beam_size < 1 or not 1 <= d.n_best <= d.beam_size:
        raise ConfigError(f"decode.beam_size must be >= 1 and 1 <= n_best <= beam_size (got {d.beam_size}, {d.n_best})")
    if cfg.tokenizer.type not in ("bpe", "unigram"):
        raise ConfigError(f"tokenizer.type must be bpe or unigram, got {cfg.tokenizer.type!r}")


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config and apply ``section.key=value`` overrides.

    Raises:
        ConfigError: the file is missing or not YAML, or a key/value is invalid.
    """
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist" + (" (it is a directory)" if p.is_dir() else ""))
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
        raw = _sections(raw, source)
    raw = apply_overrides(raw, overrides or [])
    return config_from_dict(raw, source + (" with --set overrides" if overrides else ""))


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``section.key=value`` applied (value kept as text)."""
    raw = _sections(raw, "config")
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. train.max_steps=1000")
        raw.setdefault(section, {})[name] = value.strip()
    return raw


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (tuples as lists), as stored in checkpoints and ``config.yaml``."""
    out = dataclasses.asdict(cfg)
    out["train"]["adam_betas"] = list(cfg.train.adam_betas)
    return out


def with_vocab(cfg: Config, src_vocab_size: int, tgt_vocab_size: int) -> Config:
    return replace(cfg, model=replace(cfg.model, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size))
