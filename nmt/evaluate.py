"""Corpus-level BLEU and chrF through sacreBLEU (Post 2018), with their signatures.

The one scoring path used both for validation during training and by ``nmt evaluate``.
"""

from __future__ import annotations

import logging
import unicodedata

from sacrebleu.metrics import BLEU, CHRF


log = logging.getLogger("nmt.evaluate")


class EvaluationError(ValueError):
    """Hypotheses and references cannot be scored together."""


def normalisation_forms(lines: list[str]) -> set[str]:
    """The Unicode normalisation forms (of NFC and NFD) that every line is in; ASCII is in both."""
    return {form for form in ("NFC", "NFD") if all(unicodedata.is_normalized(form, line) for line in lines)}


def warn_if_normalisation_differs(hypotheses: list[str], references: list[list[str]], names: tuple[str, ...]) -> None:
    """Log a warning when the hypotheses and a reference stream share no normalisation form:
    sacreBLEU compares code points, so ``é`` as one code point (NFC) and as ``e`` plus a
    combining accent (NFD) count as different text."""
    hyp_forms = normalisation_forms(hypotheses)
    for name, ref in zip(names, references):
        ref_forms = normalisation_forms(ref)
        if not hyp_forms & ref_forms:
            log.warning(
                "the hypotheses are in %s but %s is in %s (Unicode normalisation): the same text scores as different; "
                "normalise both to one form first (unicodedata.normalize('NFC', line) in Python, or uconv -x any-nfc)",
                _describe(hyp_forms), name, _describe(ref_forms),
            )


def _describe(forms: set[str]) -> str:
    return " and ".join(sorted(forms)) or "a mix of forms"


def score(hypotheses: list[str], references: list[list[str]], names: tuple[str, ...] | None = None) -> dict:
    """Score detokenized ``hypotheses`` against one or more reference streams.

    Args:
        hypotheses: one line per sentence.
        references: a list of reference streams, each with one line per hypothesis.
        names: a label for each stream (file names) used in error messages.

    Returns:
        ``{"bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_detail", "sentences"}``;
        scores are on sacreBLEU's 0-100 scale.

    Raises:
        EvaluationError: there are no hypotheses, or a reference stream's line count
            differs from the hypotheses' (sacreBLEU alone does not check this).
    """
    names = names or tuple(f"reference {i + 1}" for i in range(len(references)))
    if not references:
        raise EvaluationError("no reference given")
    if not hypotheses:
        raise EvaluationError("nothing to score: there are no hypothesis lines")
    for name, ref in zip(names, references):
        if len(ref) != len(hypotheses):
            raise EvaluationError(f"{name} has {len(ref)} lines but there are {len(hypotheses)} hypotheses; they must match line for line")
    warn_if_normalisation_differs(hypotheses, references, names)
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, references)
    c = chrf.corpus_score(hypotheses, references)
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "sentences": len(hypotheses),
    }
