"""The one way into decoding (``inference.py``: checkpoints loaded for inference, length-sorted
batched and streaming translation, inference mode, device and dtype owned in one place) and
what it takes from text: ``steering_text.py`` (prefixes, constraints, bans), ``align.py``
(alignments, and unknown pieces copied by them), ``shortlist.py`` (vocabulary shortlists)."""
