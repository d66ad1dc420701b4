"""Other toolkits' models in and out: ``marian.py`` maps Marian's weights both ways,
``importing.py`` reads a Hugging Face Marian directory into an nmt checkpoint, ``export.py``
writes Hugging Face and CTranslate2 directories and slim checkpoints."""
