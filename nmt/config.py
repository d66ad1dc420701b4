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
    share_embeddings: bool = True  # tie the source embedding to the target's; in a Config, defaults to tokenizer.joint
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
    Finished hypotheses are ranked by ``log P(Y|X) / lp(|Y|)``, ``|Y|`` counting EOS, where
    ``length_normalization`` picks ``lp``: ``"gnmt"``, ``((5 + |Y|) / 6) ** length_penalty``
    (Wu et al. 2016, §7); ``"length"``, ``|Y| ** length_penalty`` (fairseq, Hugging Face,
    CTranslate2); ``"none"``, 1. ``max_tokens`` is the source-side batch budget in tokens,
    padding included; a source
    line of more than ``max_input_pieces`` pieces is left untranslated, with a warning.
    UNK is never generated (like PAD and BOS) unless ``allow_unk``; EOS is not generated
    before ``min_len`` output pieces (fairseq's ``--min-len``, Hugging Face's ``min_length``).
    """

    beam_size: int = 5
    # Chosen on Multi30k validation (docs/quality.md): beam 5, BLEU 25.83 against 24.98 for gnmt 0.6.
    length_penalty: float = 2.0
    length_normalization: str = "length"
    max_len_a: float = 1.5
    max_len_b: int = 10
    n_best: int = 1
    min_len: int = 0  # EOS is forbidden before this many output pieces
    max_tokens: int = 4096
    max_input_pieces: int = 1024  # a longer source line is not translated (its output line stays empty)
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


def _number(value: Any, tp: type, where: str) -> int | float:
    """``value`` as an ``int`` or ``float``, from a number or from text written as Python or
    JSON would (``5e-4``, ``1E9``, ``1_000_000``, ``0x10``, ``.5``); an integral float
    (``4e3``) is accepted for an ``int``. YAML 1.1 reads ``5e-4`` as text, hence the text path.

    Raises:
        ConfigError: anything else (``true``, ``lots``, ``1.5`` for an ``int``).
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text, 0)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    if tp is float:
        return float(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{where}: expected int, got {value!r}")
        return int(value)
    return value


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
    if tp in (int, float):
        return _number(value, tp, where)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {value!r}")
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


def _build(cls: type, values: dict[str, Any], section: str, source: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) in [{section}]: {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
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
        parts[name] = _build(cls, raw.get(name, {}), name, source)
    if "share_embeddings" not in raw.get("model", {}):  # the default: tie exactly when there is one vocabulary
        parts["model"] = replace(parts["model"], share_embeddings=parts["tokenizer"].joint)
    cfg = Config(**parts)
    validate(cfg)
    return cfg


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``low`` to ``high``, each end included unless ``*_open``."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        low, high = _show(self.low), _show(self.high)
        if self.high == math.inf:
            return "a finite number" if self.low == -math.inf else f"{'>' if self.low_open else '>='} {low}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _show(x: float) -> str:
    """``x`` without a spurious ``.0`` or exponent: 4294967295, not 4.29497e+09."""
    return str(int(x)) if math.isfinite(x) and x == int(x) else f"{x:g}"


_AT_LEAST_1, _AT_LEAST_0, _POSITIVE, _PROBABILITY = Range(1), Range(0), Range(0, low_open=True), Range(0, 1, high_open=True)

# Every number in a config and the values it may take: checked at load, so that a bad value
# stops a run before anything is written. ``null`` (where allowed) is not checked.
RANGES: dict[str, Range] = {
    "model.d_model": _AT_LEAST_1, "model.d_ff": _AT_LEAST_1, "model.n_heads": _AT_LEAST_1,
    "model.n_encoder_layers": _AT_LEAST_1, "model.n_decoder_layers": _AT_LEAST_1,
    "model.dropout": _PROBABILITY, "model.attention_dropout": _PROBABILITY, "model.activation_dropout": _PROBABILITY,
    "model.src_vocab_size": _AT_LEAST_0, "model.tgt_vocab_size": _AT_LEAST_0,
    "data.max_len": _AT_LEAST_1, "data.max_len_ratio": Range(1), "data.valid_max_sentences": _AT_LEAST_1, "data.workers": _AT_LEAST_0,
    "tokenizer.vocab_size": Range(5),  # the four special pieces and at least one more
    "tokenizer.character_coverage": Range(0, 1, low_open=True), "tokenizer.input_sentence_size": _AT_LEAST_1,
    "train.seed": Range(0, 2**32 - 1),  # NumPy's seed range
    "train.threads": _AT_LEAST_0, "train.max_tokens": _AT_LEAST_1, "train.max_steps": _AT_LEAST_1, "train.max_epochs": _AT_LEAST_1,
    "train.max_time_s": _AT_LEAST_0, "train.lr_scale": _AT_LEAST_0, "train.lr": _AT_LEAST_0, "train.warmup_steps": _AT_LEAST_1,
    "train.adam_betas": _PROBABILITY, "train.adam_eps": _POSITIVE, "train.weight_decay": _AT_LEAST_0, "train.clip_norm": _AT_LEAST_0,
    "train.label_smoothing": _PROBABILITY, "train.log_every": _AT_LEAST_1, "train.validate_every": _AT_LEAST_1,
    "train.save_every": _AT_LEAST_0, "train.keep_last": _AT_LEAST_1, "train.valid_beam_size": _AT_LEAST_1, "train.patience": _AT_LEAST_0,
    "train.update_freq": _AT_LEAST_1,
    "decode.beam_size": _AT_LEAST_1, "decode.length_penalty": Range(), "decode.max_len_a": _AT_LEAST_0, "decode.max_len_b": _AT_LEAST_0,
    "decode.n_best": _AT_LEAST_1, "decode.min_len": _AT_LEAST_0, "decode.max_tokens": _AT_LEAST_1, "decode.max_input_pieces": _AT_LEAST_1,
}

# Numbers that may also be written "auto" (decided from the data; see their sections).
AUTO_NUMBERS = frozenset({"tokenizer.character_coverage"})


def _check_ranges(cfg: Config) -> None:
    for key, allowed in RANGES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        items = {f"{key}[{i}]": v for i, v in enumerate(value)} if isinstance(value, tuple) else {key: value}
        for where, v in items.items():
            if v is not None and v != "auto" and v not in allowed:
                raise ConfigError(f"{where} must be {'auto or a number ' if key in AUTO_NUMBERS else ''}{allowed}, got {v}")


def validate(cfg: Config) -> None:
    """Check every number's range (:data:`RANGES`) and cross-field consistency.

    Raises:
        ConfigError: one line naming the key and the values it allows.
    """
    if isinstance(cfg.tokenizer.character_coverage, str) and cfg.tokenizer.character_coverage != "auto":
        raise ConfigError(f"tokenizer.character_coverage must be auto or a number in (0, 1], got {cfg.tokenizer.character_coverage!r}")
    _check_ranges(cfg)
    m, t, d = cfg.model, cfg.train, cfg.decode
    if m.share_embeddings and not cfg.tokenizer.joint:
        raise ConfigError("model.share_embeddings needs tokenizer.joint=true: separate vocabularies give one id different pieces on each side; set model.share_embeddings=false")
    if cfg.tokenizer.byte_fallback not in (True, False, "auto"):
        raise ConfigError(f"tokenizer.byte_fallback must be auto, true or false, got {cfg.tokenizer.byte_fallback!r}")
    if cfg.eval.tokenize != "auto" and cfg.eval.tokenize not in BLEU_TOKENIZERS:
        raise ConfigError(f"eval.tokenize must be auto or one of {', '.join(BLEU_TOKENIZERS)}, got {cfg.eval.tokenize!r}")
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
    if d.n_best > d.beam_size:
        raise ConfigError(f"decode.n_best must be <= decode.beam_size (got {d.n_best} > {d.beam_size})")
    if d.length_normalization not in ("gnmt", "length", "none"):  # nmt.search.LENGTH_NORMALIZATIONS (which needs torch)
        raise ConfigError(f"decode.length_normalization must be gnmt, length or none, got {d.length_normalization!r}")
    if cfg.tokenizer.type not in ("bpe", "unigram"):
        raise ConfigError(f"tokenizer.type must be bpe or unigram, got {cfg.tokenizer.type!r}")


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config and apply ``section.key=value`` overrides.

    Raises:
        ConfigError: the file is missing or not YAML, a key/value is invalid, or
            ``data.cache_dir`` names a file.
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
    cfg = config_from_dict(raw, source + (" with --set overrides" if overrides else ""))
    if cfg.data.cache_dir and Path(cfg.data.cache_dir).exists() and not Path(cfg.data.cache_dir).is_dir():
        raise ConfigError(f"data.cache_dir {cfg.data.cache_dir} is a file; name a directory (it is created if missing)")
    return cfg


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
