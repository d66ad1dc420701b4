"""Checkpoints: written atomically, verified on every load, loaded without executing code.

A checkpoint is a zip archive written by ``torch.save``: a dict of tensors, numbers,
strings and containers of them, read with ``torch.load(weights_only=True)``. Every entry
of the archive carries a CRC-32, checked on every load, so a flipped bit or a truncated
file is reported as damaged instead of loading as wrong weights. A checkpoint holds the
model, the resolved config, the tokenizer and the ``nmt`` version that wrote it; one
written by ``nmt train`` also holds the optimizer, schedule and gradient-scaler states,
the step, the sampler's position and every process's RNG states, so that ``nmt train
--resume`` continues exactly where the run stopped.
"""

# Size: module at most 455 lines, check_payload() at most 75: one file format written, verified and
# read (a run directory read as its best.pt, which is checked to be the run's own: nmt.runs.runid);
# check_payload() states each entry's rule once, a few lines each, in the order the file holds them.

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nmt import __version__
from nmt.config import Config, ConfigError, config_from_dict
from nmt.core.model import STATE_LAYERS, STATE_WIDTHS, Transformer, uninitialised_model
from nmt.data.tokenizer import Tokenizer, TokenizerError
from nmt.data.vocab import tokenizer_from_protos
from nmt.errors import NmtError, first_line
from nmt.files import atomic_write

from .progress import Progress
from .runid import warn_if_not_the_runs

# what --resume needs beyond the model
TRAINING_STATE = ("optimizer", "scheduler", "progress", "rng")
# A tokenizer's entries: one SentencePiece model, one per side, or (an imported Marian model's) one
# segmenter per side and the vocabulary that numbers their pieces (nmt.data.vocab).
TOKENIZER_ENTRIES = ({"joint"}, {"src", "tgt"}, {"src", "tgt", "vocab"})


class CheckpointError(NmtError, RuntimeError):
    """A checkpoint is missing, damaged, incomplete, or not one nmt wrote."""


@dataclass
class Checkpoint:
    """A checkpoint read once, which every command shares: ``payload``, the entries ``torch.load``
    read (``model``: the weights, ``config``, ``tokenizer``, ``progress``, and for training the
    optimizer's and the random generators' states; see :func:`check_payload`), and what checking
    them built: ``config``, the :class:`~nmt.config.Config`; ``tokenizer``; :attr:`model`, the
    :class:`~nmt.core.model.Transformer` with the weights, filled on first use (the check built it
    without filling it: no time or memory until then). ``path``: the file read."""

    payload: dict[str, Any]
    path: Path
    config: Config
    tokenizer: Tokenizer
    _model: Transformer = field(repr=False)
    _filled: bool = field(default=False, repr=False)

    @property
    def run(self) -> dict | None:
        """The run that wrote it (its ``run`` entry: id and directory), or None (an older nmt's)."""
        return self.payload.get("run")

    @property
    def model(self) -> Transformer:
        """The model on the CPU in eval mode, its weights those of the checkpoint."""
        if not self._filled:
            self._model.load_state_dict(self.payload["model"])
            self._filled = True
        return self._model.eval()


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    """Write ``payload`` (plus the writing ``nmt`` version) to ``path`` atomically: an
    interruption or a full disk leaves the old file or the new one, never a partial one.

    Raises:
        nmt.files.OutputError: the disk is full or the place is read-only.
    """
    payload = {**payload, "nmt_version": __version__}
    atomic_write(Path(path), lambda f: torch.save(payload, f))


def written_by(payload: dict[str, Any]) -> str:
    """``nmt X`` for the version that wrote ``payload``."""
    version = payload.get("nmt_version")
    return f"nmt {version}" if version else "an nmt version that did not record itself"


