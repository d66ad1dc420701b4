"""``nmt train``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from nmt.config import TrainConfig, load_config
from nmt.fields import as_written

from .options import Quiet, setup_logging


def train(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML config (sections model, data, tokenizer, train, decode, eval).",
        ),
    ] = None,
    set_: Annotated[
        list[str],
        typer.Option(
            "--set",
            metavar="SECTION.KEY=VALUE",
            help="Override a config value: section.key=value, e.g. train.max_steps=2000 "
            "(repeatable); read as the config file's values are.",
        ),
    ] = [],
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            help="Run directory for checkpoints, tokenizer and logs (as --set train.run_dir=..., "
            "but read literally: the shell has expanded its variables, and a $ left is a $).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in the run directory from its newest checkpoint (config comes "
            "from the checkpoint; --set, and keys written in "
            "--config, may change all but model and tokenizer).",
        ),
    ] = False,
    init_from: Annotated[
        Path | None,
        typer.Option(
            "--init-from",
            metavar="CHECKPOINT",
            help="Start a new run from this checkpoint's weights and tokenizer (fine-tuning): an "
            "nmt checkpoint, a slim "
            "export, an average or an imported model (nmt import). Its model and tokenizer are "
            "kept (the config may change only model.dropout, "
            "model.attention_dropout, model.activation_dropout, tokenizer.subword_alpha); Adam, "
            "the schedule and the step counter start afresh "
            "(--set train.reset_optimizer=false keeps Adam's moments).",
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Train a SentencePiece tokenizer and a Transformer (or fine-tune a checkpoint's, --init-from),
    validating and checkpointing as it goes."""
    from nmt.runs.rundir import check_config_outside
    from nmt.runtime.device import resolve_device
    from nmt.training.train import train as run_training

    setup_logging(quiet)
    # The run directory as quoted text, so that no character of a path reads as YAML, and its $ as
    # a config writes the text $: the shell has expanded the variables of the path it gave.
    written = as_written({"run_dir": str(run_dir)}, TrainConfig) if run_dir else {}
    overrides = (
        list(set_)
        + [f"train.run_dir={json.dumps(path)}" for path in written.values()]
        + (["train.progress_bar=false"] if quiet else [])
    )
    # SIGTERM (kill, timeout, schedulers) stops the data preparation as Ctrl-C does; the
    # training loop installs its own handler, which saves last.pt first.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cfg = load_config(config, overrides)
        if not resume:
            check_config_outside(Path(cfg.train.run_dir), config)
        resolve_device(cfg.train.device, "train.device")  # now, not after the tokenizer is trained
        result = run_training(
            cfg,
            resume=resume,
            overrides=overrides,
            config_file=config if resume or init_from else None,
            init_from=init_from,
        )
    except KeyboardInterrupt:  # before the training loop, or a second signal inside it
        typer.echo(
            "error: stopped at once; files already written are intact (they are replaced "
            "atomically);"
            " --resume continues from the newest checkpoint, if one was written",
            err=True,
        )
        raise typer.Exit(code=130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one result line
        typer.echo(json.dumps(result))
    if result["interrupted"]:
        raise typer.Exit(code=130)
    # the run failed: a script must not take it for a finished one
    if result["stopped_by"] == "nonfinite":
        raise typer.Exit(code=1)
