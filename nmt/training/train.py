"""The training loop: the Trainer's named steps, from an opened run to its result line.

Opening a run (fresh, resumed, ``--init-from``) is :mod:`nmt.training.opening`, validation
:mod:`nmt.training.validation`, the update :mod:`nmt.core.update`.

A run lives in ``train.run_dir`` (its lifecycle: :mod:`nmt.runs.rundir`)::

    config.yaml        the resolved configuration
    spm*.model         the SentencePiece model(s)
    cache/             encoded corpora (reused by later runs on the same text)
    last.pt, best.pt   latest checkpoint, best by validation BLEU
    step_N.pt          every ``save_every`` steps, the newest ``keep_last`` kept
    metrics.jsonl      one JSON object per log or validation event
    .lock              held by the running ``nmt train``

A :class:`Trainer` runs named steps (next group, train step, log, validate, checkpoint,
should stop, finish). Under ``torchrun`` every stop and validate decision is one value all
processes agree on (:mod:`nmt.training.distributed`).
"""

# Size: module at most 815 lines: the Trainer is one class whose named steps share one state
# (progress, batches, model, updater), and a class split across modules would scatter that state;
# __init__() builds it from named parts (build_model, restore or start_from, say_what_trains).

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt.config import Config, ConfigError, config_to_dict
from nmt.core.batching import Batch, TokenBatchSampler, collate
from nmt.core.model import Transformer, count_parameters
from nmt.core.update import Updater, Window
from nmt.data.corpus import DataError
from nmt.data.encoded import EncodedCorpus
from nmt.data.multilingual import DirectionMix, directions
from nmt.data.subwords import sampled_training_corpus
from nmt.errors import Key
from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors
from nmt.runs.progress import Batching, Invocation, Progress, rng_state, set_rng_state
from nmt.runs.rundir import RunDir
from nmt.runs.runid import step_checkpoints
from nmt.runtime.compiled import compiling
from nmt.runtime.device import attention_backends, check_fits, for_training, resolve_device
from nmt.runtime.memory import keep_freed_memory

from .distributed import PEER_LOST, Distributed, Interrupted, PeerLost, StopSignal, lost_peer
from .opening import Opened, open_run, read_back
from .validation import validate

log = logging.getLogger("nmt.train")


RESULT_METRICS = ("bleu", "chrf", "valid_loss", "valid_nll", "valid_ppl", "bleu_signature")


def result_line(
    step: int,
    seconds: float,
    best_bleu: float,
    stopped_by: str,
    validation: dict | None,
    directions: tuple[str, ...] = (),
) -> dict:
    """What ``nmt train`` prints when it ends: always the same keys, None where there is no value.

    ``validation`` is the run's newest validation record (of this invocation or, when there was
    none, of the run's history); ``valid_step`` says which step it scored. A run of several
    ``directions`` has their mean as ``bleu`` and ``chrf``, and each one's as ``bleu/DIRECTION`` and
    ``chrf/DIRECTION``.
    """
    validation = validation or {}
    each = {f"{k}/{d}": validation.get(f"{k}/{d}") for d in directions for k in ("bleu", "chrf")}
    return {
        "step": step,
        "train_seconds": seconds,
        "best_bleu": best_bleu if best_bleu >= 0 else None,
        "interrupted": stopped_by == "signal",
        "stopped_by": stopped_by,
        "valid_step": validation.get("step"),
        **{k: validation.get(k) for k in RESULT_METRICS},
        **each,
    }