def checkpoint_file(path: str | Path) -> Path:
    """The file a checkpoint argument names: ``path`` itself, or a run directory's ``best.pt``.

    Raises:
        CheckpointError: a directory without ``best.pt``: one that has ``last.pt`` (no validation
            has run yet; the message names that file) or one with no checkpoint at all.
    """
    path = Path(path)
    if not path.is_dir():
        return path
    if (path / "best.pt").is_file():
        return path / "best.pt"
    if (path / "last.pt").is_file():
        raise CheckpointError(
            f"{path} has no best.pt (no validation has run yet); pass --checkpoint "
            f"{path / 'last.pt'} (its latest weights),"
            f" or train on until a validation: nmt train --run-dir {path} --resume"
        )
    raise CheckpointError(
        f"{path} is a directory with no nmt checkpoint (no best.pt or last.pt); give a run "
        "directory of nmt train or a .pt file"
    )


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", training: bool = False
) -> Checkpoint:
    """Load and verify a checkpoint written by :func:`save_checkpoint`: its config parsed, its
    tokenizer loaded and its model built once, into one :class:`Checkpoint`.

    ``path`` may be a run directory (its ``best.pt``; a warning says where that is another run's).
    With ``training``, the checkpoint must also hold the training state ``--resume`` needs.

    Raises:
        CheckpointError: the file does not exist, is not an nmt checkpoint (the message
            says what it looks like), is damaged (``damaged checkpoint: FILE``), or lacks
            entries.
    """
    path, given = checkpoint_file(path), Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found")
    _verify_archive(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for foreign archives
        # torch's advice (weights_only=False) would run arbitrary code
        if "weights_only" in str(exc):
            raise CheckpointError(
                f"{path} is not an nmt checkpoint: it holds objects other than tensors and plain "
                "values (not written by nmt)"
            ) from None
        raise CheckpointError(
            f"{path} is not an nmt checkpoint: a zip archive torch cannot read ({first_line(exc)})"
        ) from None
    checkpoint = check_payload(payload, path, training)
    if path != given:  # the run directory's best.pt: another run's is named
        warn_if_not_the_runs(given, path, checkpoint.run)
    return checkpoint


def _verify_archive(path: Path) -> None:
    """Check that ``path`` is a zip archive whose every entry matches its CRC-32."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head.startswith(b"PK\x03\x04"):
        raise CheckpointError(f"{path} is not an nmt checkpoint: it is {describe_file(path, head)}")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    # a damaged directory surfaces as many types (BadZipFile, zlib.error, RuntimeError "encrypted",
    # ...)
    except Exception as exc:
        size = path.stat().st_size
        raise CheckpointError(
            f"damaged checkpoint: {path} ({first_line(exc)}; {size:,} bytes, probably truncated "
            "or overwritten)"
        ) from None
    if bad is not None:
        raise CheckpointError(
            f"damaged checkpoint: {path} (entry {bad} does not match its checksum: the file "
            "changed after it was written)"
        )


def describe_file(path: Path, head: bytes) -> str:
    """What a file that is not a zip archive looks like, in words: empty, a SentencePiece
    model, YAML, text, gzip, a legacy PyTorch pickle, or binary data."""
    if not head:
        return "an empty file"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip file"
    if head[:1] == b"\x80":
        return "a pickle (a PyTorch file in the legacy format, not written by nmt)"
    if path.stat().st_size < 64 << 20:
        import sentencepiece as spm

        try:
            spm.SentencePieceProcessor(model_proto=path.read_bytes())
            return "a SentencePiece model (a tokenizer; give it as tokenizer.model)"
        except Exception:  # not a SentencePiece model: SentencePiece says so in several ways
            pass
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not only a character cut at the end of the sample
            return "binary data, not a zip archive"
        text = head[: exc.start].decode("utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0][:60] if lines else ""
    if lines and all(":" in line or line.lstrip().startswith(("#", "-")) for line in lines[:5]):
        return f"YAML text (first line {first!r}; a config file? give it with --config)"
    return f"a text file (first line {first!r})"


def check_payload(payload: Any, path: Path, training: bool = False) -> Checkpoint:
    """Check the entries every nmt checkpoint has (and, with ``training``, the training state);
    the :class:`Checkpoint` of what the checks parsed and built.

    Raises:
        CheckpointError: an entry is missing or of the wrong type; the message names it
            and the nmt version that wrote the file.
    """
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"{path} is not an nmt checkpoint: it holds a {type(payload).__name__}, not a dict of "
            "entries"
        )
    missing = [k for k in ("model", "config", "tokenizer") if k not in payload]
    # nothing of nmt's: another program's file
    if len(missing) == 3 and "nmt_version" not in payload:
        keys = ", ".join(map(repr, list(payload)[:5])) or "none"
        raise CheckpointError(
            f"{path} is not an nmt checkpoint: a dict without nmt's model, config and tokenizer "
            f"entries (its keys: {keys})"
        )
    if missing:
        raise CheckpointError(
            f"{path} is not an nmt checkpoint or is incomplete: no {', '.join(missing)} entry "
            f"(written by {written_by(payload)})"
        )
    problems = []
    if not isinstance(payload["model"], dict) or not all(
        isinstance(v, torch.Tensor) for v in payload["model"].values()
    ):
        problems.append("'model' is not a dict of tensors")
    if not isinstance(payload["config"], dict):
        problems.append("'config' is not a dict")
    tok = payload["tokenizer"]
    if (
        not isinstance(tok, dict)
        or set(tok) not in TOKENIZER_ENTRIES
        or not all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in tok.values())
    ):
        problems.append(
            "'tokenizer' is not the serialized SentencePiece model(s) nmt stores (joint; src and "
            "tgt; or src, tgt and vocab)"
        )
    problems += _entry_problems(payload, training)
    if problems:
        raise CheckpointError(
            f"{path}: inconsistent checkpoint: {'; '.join(problems)} (written by "
            f"{written_by(payload)})"
        )
    cfg = _config(payload, path)
    tokenizer = _check_tokenizer(payload, cfg, path)
    wrong = size_mismatches(cfg.model, payload["model"], STATE_LAYERS, STATE_WIDTHS)
    if wrong:
        raise CheckpointError(
            f"{path}: the tensors do not fit the model its config describes ({'; '.join(wrong)}; "
            f"written by {written_by(payload)})"
        )
    model = uninitialised_model(cfg.model)  # names and shapes now; the weights fill it on first use
    check_state_fits(model.state_dict(), payload["model"], path, written_by(payload))
    seen: set[tuple[int, int]] = set()  # tied weights (one matrix under two names) are named once
    broken = []
    for name, t in payload["model"].items():
        where = (t.untyped_storage().data_ptr(), t.storage_offset())
        if t.is_floating_point() and where not in seen and not bool(torch.isfinite(t).all()):
            broken.append(name)
        seen.add(where)
    if broken:
        raise CheckpointError(
            f"{path}: {len(broken)} weight tensor(s) hold nan or inf "
            f"({', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}): "
            "the training diverged before this checkpoint was written; use an earlier one, or "
            "train again with a lower train.lr_scale"
        )
    if training:
        absent = [k for k in TRAINING_STATE if k not in payload]
        if absent:
            origin = " (an nmt average output)" if "averaged_from" in payload else ""
            raise CheckpointError(
                f"{path} holds no training state{origin}: no {', '.join(absent)} entry (written by "
                f"{written_by(payload)}); "
                "--resume needs a checkpoint nmt train wrote (last.pt, best.pt or step_N.pt)"
            )
    return Checkpoint(payload, path, cfg, tokenizer, model)


#: Entries some checkpoints hold, and the type each must have where present.
_ENTRY_TYPES = {
    "progress": dict,
    "optimizer": dict,
    "scheduler": dict,
    "rng": (dict, list),
    "run": dict,
    "averaged_from": list,
    "imported_from": dict,
    "init_from": dict,
}


def _entry_problems(payload: dict[str, Any], training: bool = False) -> list[str]:
    """What is wrong with the optional entries (of the wrong type; ``progress`` with fields that are
    not whole numbers or, for ``best_bleu``, a number), each in words. A ``progress`` field this
    version does not know (a newer nmt's) matters only to ``training`` (``--resume``), which would
    have to continue it."""
    problems = [
        f"{key!r} is a {type(payload[key]).__name__}, not a "
        f"{getattr(kind, '__name__', 'dict or list')}"
        for key, kind in _ENTRY_TYPES.items()
        if key in payload and not isinstance(payload[key], kind)
    ]
    progress = payload.get("progress")
    if isinstance(progress, dict):
        known = set(Progress.__dataclass_fields__)
        for key, value in progress.items():
            number = (int, float) if key == "best_bleu" else int
            if key not in known:
                if training:
                    problems.append(
                        f"'progress' has {key!r}, which this nmt does not know (a newer nmt wrote "
                        "it?)"
                    )
            elif key != "batching" and (isinstance(value, bool) or not isinstance(value, number)):
                problems.append(f"'progress' has {key!r}: {value!r}")
    return problems


def _config(payload: dict[str, Any], path: Path):
    raw = payload["config"]
    decode = raw.get("decode") if isinstance(raw, dict) else None
    if isinstance(decode, dict) and "patience" not in decode:
        # Written before decode.patience existed: its search ended a sentence once beam_size
        # hypotheses had finished, and its α was chosen under that rule (--patience 0: exact).
        raw = {**raw, "decode": {**decode, "patience": 1.0}}
    try:
        return config_from_dict(raw)  # the message below names the file
    except ConfigError as exc:
        raise CheckpointError(
            f"{path}: inconsistent checkpoint: {exc} (written by {written_by(payload)})"
        ) from None


def _check_tokenizer(payload: dict[str, Any], cfg, path: Path):
    """The stored tokenizer, checked: it loads as SentencePiece and its vocabularies are the
    model's.

    Raises:
        CheckpointError: naming what is wrong and the version that wrote the file.
    """
    try:
        tokenizer = tokenizer_from_protos(tokenizer_from_tensors(payload["tokenizer"]))
    except TokenizerError as exc:
        raise CheckpointError(
            f"{path}: inconsistent checkpoint: {exc} (written by {written_by(payload)})"
        ) from None
    sizes = (tokenizer.src.get_piece_size(), tokenizer.tgt.get_piece_size())
    if sizes != (cfg.model.src_vocab_size, cfg.model.tgt_vocab_size):
        raise CheckpointError(
            f"{path}: inconsistent checkpoint: its tokenizer has {sizes[0]} source and {sizes[1]} "
            "target pieces, its model "
            f"{cfg.model.src_vocab_size} and {cfg.model.tgt_vocab_size} (written by "
            f"{written_by(payload)})"
        )
    return tokenizer


def size_mismatches(
    model_cfg: Any,
    state: dict[str, Any],
    layers: dict[str, str],
    widths: dict[str, tuple[str, int]],
    config: str = "the config",
) -> list[str]:
    """The sizes of ``model_cfg`` (layer counts, widths) larger than the tensors of ``state`` show,
    as ``"model.d_model 1048576 in the config vs 128 in the tensors"``; empty when none is.

    Run before anything of the config's size is built: a damaged or hand-edited config (``d_model``
    2^20, 10^9 layers) would otherwise allocate terabytes or loop for ever before the tensors could
    say it is wrong. A size at most the tensors' is safe to build, and left to the full comparison
    of names and shapes after, which names the tensors; so is a width whose tensor is absent.

    Args:
        layers: size key -> a regular expression whose group 1 is a layer's index in a tensor name.
        widths: size key -> (tensor name, dimension) that shows it.
        config: how the messages name where the config came from.
    """
    shown: dict[str, int] = {}
    for key, pattern in layers.items():
        found = [int(match[1]) for name in state if (match := re.match(pattern, str(name)))]
        shown[key] = max(found) + 1 if found else 0
    for key, (name, dim) in widths.items():
        tensor = state.get(name)
        if isinstance(tensor, torch.Tensor) and tensor.dim() > dim:
            shown[key] = int(tensor.shape[dim])
    return [
        f"model.{key} {getattr(model_cfg, key)} in {config} vs {value} in the tensors"
        for key, value in shown.items()
        if getattr(model_cfg, key) > value
    ]


def check_state_fits(
    expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], path: Path, writer: str
) -> None:
    """Raise :class:`CheckpointError` naming every tensor of ``state`` that does not fit
    ``expected``."""

    def listed(names: list[str]) -> str:
        return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")

    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    parts = [
        f"{label}: {listed(names)}"
        for label, names in (
            ("unexpected", unexpected),
            ("missing", missing),
            ("shape in file vs config", shapes),
        )
        if names
    ]
    if parts:
        raise CheckpointError(
            f"{path}: the tensors do not fit the model its config describes ({'; '.join(parts)}; "
            f"written by {writer})"
        )


def tokenizer_to_tensors(protos: dict[str, bytes]) -> dict[str, torch.Tensor]:
    """SentencePiece model protos (and a vocabulary's JSON) as uint8 tensors (a checkpoint holds
    only tensors and plain values)."""
    return {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in protos.items()}


def tokenizer_from_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """The inverse of :func:`tokenizer_to_tensors`."""
    return {k: bytes(v.numpy().tobytes()) for k, v in tensors.items()}
