"""What a run directory holds and how it is read back: ``checkpoint.py`` (a checkpoint read
once into one value, written atomically), ``progress.py`` (where a run stands, its random
generators), ``runid.py`` (which run a checkpoint is), ``rundir.py`` (the directory: its lock,
its config, the checkpoint to resume from)."""
