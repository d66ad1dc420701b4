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

import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .evaluate import score
from .search import Hypothesis, length_penalty
from .translate import translate_lines

# A file name that says "test": test.de, test_2016_flickr.en.gz, newstest2014.de (but not latest.en).
_TEST_NAME = re.compile(r"(?:^|[^a-z])(?:news)?test", re.IGNORECASE)


def looks_like_test_data(path: str | Path) -> bool:
    """Whether a file's name (not its directory) says it holds a test set.

    A name check, not a guarantee: it guards against the common mistake of choosing
    settings on the test set, and cannot know what a file really holds.
    """
    return bool(_TEST_NAME.search(Path(path).name))


@dataclass(frozen=True)
class Setting:
    """One decoding setting of the grid (the ``decode`` config keys of the same names)."""

    beam_size: int
    length_normalization: str
    length_penalty: float


def grid(beam_sizes: list[int], normalizations: list[str], alphas: list[float]) -> list[Setting]:
    """Every distinct setting, in the given order. Greedy search (beam 1), ``"none"`` and
    α 0 rank by raw log-probability whatever the rest says, so each appears once, as
    ``("none", 0.0)``."""
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
    """The best hypothesis' tokens under ``log P / lp(|Y|)`` (``|Y|`` counting EOS); ``[]`` for none."""
    if not hyps:
        return []
    return max(hyps, key=lambda h: h.log_prob / length_penalty(len(h.tokens) + 1, alpha, normalization)).tokens


def tune_decode(model, tokenizer, src_lines: list[str], ref_lines: list[str], decode, device, settings: list[Setting], tokenize: str = "13a") -> list[dict]:
    """Translate ``src_lines`` once per beam size and score every setting against ``ref_lines``.

    Args:
        decode: the checkpoint's :class:`~nmt.config.DecodeConfig` (length limits, batch budget).
        settings: from :func:`grid`.
        tokenize: sacreBLEU's BLEU tokenizer (``nmt tune-decode`` passes the checkpoint's, as
            validation scored it: ``ja-mecab`` for a Japanese target).

    Returns:
        One row per setting, in order: its fields, ``bleu``, ``chrf``, ``length_ratio``
        (hypothesis to reference length, in sacreBLEU's tokens), ``search_s`` (seconds of
        search for that beam size, shared by its rows) and the metrics' signatures.
    """
    rows = []
    for beam in dict.fromkeys(s.beam_size for s in settings):
        start = time.perf_counter()
        results = translate_lines(model, tokenizer, src_lines, replace(decode, beam_size=beam, n_best=beam), device)
        seconds = round(time.perf_counter() - start, 1)
        for s in (s for s in settings if s.beam_size == beam):
            hyps = tokenizer.decode_tgt([rerank(r, s.length_normalization, s.length_penalty) for r in results])
            result = score(hyps, [ref_lines], tokenize=tokenize)
            rows.append({**asdict(s), **{k: result[k] for k in ("bleu", "chrf", "length_ratio")}, "search_s": seconds,
                         **{k: result[k] for k in ("bleu_signature", "chrf_signature")}})
    return rows