def train(
    cfg: Config,
    resume: bool = False,
    overrides: list[str] | None = None,
    config_file: Path | None = None,
    init_from: str | Path | None = None,
) -> dict:
    """Train a model as ``cfg`` says, or continue the run in ``cfg.train.run_dir``.

    With ``resume``, the configuration, tokenizer, weights, optimizer, schedule and
    gradient-scaler states, sampler position, early-stopping counter and every process's
    RNG states come from the run's newest complete checkpoint; ``overrides``
    (``section.key=value``) and the keys written in ``config_file`` may change settings
    such as ``train.max_steps``, not the model or tokenizer. With ``init_from`` (a checkpoint:
    a run's, a slim export, an average, an imported model), a new run starts from its weights
    and tokenizer (fine-tuning): the model and tokenizer sections come from it (see
    :func:`nmt.runs.rundir.init_config`), the optimizer (unless ``train.reset_optimizer`` is false
    and the checkpoint has its state), the schedule and the step counter start afresh. Under
    ``torchrun`` every process trains on its own share of each epoch's batches.

    Returns:
        :func:`result_line`: ``step``, ``train_seconds``, ``best_bleu``, ``interrupted`` (a
        signal stopped the run after saving ``last.pt``), ``stopped_by`` (steps, epochs,
        time, patience, signal, nonfinite: a NaN or infinite gradient with ``train.nonfinite_loss:
        stop``, or done: nothing was left to do), and the newest validation's
        ``valid_step``, ``bleu``, ``chrf``, ``valid_loss``, ``valid_nll``, ``valid_ppl`` and
        ``bleu_signature`` (None where no validation ran).

    Raises:
        ConfigError: a fresh run would overwrite an existing run's checkpoints, another
            process trains in the run directory, ``resume`` finds no checkpoint, ``resume``
            and ``init_from`` are both given, or the config asks ``init_from`` for another
            architecture.
        nmt.runs.checkpoint.CheckpointError: the checkpoint to resume or start from is unusable.
        nmt.data.corpus.DataError, nmt.data.tokenizer.TokenizerError: unusable input.
        nmt.files.OutputError: the run directory cannot be written (read-only, full).
    """
    if resume and init_from is not None:
        raise ConfigError(
            Key("resume"),
            " and ",
            Key("init_from"),
            " cannot go together: --init-from starts a new run from a checkpoint, --resume "
            "continues this run (a fine-tuning run too) from its own",
        )
    ddp = Distributed(resolve_device(cfg.train.device))
    run = RunDir(Path(cfg.train.run_dir).absolute())
    try:
        opened = ddp.on_main(
            lambda: open_run(run, cfg, resume, overrides or [], config_file, init_from)
        )
        if not ddp.main:
            opened = read_back(run, *ddp.share(None))
        else:
            ddp.share((config_to_dict(opened.cfg), opened.checkpoint, opened.done, opened.origin))
        if opened.done:
            if ddp.main:
                log.info("%s", opened.done["message"])
            return result_line(
                opened.done["step"],
                0.0,
                opened.done["best_bleu"],
                "done",
                run.last_validation(),
                direction_names(opened.cfg),
            )
        return Trainer(opened, ddp, run).run()
    except (RuntimeError, dist.DistError) as exc:
        if not (ddp.enabled and lost_peer(exc)):
            raise
        raise PeerLost(
            f"another process of this run stopped, so rank {ddp.rank} stops too "
            f"({next(w for w in PEER_LOST if w in str(exc))}); "
            f"once every process can run, continue with nmt train --run-dir {run.path} --resume "
            "(last.pt keeps the last checkpoint)"
        ) from None
    finally:
        run.release()
        ddp.close()


def direction_names(cfg: Config) -> tuple[str, ...]:
    """The directions of a run of several, as their validation records name them; () for a run of
    one."""
    found = directions(cfg.data)
    return tuple(map(str, found)) if len(found) > 1 else ()


