"""Choosing decoding settings on a validation set: a grid over beam size, length
normalisation and length-penalty exponent α, scored with the BLEU that validation uses.

One search per beam size serves every (normalisation, α) pair exactly. The search keeps
the continuations with the best raw log-probabilities and sets finished hypotheses aside
in an order that neither the normalisation nor α changes; those two only rank the
finished ones and decide when the exact early-stop bound may end the search early, which
never changes the result. Searching once with ``n_best = beam_size`` (so that only the
"``beam`` hypotheses finished" rule stops a sentence) and re-ranking the finished
hypotheses under each setting gives what a search with that setting returns (up to exact
ties between scores).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .config import BEAM, LENGTH_PENALTY, ConfigError
from .core.search import LENGTH_NORMALIZATIONS, Hypothesis, length_penalty
from .corpus import read_lines
from .errors import Key
from .evaluate import score
from .fields import looks_like_test_data
from .inference import Decoding, Inference


def validation_lines(
    src: str | Path,
    ref: str | Path,
    max_sentences: int | None = None,
    allow_test_names: bool = False,
) -> tuple[list[str], list[str]]:
    """The first ``max_sentences`` lines (None: all) of the validation source and reference to tune
    on.

    Settings chosen on the test set overstate its score, so a file whose name says test
    (:func:`looks_like_test_data`) is refused before it is read, unless ``allow_test_names``
    (a validation set named like a test set, such as WMT's newstest2013).

    Raises:
        ConfigError: a name that says test, ``max_sentences`` below 1, or files that differ in
            length.
        nmt.corpus.DataError: a file is missing or not UTF-8 text.
    """
    for name, path in (("src", src), ("ref", ref)):
        if looks_like_test_data(path) and not allow_test_names:
            raise ConfigError(
                Key(name),
                f" {path}: the name says test data; choose decoding settings on a validation set "
                "(tuning on the test set overstates its score), or pass ",
                Key("allow_test_names"),
                " if this file is a validation set named like a test set",
            )
    if max_sentences is not None and max_sentences < 1:
        raise ConfigError(Key("max_sentences"), f" must be at least 1, got {max_sentences}")
    src_lines, ref_lines = read_lines(src)[:max_sentences], read_lines(ref)[:max_sentences]
    if len(src_lines) != len(ref_lines):
        raise ConfigError(
            Key("src"),
            f" {src} and ",
            Key("ref"),
            f" {ref} differ in length ({len(src_lines)} and {len(ref_lines)} lines); they must "
            "match line for line",
        )
    if not src_lines:
        raise ConfigError(
            Key("src"),
            f" {src} and ",
            Key("ref"),
            f" {ref} have no lines: give the validation set to tune on",
        )
    return src_lines, ref_lines


@dataclass(frozen=True)
class Setting:
    """One decoding setting of the grid (the ``decode`` config keys of the same names)."""

    beam_size: int
    length_normalization: str
    length_penalty: float


def grid(beam_sizes: list[int], normalizations: list[str], alphas: list[float]) -> list[Setting]:
    """Every distinct setting, in the given order. Greedy search (beam 1), ``"none"`` and
    α 0 rank by raw log-probability whatever the rest says, so each appears once, as
    ``("none", 0.0)``.

    Raises:
        ConfigError: a beam size or α out of ``decode.beam_size``'s or ``decode.length_penalty``'s
            range, or an unknown normalisation.
    """
    # decode.beam_size's and length_penalty's ranges
    for key, values, allowed in (
        ("beam_sizes", beam_sizes, BEAM),
        ("alphas", alphas, LENGTH_PENALTY),
    ):
        if not values or any(v not in allowed for v in values):
            raise ConfigError(Key(key), f" must all be {allowed}, got {','.join(map(str, values))}")
    unknown = [n for n in normalizations if n not in LENGTH_NORMALIZATIONS]
    if unknown:
        raise ConfigError(
            Key("normalizations"),
            f": unknown {', '.join(unknown)}; choose from {', '.join(LENGTH_NORMALIZATIONS)}",
        )
    out: list[Setting] = []
    for beam in beam_sizes:
        for name in normalizations:
            for alpha in alphas:
                raw = beam == 1 or name == "none" or alpha == 0
                setting = Setting(beam, "none", 0.0) if raw else Setting(beam, name, alpha)
                if setting not in out:
                    out.append(setting)
    return out


def rerank(hyps: list[Hypothesis], normalization: str, alpha: float) -> list[int]:
    """The best hypothesis' tokens under ``log P / lp(|Y|)`` (``|Y|`` counting EOS); ``[]`` for
    none."""
    if not hyps:
        return []
    return max(
        hyps, key=lambda h: h.log_prob / length_penalty(len(h.tokens) + 1, alpha, normalization)
    ).tokens


def tune_decode(
    inference: Inference,
    src_lines: list[str],
    ref_lines: list[str],
    decode,
    settings: list[Setting],
    tokenize: str = "13a",
    progress=None,
    src_prefix: tuple[int, ...] = (),
) -> list[dict]:
    """Translate ``src_lines`` once per beam size and score every setting against ``ref_lines``.

    Args:
        decode: the checkpoint's :class:`~nmt.config.DecodeConfig` (length limits, batch budget).
        settings: from :func:`grid`.
        tokenize: sacreBLEU's BLEU tokenizer (``nmt tune-decode`` passes the checkpoint's, as
            validation scored it: ``ja-mecab`` for a Japanese target).
        progress: told how many more lines are translated (a progress bar's ``update``); the
            lines are translated once per beam size.
        src_prefix: the target tag of a multilingual model (:class:`nmt.inference.Decoding`).

    Returns:
        One row per setting, in order: its fields, ``bleu``, ``chrf``, ``length_ratio``
        (hypothesis to reference length, in sacreBLEU's tokens), ``search_s`` (seconds of
        search for that beam size, shared by its rows) and the metrics' signatures.
    """
    rows = []
    for beam in dict.fromkeys(s.beam_size for s in settings):
        start = time.perf_counter()
        decoding = Decoding(replace(decode, beam_size=beam, n_best=beam), src_prefix=src_prefix)
        results = inference.translate(src_lines, decoding, progress=progress)
        seconds = round(time.perf_counter() - start, 1)
        for s in (s for s in settings if s.beam_size == beam):
            hyps = inference.tokenizer.decode_tgt(
                [rerank(r, s.length_normalization, s.length_penalty) for r in results]
            )
            result = score(hyps, [ref_lines], tokenize=tokenize)
            rows.append(
                {
                    **asdict(s),
                    **{k: result[k] for k in ("bleu", "chrf", "length_ratio")},
                    "search_s": seconds,
                    **{k: result[k] for k in ("bleu_signature", "chrf_signature")},
                }
            )
    return rows
