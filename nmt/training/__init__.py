"""A training run: ``train.py`` runs the Trainer's named steps, ``opening.py`` opens the run
(lock, checkpoint, config, data), ``validation.py`` scores it on its validation sets,
``distributed.py`` keeps ``torchrun``'s processes in agreement."""