class Trainer:
    """One run's training: named steps over state that lives in one place.

    Every process runs the same sequence of steps; :meth:`should_stop` is the only place
    a stop is decided, from flags all processes agree on.
    """

    def __init__(self, opened: Opened, ddp: Distributed, run: RunDir):
        self.cfg, self.ddp, self.run_dir, self.checkpoint_from = (
            opened.cfg,
            ddp,
            run,
            opened.checkpoint,
        )
        # Which training this is, in every checkpoint and in the directory: nmt average refuses to
        # mix two runs' weights unless asked, and a checkpoint copied in from another run is named.
        self.run_id = ddp.share(ddp.on_main(lambda: run.hold(getattr(opened.resumed, "run", None))))
        self.tokenizer, self.corpus, self.valid = (
            opened.data.tokenizer,
            opened.data.corpus,
            opened.data.valid,
        )
        tc = self.cfg.train
        self.model, self.updater = self.build_model()
        parts = self.corpus.parts  # one per direction
        self.mix = (
            DirectionMix(parts, self.cfg.data.sampling_temperature) if len(parts) > 1 else None
        )
        # What cuts this run's epochs into batches (and, with several directions, mixes them).
        self.batching = Batching(
            tc.max_tokens, tc.seed, ddp.world_size, self.mix.temperature if self.mix else None
        )
        self.progress = Progress(batching=self.batching)
        self.origin = opened.origin
        # (epoch, seed) and its pairs under tokenizer.subword_alpha
        self._sampled: tuple[tuple[int, int], EncodedCorpus] | None = None
        if opened.resumed:
            self.restore(opened.resumed.payload)
        elif opened.init:
            self.start_from(opened.init.payload)
        self._batches: tuple[int, list] = (-1, [])
        self.epoch_batches()  # fewer batches than processes fails here, before any step
        self.window = Window(ddp.device)
        # a non-finite gradient stops the run (train.nonfinite_loss: stop), or too many skipped
        # updates in a row
        self.diverged = False
        # updates skipped since the last one made (train.max_skipped_updates)
        self.skipped_in_a_row = 0
        # the lowest logged training loss and its step, to notice divergence
        self.lowest_loss: tuple[float, int] | None = None
        self.warned_divergence = False
        # the newest validation record, for the result
        self.last_validation = run.last_validation() if opened.resumed else None
        self.writer = run.tensorboard(self.progress.step) if ddp.main and tc.tensorboard else None
        self.invocation = Invocation(self.progress.step + 1, time.perf_counter())
        if ddp.main:
            self.say_what_trains()

    def build_model(self) -> tuple[Transformer, Updater]:
        """The model on the device with its tricks (:func:`nmt.runtime.device.for_training`),
        seeded by ``train.seed``, and the :class:`~nmt.core.update.Updater` that trains it, with
        the loss and step :func:`nmt.runtime.compiled.compiling` decides on before the first step;
        ``train.threads`` set first."""
        tc, ddp = self.cfg.train, self.ddp
        if tc.threads > 0:
            torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed)
        model = for_training(Transformer(self.cfg.model).to(ddp.device), ddp.device)
        # for_training asked already: this says whether it held
        if ddp.device.type == "cpu" and keep_freed_memory() and ddp.main:
            log.info(
                "memory: freed blocks are kept for reuse (glibc mallopt), so large tensors are not "
                "paged in again every step"
            )
        world_size = ddp.world_size if ddp.enabled else 1
        loss, step = compiling(tc, ddp.device, ddp.gather)  # tried here, before the first step
        context = functools.partial(attention_backends, ddp.device)
        return model, Updater(model, tc, ddp.device, world_size, loss, context, step)

    def say_what_trains(self) -> None:
        """Log the model's size, the corpus, the padding share of the batches and the batch
        budget; with several directions, what an epoch draws from each."""
        tc, ddp = self.cfg.train, self.ddp
        log.info(
            "model: %s parameters; %d training pairs, padding %.1f%% of batch tokens; %d "
            "process(es) × update_freq %d × max_tokens %d",
            f"{count_parameters(self.model):,}",
            len(self.corpus),
            100
            * self.sampler(self.progress.batching, self.progress.epoch).padding_fraction(
                self.progress.epoch, tc.pad_to_multiple
            ),
            ddp.world_size,
            tc.update_freq,
            tc.max_tokens,
        )
        if self.mix:
            log.info(
                "an epoch draws (data.sampling_temperature %s): %s",
                self.mix.temperature,
                self.mix.describe([v.direction for v in self.valid]),
            )

    def restore(self, payload: dict) -> None:
        """Weights, optimizer, schedule, scaler, position and this process's RNG states from
        ``payload``."""
        u = self.updater
        self.model.load_state_dict(payload["model"])
        u.optimizer.load_state_dict(payload["optimizer"])
        u.scheduler.load_state_dict(payload["scheduler"])
        # what --resume changed in the optimizer or the schedule counts from this step on
        u.apply_settings()
        if "scaler" in payload:
            u.scaler.load_state_dict(payload["scaler"])
        self.progress = Progress.of(payload["progress"])
        # one dict: written before per-process states
        states = payload["rng"] if isinstance(payload["rng"], list) else [payload["rng"]]
        saved = payload["config"]["train"]
        # before this was recorded
        self.progress.batching = self.progress.batching or Batching(
            saved["max_tokens"], saved["seed"], len(states)
        )
        self.keep_epoch_batching()
        if len(states) != self.ddp.world_size:
            log.warning(
                "warning: %s was written by %d process(es), this run has %d: resuming, but random "
                "draws (dropout) differ from an uninterrupted run",
                self.checkpoint_from,
                len(states),
                self.ddp.world_size,
            )
        set_rng_state(states[self.ddp.rank % len(states)])
        if self.cfg.tokenizer.subword_alpha:
            self.restore_cut(payload)
        if payload.get("data_key") not in (None, self.corpus.key):
            log.warning(
                "warning: the training text changed since %s was written: resuming, but not "
                "exactly (the sampler position now points into other batches)",
                self.checkpoint_from,
            )

    def restore_cut(self, payload: dict) -> None:
        """The epoch's cut saved in ``payload`` (``tokenizer.subword_alpha``), so that the epoch
        goes on with the pieces it started with; one that is missing, damaged or of other training
        text (the cache's key differs) is said and left: the epoch is then cut anew, and the resume
        is not exact."""
        p, cut = self.progress, payload.get("subwords")
        problem = "it holds no cut of its epoch" if cut is None else None
        if cut is not None and payload.get("data_key") != self.corpus.key:
            problem = "its cut is of other training text"
        elif cut is not None:
            try:
                corpus = EncodedCorpus.from_arrays(
                    {k: v.numpy() for k, v in cut.items() if k not in ("epoch", "seed")},
                    key=self.corpus.key,
                )
                if corpus.parts != self.corpus.parts or (cut["epoch"], cut["seed"]) != (
                    p.epoch,
                    p.batching.seed,
                ):
                    raise ValueError(
                        f"a cut of epoch {cut['epoch']} and {len(corpus)} pairs, for epoch "
                        f"{p.epoch} and {len(self.corpus)}"
                    )
                self._sampled = ((p.epoch, p.batching.seed), corpus)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                problem = f"its cut of the epoch is damaged ({exc})"
        if problem and p.batch_in_epoch > 0 and self.ddp.main:
            log.warning(
                "warning: %s: %s; the rest of epoch %d is cut anew, so this resume is not exact",
                self.checkpoint_from,
                problem,
                p.epoch,
            )

    def start_from(self, payload: dict) -> None:
        """A new run's weights from ``payload`` (``--init-from``); Adam's moments too when
        ``train.reset_optimizer`` is false and it has them."""
        self.model.load_state_dict(payload["model"])
        if self.cfg.train.reset_optimizer:
            return
        if "optimizer" not in payload:
            log.warning(
                "warning: %s holds no optimizer state (not a checkpoint nmt train wrote): Adam "
                "starts afresh",
                self.origin["init_from"]["path"],
            )
            return
        self.updater.optimizer.load_state_dict(payload["optimizer"])
        # this run's Adam settings, and its own schedule's rate for step 1
        self.updater.apply_settings()

    def run(self) -> dict:
        """Train until a limit, patience or a signal stops the run; then :meth:`finish`."""
        bar = tqdm(
            total=self.cfg.train.max_steps,
            initial=self.progress.step,
            unit="step",
            disable=not (self.cfg.train.progress_bar and self.ddp.main) or None,
            dynamic_ncols=True,
        )
        # a budget the GPU cannot hold: one line now, not a CUDA traceback at some step
        if self.ddp.device.type == "cuda":
            largest = max(
                self.epoch_batches(),
                key=lambda b: (
                    len(b)
                    * int(self.corpus.src_lengths[b].max() + self.corpus.tgt_lengths[b].max())
                ),
            )
            corpus = self.epoch_corpus(self.progress.epoch, self.progress.batching.seed)
            check_fits(
                self.updater,
                collate(corpus, largest, multiple=self.cfg.train.pad_to_multiple),
                self.cfg.train.max_tokens,
            )
        with StopSignal() as signals, logging_redirect_tqdm():
            self.maybe_validate(signals)  # resumed at a step whose validation a signal abandoned
            while (reason := self.should_stop(signals)) is None:
                if self.train_step(self.next_group()):
                    bar.update(1)
                    self.maybe_log(bar)
                    self.maybe_validate(signals)
                    self.maybe_checkpoint()
                self.maybe_end_epoch()
            bar.close()
            return self.finish(reason, signals)

    def keep_epoch_batching(self) -> None:
        """A resumed epoch goes on with the batches it started with, so that its saved position
        still points into them: a changed ``train.max_tokens`` or ``train.seed`` applies from the
        next epoch on. With another number of processes the batches cannot be cut as before;
        the rest of that epoch is then skipped, with a warning."""
        p = self.progress
        if p.batching == self.batching:
            return
        if p.batch_in_epoch == 0:
            p.batching = self.batching
        elif p.batching.processes == self.batching.processes:
            log.info(
                "train.max_tokens %d and train.seed %d apply from epoch %d on; epoch %d goes on "
                "with the batches it started with (max_tokens %d, seed %d)",
                self.batching.max_tokens,
                self.batching.seed,
                p.epoch + 1,
                p.epoch,
                p.batching.max_tokens,
                p.batching.seed,
            )
        else:
            log.warning(
                "warning: %s was written by %d process(es), this run has %d: the rest of epoch %d "
                "cannot be cut into the same batches and is skipped",
                self.checkpoint_from,
                p.batching.processes,
                self.batching.processes,
                p.epoch,
            )
            p.epoch, p.batch_in_epoch, p.batching = p.epoch + 1, 0, self.batching

    def epoch_corpus(self, epoch: int, seed: int) -> EncodedCorpus:
        """The training pairs of ``epoch``: the cached ones, or with ``tokenizer.subword_alpha``
        the same pairs cut anew, seeded by ``seed`` and ``epoch`` (so a resumed epoch gets its
        pieces back)."""
        if not self.cfg.tokenizer.subword_alpha:
            return self.corpus
        if self._sampled is None or self._sampled[0] != (epoch, seed):
            started = time.perf_counter()
            # Rank 0 cuts and every rank trains on its cut: SentencePiece's draws differ between
            # processes.
            corpus = self.ddp.share(
                self.ddp.on_main(
                    lambda: sampled_training_corpus(self.cfg, self.tokenizer, (seed, epoch))
                )
            )
            # the files are read again each epoch; the cache is of the text the run started on
            if corpus.key != self.corpus.key:
                raise DataError(
                    f"the training files changed during the run (found when cutting epoch {epoch}: "
                    f"{len(corpus)} pairs kept, "
                    f"{len(self.corpus)} when it started); restore them and resume (--resume), or "
                    "start a new run on the new ones"
                )
            self._sampled = ((epoch, seed), corpus)
            if self.ddp.main:
                pieces = [
                    float(c.src_lengths.sum() + c.tgt_lengths.sum()) for c in (corpus, self.corpus)
                ]
                log.info(
                    "epoch %d: training pairs cut anew (tokenizer.subword_alpha %s) in %.1f s: "
                    "%.2fx the pieces of the best segmentation",
                    epoch,
                    self.cfg.tokenizer.subword_alpha,
                    time.perf_counter() - started,
                    pieces[0] / pieces[1],
                )
        return self._sampled[1]

    def epoch_cut(self) -> dict:
        """``{"subwords": ...}``: the pieces of the current epoch under ``tokenizer.subword_alpha``
        (int32 and int64 tensors, 4 bytes a piece and 16 a pair) with its epoch and seed, so that
        a resumed run trains on the rest of the epoch as cut; empty without subword sampling."""
        if (
            not self.cfg.tokenizer.subword_alpha
            or self._sampled is None
            or self._sampled[0][0] != self.progress.epoch
        ):
            return {}  # an epoch's end: the next one is cut when it begins
        (epoch, seed), corpus = self._sampled
        return {
            "subwords": {
                "epoch": epoch,
                "seed": seed,
                **{k: torch.from_numpy(v) for k, v in corpus.arrays().items()},
            }
        }

    def sampler(self, batching: Batching, epoch: int) -> TokenBatchSampler:
        """The batch sampler of ``batching`` over ``epoch``'s pairs (:meth:`epoch_corpus`), this
        process's share."""
        b = batching
        mix = (
            replace(self.mix, temperature=b.temperature)
            if self.mix and b.temperature is not None
            else self.mix
        )
        corpus = self.epoch_corpus(epoch, b.seed)
        return TokenBatchSampler(
            corpus.src_lengths,
            corpus.tgt_lengths,
            b.max_tokens,
            b.seed,
            self.ddp.rank,
            b.processes,
            mix,
        )

    def epoch_batches(self) -> list:
        """This process's batches of the current epoch, in training order."""
        epoch = self.progress.epoch
        if self._batches[0] != epoch:
            batches = self.sampler(self.progress.batching, epoch).epoch_batches(epoch)
            if not batches:
                raise DataError(
                    f"{len(self.corpus)} training pairs make fewer batches of train.max_tokens "
                    f"{self.cfg.train.max_tokens} tokens "
                    f"than the {self.ddp.world_size} processes (epoch {epoch}); "
                    "every process needs at least one batch: lower train.max_tokens, add training "
                    "data or start fewer processes"
                )
            self._batches = (epoch, batches)
        return self._batches[1]

    def maybe_end_epoch(self) -> None:
        """Past the epoch's last batch: the next epoch begins, cut with this run's batching."""
        p = self.progress
        if p.batch_in_epoch >= len(self.epoch_batches()):
            p.epoch, p.batch_in_epoch, p.batching = p.epoch + 1, 0, self.batching

    def next_group(self) -> list[Batch]:
        """The next ``update_freq`` batches of this process (host tensors)."""
        p = self.progress
        try:
            self.maybe_end_epoch()  # a checkpoint saved on an epoch's last step resumes here
            batches = self.epoch_batches()[
                p.batch_in_epoch : p.batch_in_epoch + self.cfg.train.update_freq
            ]
        # cutting a new epoch (tokenizer.subword_alpha) found the files changed, or too few batches
        except DataError:
            self.checkpoint("last.pt")  # the steps trained so far are kept; every rank raises here
            raise
        p.batch_in_epoch += len(batches)
        corpus = self.epoch_corpus(p.epoch, p.batching.seed)
        return [
            collate(corpus, b, self.ddp.device.type == "cuda", self.cfg.train.pad_to_multiple)
            for b in batches
        ]

    def train_step(self, group: list[Batch]) -> bool:
        """One update; False when it was skipped (no step counted, the schedule unmoved): by fp16
        gradient scaling, or for a NaN or infinite gradient, which is said at once with the step."""
        outs = self.updater.step(group)
        if self.updater.nonfinite:
            if self.ddp.main:
                action = (
                    "update skipped (train.nonfinite_loss: skip)"
                    if self.cfg.train.nonfinite_loss == "skip"
                    else "stopping before the update, last.pt keeps the weights of the step before "
                    "(train.nonfinite_loss: stop)"
                )
                log.warning(
                    "warning: step %d: the gradients are NaN or infinite (loss %s); %s; a lower "
                    "learning rate (train.lr_scale, train.lr) or "
                    "train.clip_norm usually helps",
                    self.progress.step + 1,
                    f"{sum(float(o.loss.detach()) for o in outs):.4g}",
                    action,
                )
            self.diverged = self.cfg.train.nonfinite_loss == "stop"
            return self._count_skipped()
        for out in outs:
            self.window.add(out)
        self.window.tokens += self.updater.last_tokens
        if self.updater.skipped:
            return self._count_skipped()
        self.progress.step += 1
        self.skipped_in_a_row = 0
        return True

    def _count_skipped(self) -> bool:
        """Count a skipped update; past ``train.max_skipped_updates`` in a row the run cannot
        progress (weights that give non-finite values whatever the batch) and stops as a diverged
        run does."""
        self.skipped_in_a_row += 1
        limit = self.cfg.train.max_skipped_updates
        if self.skipped_in_a_row >= limit and not self.diverged:
            self.diverged = True
            if self.ddp.main:
                log.warning(
                    "warning: step %d: %d updates in a row were skipped "
                    "(train.max_skipped_updates): the run cannot progress; stopping, last.pt "
                    "keeps the weights of step %d; resume from an earlier checkpoint with a lower "
                    "learning rate (train.lr_scale, train.lr)",
                    self.progress.step + 1,
                    limit,
                    self.progress.step,
                )
        return False

    def maybe_log(self, bar) -> None:
        """Every ``train.log_every`` steps: log the window's loss, perplexity, lr and tokens/s, and
        record them; at this invocation's first step and first minute too, logged only."""
        regular = self.progress.step % self.cfg.train.log_every == 0
        if not regular and not self.invocation.early_log_due(self.progress.step):
            return
        values = self.window.flush(self.progress, self.updater.last_lr)
        self.notice_divergence(values)
        if self.ddp.main:
            log.info(
                "step %d epoch %d: loss %.3f (label-smoothed) nll %.3f ppl %.2f lr %.2e %.0f tgt "
                "tok/s",
                values["step"],
                values["epoch"],
                values["loss"],
                values["nll"],
                values["ppl"],
                values["lr"],
                values["tgt_tokens_per_s"],
            )
            bar.set_postfix(
                loss=f"{values['loss']:.3f}",
                lr=f"{values['lr']:.1e}",
                tok_s=f"{values['tgt_tokens_per_s']:.0f}",
            )
            if regular:
                self.record(values)

    def notice_divergence(self, values: dict) -> None:
        """Warn once when the logged training loss has doubled from its lowest: the run may be
        diverging."""
        loss, step = values["loss"], values["step"]
        if self.lowest_loss is None or loss < self.lowest_loss[0]:
            self.lowest_loss = (loss, step)
        elif loss > 2 * self.lowest_loss[0] and not self.warned_divergence and self.ddp.main:
            self.warned_divergence = True
            log.warning(
                "warning: step %d: the training loss %.3f is more than twice its lowest, %.3f at "
                "step %d: the run may be diverging; "
                "a lower learning rate (train.lr_scale, train.lr) or train.clip_norm usually helps",
                step,
                loss,
                *self.lowest_loss,
            )

    def maybe_validate(self, signals: StopSignal) -> None:
        """Every ``train.validate_every`` steps (once per step): validate."""
        p = self.progress
        if p.step and p.step % self.cfg.train.validate_every == 0 and p.validated_step != p.step:
            self.validate(signals)

    def validate(self, signals: StopSignal) -> dict:
        """Validate on rank 0 (a signal abandons it at once); every rank learns the result and saves
        with rank 0."""
        p, metrics = self.progress, None
        if self.ddp.main:
            try:
                with signals.interruptible():
                    metrics = validate(
                        self.model, self.tokenizer, self.valid, self.cfg, self.ddp.device
                    )
            except Interrupted:
                log.info("validation at step %d abandoned", p.step)
        metrics = self.ddp.share(metrics)
        if metrics is None:
            return {}
        self.last_validation = {"step": p.step, **metrics}
        improved = metrics["bleu"] > p.best_bleu
        p.best_bleu, p.bad_validations = (
            (metrics["bleu"], 0) if improved else (p.best_bleu, p.bad_validations + 1)
        )
        p.validated_step = p.step
        if self.ddp.main:
            names = [v.direction for v in self.valid if v.direction]
            for name in names:
                log.info(
                    "step %d validation %s: loss %.3f (label-smoothed) ppl %.2f BLEU %.2f chrF "
                    "%.2f | %s",
                    p.step,
                    name,
                    *(
                        metrics[f"{k}/{name}"]
                        for k in ("valid_loss", "valid_ppl", "bleu", "chrf", "example")
                    ),
                )
            log.info(
                "step %d validation%s: loss %.3f (label-smoothed) ppl %.2f BLEU %.2f chrF %.2f%s | "
                "%s",
                p.step,
                f", mean of {len(names)} directions" if names else "",
                metrics["valid_loss"],
                metrics["valid_ppl"],
                metrics["bleu"],
                metrics["chrf"],
                " (best)" if improved else "",
                metrics["example"],
            )
            self.record(
                {
                    "step": p.step,
                    **{k: v for k, v in metrics.items() if k.partition("/")[0] != "example"},
                }
            )
        if improved:
            self.checkpoint("best.pt")
        self.checkpoint("last.pt")
        return metrics

    def maybe_checkpoint(self) -> None:
        """Every ``train.save_every`` steps: write ``step_N.pt`` and drop all but the newest
        ``train.keep_last``."""
        tc = self.cfg.train
        if tc.save_every and self.progress.step % tc.save_every == 0:
            self.checkpoint(f"step_{self.progress.step}.pt")
            if self.ddp.main:
                for old in step_checkpoints(self.run_dir.path)[: -tc.keep_last]:
                    old.unlink()

    def should_stop(self, signals: StopSignal) -> str | None:
        """Why to stop now (signal, time, steps, epochs, patience, a non-finite gradient), decided
        by all processes together; None to go on."""
        p, tc = self.progress, self.cfg.train
        flags = self.ddp.agree(
            signal=signals.received is not None,
            time=bool(tc.max_time_s) and self.invocation.seconds() >= tc.max_time_s,
            steps=p.step >= tc.max_steps,
            epochs=p.epoch >= tc.max_epochs,
            patience=bool(tc.patience) and p.bad_validations >= tc.patience,
            nonfinite=self.diverged,
        )
        return next((name for name, value in flags.items() if value), None)

    def finish(self, reason: str, signals: StopSignal) -> dict:
        """Validate unless this step was validated (or a signal stopped the run), save ``last.pt``,
        report (:func:`result_line`)."""
        if reason == "patience" and self.ddp.main:
            log.info(
                "early stop: %d validations without a BLEU improvement",
                self.progress.bad_validations,
            )
        if self.progress.validated_step != self.progress.step and reason != "signal":
            self.validate(signals)
        # no validation saved last.pt at this step
        if self.progress.validated_step != self.progress.step:
            self.checkpoint("last.pt")
        if self.writer is not None:
            self.writer.close()
        seconds = self.invocation.seconds()
        if self.ddp.main:
            best = (
                f"{self.progress.best_bleu:.2f}"
                if self.progress.best_bleu >= 0
                else "none (no validation ran)"
            )
            log.info(
                "done (%s): at step %d after %.0f s of training in this invocation; best "
                "validation BLEU %s",
                reason,
                self.progress.step,
                seconds,
                best,
            )
        return result_line(
            self.progress.step,
            seconds,
            self.progress.best_bleu,
            reason,
            self.last_validation,
            direction_names(self.cfg),
        )

    def checkpoint(self, name: str) -> None:
        """Save the full training state as ``run_dir/name`` (a collective: every process gives its
        RNG states)."""
        states = self.ddp.gather(rng_state())
        u = self.updater

        def save() -> None:
            save_checkpoint(
                {
                    "model": self.model.state_dict(),
                    "optimizer": u.optimizer.state_dict(),
                    "scheduler": u.scheduler.state_dict(),
                    "scaler": u.scaler.state_dict(),
                    "progress": self.progress.stored(),
                    "rng": states,
                    "config": config_to_dict(self.cfg),
                    "tokenizer": tokenizer_to_tensors(self.tokenizer.protos()),
                    "data_key": self.corpus.key,
                    "run": self.run_id,
                    **self.epoch_cut(),
                    **self.origin,
                },
                self.run_dir.path / name,
            )

        self.ddp.on_main(save)

    def record(self, values: dict) -> None:
        """Record ``values`` in ``metrics.jsonl`` and, when enabled, TensorBoard (numbers only)."""
        self.run_dir.record(values)
        if self.writer is not None:
            for key, value in values.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, values["step"])
