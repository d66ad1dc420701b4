"""Text in: ``corpus.py`` (reading, streaming), ``clean.py`` (cleaning rules and counts),
``tokenizer.py`` and ``vocab.py`` (SentencePiece; Marian's vocabulary), ``encoded.py`` (the
Arrow id cache), ``overlap.py`` (duplicates, validation inside training), ``subwords.py``
(subword regularisation), ``multilingual.py`` (several directions)."""
