"""Choosing decoding settings on a validation set: a grid over beam size, length
normalisation and length-penalty exponent α, scored with the BLEU that validation uses.

One search per beam size and stopping rule (``patience``) serves every (normalisation, α) pair
exactly. The search keeps
the continuations with the best raw log-probabilities and sets finished hypotheses aside
in an order that neither the normalisation nor α changes; those two only rank the
finished ones and decide when a sentence's result is settled. Searched once with every
setting of the grid as a ranking (:class:`~nmt.decode.beams.Ranking`), a sentence ends only
when its result is settled under each of them, and every finished hypothesis comes back;
re-ranking those under a setting gives what a search with that setting alone returns (up to
exact ties between scores).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nmt.config import BEAM, LENGTH_PENALTY, PATIENCE, ConfigError
from nmt.data.corpus import read_lines
from nmt.decode.beams import LENGTH_NORMALIZATIONS, Hypothesis, length_penalty
from nmt.errors import Key
from nmt.fields import looks_like_test_data
from nmt.scoring.evaluate import score
from nmt.translation.inference import Decoding, Inference


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
        nmt.data.corpus.DataError: a file is missing or not UTF-8 text.
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
    """One decoding setting of the grid (the ``decode`` config keys of the same names; ``patience``
    None is the exact rule)."""

    beam_size: int
    length_normalization: str
    length_penalty: float
    patience: float | None = None


def grid(
    beam_sizes: list[int],
    normalizations: list[str],
    alphas: list[float],
    patiences: list[float | None] = (None,),
) -> list[Setting]:
    """Every distinct setting, in the given order. Greedy search (beam 1), ``"none"`` and
    α 0 rank by raw log-probability whatever the rest says, so each appears once, as
    ``("none", 0.0)``; greedy search ends at its first EOS whatever the patience.

    Raises:
        ConfigError: a beam size, α or patience out of ``decode.beam_size``'s,
            ``decode.length_penalty``'s or ``decode.patience``'s range, or an unknown
            normalisation.
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
    bad = [p for p in patiences if p is not None and p not in PATIENCE]
    if bad:
        raise ConfigError(
            Key("patiences"), f" must all be {PATIENCE} (0: the exact rule), got {bad[0]}"
        )
    out: list[Setting] = []
    for beam in beam_sizes:
        for patience in patiences if beam > 1 else [None]:
            for name in normalizations:
                for alpha in alphas:
                    raw = beam == 1 or name == "none" or alpha == 0
                    kind = ("none", 0.0) if raw else (name, alpha)
                    setting = Setting(beam, *kind, patience)
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
    """Translate ``src_lines`` once per beam size and patience, and score every setting against
    ``ref_lines``.

    Args:
        decode: the checkpoint's :class:`~nmt.config.DecodeConfig` (length limits, batch budget).
        settings: from :func:`grid`.
        tokenize: sacreBLEU's BLEU tokenizer (``nmt tune-decode`` passes the checkpoint's, as
            validation scored it: ``ja-mecab`` for a Japanese target).
        progress: told how many more lines are translated (a progress bar's ``update``); the
            lines are translated once per beam size and patience.
        src_prefix: the target tag of a multilingual model
        (:class:`nmt.translation.inference.Decoding`).

    Returns:
        One row per setting, in order: its fields, ``bleu``, ``chrf``, ``length_ratio``
        (hypothesis to reference length, in sacreBLEU's tokens), ``search_s`` (seconds of
        search for that beam size and patience, shared by their rows) and the metrics'
        signatures.
    """
    rows = []
    for beam, patience in dict.fromkeys((s.beam_size, s.patience) for s in settings):
        start = time.perf_counter()
        alike = [s for s in settings if (s.beam_size, s.patience) == (beam, patience)]
        rankings = tuple((s.length_normalization, s.length_penalty) for s in alike)
        (normalization, alpha), *_ = rankings
        # the grid's stopping rule, whatever the checkpoint's; its rankings settle each line
        searched = replace(
            decode,
            beam_size=beam,
            n_best=1,
            patience=patience,
            length_normalization=normalization,
            length_penalty=alpha,
        )
        decoding = Decoding(searched, src_prefix=src_prefix, rankings=rankings)
        results = inference.translate(src_lines, decoding, progress=progress)
        seconds = round(time.perf_counter() - start, 1)
        for s in alike:
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
