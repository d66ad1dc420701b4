"""A run directory's lifecycle: one writer at a time, a fresh start or a resume, one history.

* **Lock.** ``nmt train`` holds an exclusive ``flock`` on ``RUN/.lock`` for as long as it
  runs; a second ``nmt train`` on the same directory is refused. The kernel drops the lock
  when the process ends, however it ends, so a killed run never leaves it stuck.
* **Fresh start.** Refused when the directory holds a checkpoint (``last.pt``, ``best.pt``,
  ``step_N.pt``). A run killed before its first checkpoint left only logs: a fresh start
  replaces them (once its data is prepared: a failure leaves them as they were).
* **Resume.** From the newest complete checkpoint that holds the training state (by step;
  a damaged one is skipped with a warning). Records and step checkpoints newer than it
  belong to an abandoned history and are removed, so ``metrics.jsonl`` describes one run.
* **One run.** ``run.json`` records the run the directory holds (:mod:`nmt.runs.runid`); a resume is
  refused where a checkpoint there is another run's.
* **Sweep.** Temporary files that killed writers left (``.last.pt.tmpPID-TOKEN``) are removed
  at the start of every run; those of writers still at work (``nmt average --out RUN/avg.pt``,
  ``nmt translate -o RUN/hyp.txt``) are left to them
  (:func:`nmt.temporaries.remove_abandoned_temporaries`).
"""

# Size: module at most 540 lines: one run directory's lifecycle: lock, fresh start or resume, and
# one history.

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from dataclasses import replace
from pathlib import Path

from nmt.config import (
    PRESETS,
    Config,
    ConfigError,
    config_from_dict,
    config_to_dict,
    load_config,
    read_config_file,
)
from nmt.errors import Key
from nmt.files import METRICS, RUN_FILE, OutputError, append_line, atomic_write, reason

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .runid import not_the_runs, peek, record_run, run_checkpoints, step_checkpoints

log = logging.getLogger("nmt.train")

try:  # POSIX
    import fcntl
except ImportError:  # Windows: msvcrt's byte-range locks do the same job
    fcntl = None


def check_config_outside(run_dir: Path, config_file: Path | None) -> None:
    """Refuse a fresh run given its own directory's ``config.yaml`` as ``--config``: the run
    replaces that file with its resolved configuration, and the user's comments and layout would be
    lost.

    Raises:
        ConfigError: ``config_file`` is (by any name or link) ``run_dir/config.yaml``.
    """
    written = run_dir / "config.yaml"
    if (
        config_file is not None
        and written.exists()
        and Path(config_file).exists()
        and written.samefile(config_file)
    ):
        raise ConfigError(
            Key("config"),
            f" {config_file} is the run's own config.yaml, which a run replaces with its resolved "
            "configuration; keep it outside ",
            Key("train.run_dir"),
        )


