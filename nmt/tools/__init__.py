"""Commands over trained models that are neither training nor translation itself: ``tune.py``
(tune-decode), ``info.py`` (what a checkpoint holds), ``average.py`` (checkpoint averaging),
``plot.py`` (metrics and attention), ``profiling.py`` (where the time and memory go)."""
