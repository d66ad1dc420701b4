"""Corpus-level BLEU and chrF through sacreBLEU (Post 2018), with their signatures.

The one scoring path used both for validation during training and by ``nmt evaluate``.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF


class EvaluationError(ValueError):
    """Hypotheses and references cannot be scored together."""


def score(hypotheses: list[str], references: list[list[str]], names: tuple[str, ...] | None = None) -> dict:
    """Score detokenized ``hypotheses`` against one or more reference streams.

    Args:
        hypotheses: one line per sentence.
        references: a list of reference streams, each with one line per hypothesis.
        names: a label for each stream (file names) used in error messages.

    Returns:
        ``{"bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_detail", "length_ratio",
        "sentences"}``; scores are on sacreBLEU's 0-100 scale, ``length_ratio`` is the
        hypotheses' length over the references' in BLEU's tokens (below 1: brevity penalty).

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
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, references)
    c = chrf.corpus_score(hypotheses, references)
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "length_ratio": round(b.sys_len / b.ref_len, 3) if b.ref_len else 0.0,
        "sentences": len(hypotheses),
    }
