"""Scores out: ``evaluate.py`` (sacreBLEU's BLEU and chrF with their signature, for ``nmt
evaluate`` and validation alike) and ``text_forms.py`` (text that scores otherwise than it reads:
normalisation, invisible characters, escapes)."""