class RunDir:
    """The run directory ``path``, locked by this process from :meth:`lock` to :meth:`release`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock_file = None
        self.created: list[Path] = []  # directories this process made for the run, itself first

    def lock(self, resuming: bool = False, inputs: tuple[Path, ...] = ()) -> None:
        """Create the directory if needed (unless ``resuming``) and take its lock.

        Raises:
            ConfigError: ``path`` is a file, is missing while ``resuming``, or another process holds
                the lock.
            nmt.files.OutputError: the directory cannot be written (read-only, full).
        """
        if resuming and not self.path.is_dir():
            raise ConfigError(
                f"--resume: {self.path} does not exist; start a fresh run instead (without "
                "--resume)"
            )
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(Key("train.run_dir"), f" {self.path} is a file; choose a directory")
        if not resuming:
            self._check_not_foreign(inputs)
        try:
            self.created = [p for p in (self.path, *self.path.parents) if not p.exists()]
            self.path.mkdir(parents=True, exist_ok=True)
            self.lock_file = open(self.path / ".lock", "a+")
        except OSError as exc:
            raise OutputError(
                f"cannot write to the run directory {self.path}: {reason(exc)}"
            ) from None
        if not _try_lock(self.lock_file):
            self.lock_file.seek(0)
            holder = self.lock_file.read().strip() or "unknown"
            self.lock_file.close()
            self.lock_file = None
            raise ConfigError(
                f"{self.path} is in use by another nmt train (pid {holder}); wait for it to end or "
                "choose another ",
                Key("train.run_dir"),
            ) from None
        self.lock_file.truncate(0)
        self.lock_file.write(f"{os.getpid()}\n")
        self.lock_file.flush()

    def _check_not_foreign(self, inputs: tuple[Path, ...] = ()) -> None:
        """Refuse a directory no run has used (no ``.lock``, no checkpoint) that holds files of the
        names a run writes (``config.yaml``, ``metrics.jsonl``, ``spm.model``): a fresh run would
        replace them. Files the run reads (``inputs``: a tokenizer given as ``tokenizer.model``) are
        the user's to keep there.

        Raises:
            ConfigError: naming those files.
        """
        if not self.path.is_dir() or (self.path / ".lock").exists() or self.checkpoints():
            return  # a run's, or one copied without its .lock: check_fresh names its checkpoints
        given = [Path(p) for p in inputs if Path(p).exists()]
        theirs = sorted(
            p.name
            for p in self.path.iterdir()
            if RUN_FILE.fullmatch(p.name) and not any(p.samefile(g) for g in given)
        )
        if theirs:
            why = (
                f" {self.path} is not a run directory (no .lock) but holds {', '.join(theirs)}, "
                "which a run writes and would replace"
            )
            raise ConfigError(Key("train.run_dir"), why + "; choose a new or empty directory")

    def release(self) -> None:
        """Drop the lock; remove the directory again if this process created it and wrote nothing
        else, and the directories above it that it made for it (``runs/new/r``: ``runs/new`` too).

        The lock file itself stays: deleting it would let a process that opened it
        before the deletion and one that creates a new one hold "the" lock together.
        """
        if self.lock_file is None:
            return
        # A directory deleted or made unreadable under the run is not release's to report: the
        # error that stopped the run (a checkpoint or record that could not be written) says so.
        with contextlib.suppress(OSError):
            if self.created and [p.name for p in self.path.iterdir()] == [".lock"]:
                (self.path / ".lock").unlink()
                for directory in self.created:  # each now empty, unless another writer filled it
                    directory.rmdir()
        self.lock_file.close()
        self.lock_file = None

    def checkpoints(self) -> list[Path]:
        """``last.pt``, ``best.pt`` (those that exist) and the ``step_N.pt`` files, oldest step
        first."""
        return run_checkpoints(self.path)

    def check_fresh(self) -> None:
        """Refuse a fresh run where a checkpoint exists (nothing is changed).

        Raises:
            ConfigError: the directory holds checkpoints.
        """
        existing = sorted(p.name for p in self.checkpoints())
        if existing:
            raise ConfigError(
                f"{self.path} already holds a run ({', '.join(existing)}); pass --resume to "
                "continue it or choose another ",
                Key("train.run_dir"),
            )

    def newest_checkpoint(self) -> tuple[Path, Checkpoint]:
        """The newest complete checkpoint with training state, loaded; a damaged one is skipped with
        a warning.

        Raises:
            ConfigError: there is no checkpoint, or one is another run's (:meth:`_check_one_run`).
            nmt.runs.checkpoint.CheckpointError: no checkpoint is usable (the newest one's reason).
        """
        order = {"last.pt": 2, "best.pt": 0}
        peeks = {path: peek(path) for path in self.checkpoints()}
        if not peeks:
            raise ConfigError(
                f"--resume: {self.path} holds no checkpoint (the run stopped before its first one, "
                "or never started); run without --resume to start afresh"
            )
        self._check_one_run(peeks)
        steps = {path: step for path, (step, _) in peeks.items()}
        first_error = None
        # unreadable: named now, whatever a readable one holds
        for path in [path for path, step in steps.items() if step < 0]:
            try:
                load_checkpoint(path, training=True)
            except CheckpointError as exc:
                log.warning("warning: skipping %s: %s", path, exc)
                first_error = first_error or exc
                del steps[path]
        for path in sorted(steps, key=lambda p: (steps[p], order.get(p.name, 1)), reverse=True):
            try:
                return path, load_checkpoint(path, training=True)
            except CheckpointError as exc:
                log.warning("warning: skipping %s: %s", path, exc)
                first_error = first_error or exc
        raise first_error

    def _check_one_run(self, peeks: dict[Path, tuple[int, dict | None]]) -> None:
        """Refuse to resume where a checkpoint of the directory (``peeks``: each one's step and run)
        is another run's (a ``best.pt`` or ``last.pt`` copied in from elsewhere): its steps would
        be appended to this run's records, or ``best.pt`` would stay the other run's.

        Raises:
            ConfigError: naming the checkpoint, what says it is another run's and what to do.
        """
        for path, (_, run) in peeks.items():
            why = not_the_runs(self.path, path, run)
            if why:
                raise ConfigError(
                    f"--resume: {why}; move the other run's checkpoint out of {self.path}, or "
                    "resume that run in a directory of its own"
                )

    def hold(self, run: dict | None) -> dict:
        """Record ``run`` (the resumed checkpoint's ``run`` entry; None: a new run's, drawn here) as
        the run this directory holds (:func:`nmt.runs.runid.record_run`), and return it."""
        run = run or {"id": uuid.uuid4().hex, "dir": str(self.path)}
        record_run(self.path, run)
        return run

    def keep_history_until(self, step: int) -> None:
        """Remove metrics records and step checkpoints after ``step``: an abandoned history, or
        (``step`` 0) the logs of a run stopped before its first checkpoint."""
        for path in step_checkpoints(self.path):
            if int(path.stem[5:]) > step:
                log.info("removing %s: written after the checkpoint this run resumes from", path)
                path.unlink()
        metrics = self.path / METRICS
        if not metrics.is_file():
            return
        # bytes: a damaged line is dropped, never a reason to fail
        lines = metrics.read_bytes().splitlines()
        kept = [line for line in lines if _record_step(line) <= step]
        if len(kept) < len(lines):
            log.info(
                "%s: dropping %d records after step %d (not in the history this run continues)",
                metrics,
                len(lines) - len(kept),
                step,
            )
            atomic_write(metrics, b"".join(line + b"\n" for line in kept))

    def last_validation(self) -> dict | None:
        """The newest validation record of ``metrics.jsonl`` (one with ``bleu``), or None."""
        metrics = self.path / METRICS
        lines = metrics.read_bytes().splitlines() if metrics.is_file() else []
        for line in reversed(lines):
            # a line cut by a kill mid-write, or edited by hand
            if _record_step(line) == _NOT_A_RECORD:
                continue
            record = json.loads(line)
            if isinstance(record.get("bleu"), (int, float)):
                return record
        return None

    def record(self, values: dict) -> None:
        """Append ``values`` to ``metrics.jsonl`` as one JSON line."""
        append_line(self.path / METRICS, json.dumps(values))

    def tensorboard(self, step: int):
        """A TensorBoard writer under ``tensorboard/`` that hides events after ``step`` (an
        abandoned history); None without the package."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.info(
                "tensorboard is not installed: no TensorBoard scalars (metrics.jsonl has them all)"
            )
            return None
        return SummaryWriter(str(self.path / "tensorboard"), purge_step=step + 1)


def _try_lock(f) -> bool:
    """Take an exclusive lock on the open file ``f`` without waiting: False if another process holds
    one.

    ``flock`` on POSIX systems, ``msvcrt.locking`` of the first byte on Windows; the operating
    system drops either when the process ends. Where neither exists, the run goes on unlocked,
    with a warning.
    """
    if fcntl is not None:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:  # a file system without locks (some NFS or FUSE mounts)
            log.warning(
                "warning: %s cannot be locked (%s): nothing stops a second nmt train in %s",
                f.name,
                exc.strerror,
                Path(f.name).parent,
            )
        return True
    try:
        import msvcrt
    except ImportError:
        log.warning(
            "warning: this system offers no file locking: nothing stops a second nmt train in %s",
            Path(f.name).parent,
        )
        return True
    f.seek(0)
    try:
        msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


# the "step" of a line that is not a record: after every history, so never kept
_NOT_A_RECORD = 1 << 62


def _record_step(line: bytes) -> int:
    """The step of one ``metrics.jsonl`` line, or :data:`_NOT_A_RECORD` for a line that is not an
    object with an integer step (cut by a kill mid-write, not UTF-8, edited by hand)."""
    try:
        record = json.loads(line)
    except ValueError:  # UnicodeDecodeError is one
        return _NOT_A_RECORD
    step = record.get("step") if isinstance(record, dict) else None
    return (
        step
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < _NOT_A_RECORD
        else _NOT_A_RECORD
    )


def absolute_paths(cfg: Config) -> Config:
    """``cfg`` with relative file and directory names made absolute, so a run resumes from any
    directory."""

    def absolute(value):
        return os.path.abspath(value) if value else value

    d, t = cfg.data, cfg.tokenizer
    data = {
        k: absolute(getattr(d, k))
        for k in ("dir", "train_src", "train_tgt", "valid_src", "valid_tgt", "cache_dir")
    }
    if d.hf_data_files:
        data["hf_data_files"] = {
            k: absolute(v) if os.path.exists(v) else v for k, v in d.hf_data_files.items()
        }
    if d.hf_dataset and os.path.exists(d.hf_dataset):  # a local dataset directory, not a hub name
        data["hf_dataset"] = absolute(d.hf_dataset)
    tok = {k: absolute(getattr(t, k)) for k in ("model", "src_model", "tgt_model")}
    return replace(
        cfg,
        data=replace(d, **data),
        tokenizer=replace(t, **tok),
        train=replace(cfg.train, run_dir=absolute(cfg.train.run_dir)),
    )


def resume_config(
    saved: dict, overrides: list[str], config_file: Path | None, source: Path
) -> Config:
    """The saved config with each key written in ``config_file`` or set by ``overrides`` taken
    from the config they give, where it differs from the saved value.

    Giving the command that started the run again changes nothing: only values that differ count.

    Raises:
        ConfigError: a change to the model or tokenizer (a new run is needed for those).
    """
    raw = {section: dict(values) for section, values in saved.items()}
    given = config_to_dict(absolute_paths(load_config(config_file, overrides)))
    changes = [
        key
        for key in _written_keys(overrides, config_file)
        if given[key[0]][key[1]] != raw[key[0]].get(key[1])
    ]
    # directions: the tokenizer's tags
    fixed = [
        f"{s}.{k}"
        for s, k in changes
        if s in ("model", "tokenizer") or (s, k) == ("data", "directions")
    ]
    if fixed:
        raise ConfigError(
            f"--resume cannot change the model or tokenizer of a run ({', '.join(fixed)}); start a "
            "new run instead"
        )
    for section, name in changes:
        log.info(
            "--resume: %s.%s = %r (was %r)",
            section,
            name,
            given[section][name],
            raw[section].get(name),
        )
        raw[section][name] = given[section][name]
    return absolute_paths(config_from_dict(raw, f"{source} with the changes given"))


#: Model keys a run started from a checkpoint may change: regularisation, a training setting, not
#: architecture.
REGULARISATION = (
    "model.dropout",
    "model.attention_dropout",
    "model.activation_dropout",
    "tokenizer.subword_alpha",
)


def _written_keys(overrides: list[str], config_file: Path | None) -> list[tuple[str, str]]:
    """The ``(section, key)`` pairs a config file writes and the ``--set`` overrides set, in order,
    once each."""
    # read as load_config reads it (a pipe: once)
    written = read_config_file(config_file)[0] if config_file is not None else {}
    keys = [(s, k) for s, values in written.items() for k in values or {}]
    keys += [tuple(o.split("=", 1)[0].strip().split(".", 1)) for o in overrides]
    return list(dict.fromkeys(keys))


# what a run translates between: one pair, or directions
LANGUAGE_KEYS = ("src_lang", "tgt_lang", "directions")


def init_config(
    saved: dict, cfg: Config, overrides: list[str], config_file: Path | None, source: Path
) -> Config:
    """The config of a new run that starts from the checkpoint ``source`` (``nmt train
    --init-from``), whose config is ``saved``.

    ``cfg`` (the config file and ``--set``, as for any new run) gives the data, training, scoring
    and run settings; the model and the tokenizer are the checkpoint's, except the
    :data:`REGULARISATION` keys written in ``config_file`` or ``overrides``; the decode settings are
    the checkpoint's but for the keys written, and so are the languages (``src_lang``/``tgt_lang``
    or ``directions``, which pick the BLEU tokenizer and the tags) unless one of them is written.

    Raises:
        ConfigError: a key written in the model (a preset counts as its keys) or tokenizer section
            asks for another value than the checkpoint's, naming the key.
    """
    given = config_to_dict(absolute_paths(cfg))
    saved = config_to_dict(config_from_dict(saved, str(source)))  # every key, old checkpoints' too
    raw = {section: dict(values) for section, values in given.items()} | {
        section: dict(saved[section]) for section in ("model", "tokenizer", "decode")
    }
    written = _written_keys(overrides, config_file)
    # The languages (src_lang and tgt_lang, or directions) come whole from one side: the
    # checkpoint's unless any is written.
    languages = (
        given
        if any(section == "data" and key in LANGUAGE_KEYS for section, key in written)
        else saved
    )
    raw["data"] = {k: v for k, v in raw["data"].items() if k not in LANGUAGE_KEYS} | {
        k: languages["data"][k] for k in LANGUAGE_KEYS if k in languages["data"]
    }

    def keep(section: str, key: str, preset: str | None = None) -> None:
        """A written model or tokenizer value (or one the written ``preset`` sets): a regularisation
        value is taken, any other must be the checkpoint's."""
        if key == "preset":
            return
        if f"{section}.{key}" in REGULARISATION:
            raw[section][key] = given[section][key]
        elif given[section][key] != saved[section][key]:
            named = (
                [
                    Key("model.preset"),
                    f" {preset} sets {section}.{key} {given[section][key]!r}, which",
                ]
                if preset
                else [Key(f"{section}.{key}"), f" {given[section][key]!r}"]
            )
            raise ConfigError(
                "--init-from ",
                str(source),
                ": ",
                *named,
                f" differs from the checkpoint's {saved[section][key]!r}; the "
                f"{'architecture' if section == 'model' else 'tokenizer'} comes "
                "from the checkpoint (leave it out of the config; only "
                + ", ".join(REGULARISATION)
                + " may change)",
            )

    for section, key in written:
        if key not in given.get(section, {}) or (section == "data" and key in LANGUAGE_KEYS):
            continue
        if section in ("data", "decode"):
            raw[section][key] = given[section][key]
        elif section in ("model", "tokenizer"):
            keep(section, key)
            for preset_key in (
                PRESETS.get(given["model"]["preset"], {})
                if (section, key) == ("model", "preset")
                else ()
            ):
                keep("model", preset_key, given["model"]["preset"])
    return absolute_paths(config_from_dict(raw, f"{source} with the changes given"))
