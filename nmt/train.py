"""The training loop: data, tokenizer, model, optimisation, validation and checkpoints.

A run lives in ``train.run_dir``::

    config.yaml        the resolved configuration
    spm*.model         the SentencePiece model(s)
    cache/             encoded corpora (reused by later runs on the same text)
    last.pt, best.pt   latest checkpoint, best by validation BLEU
    step_N.pt          every ``save_every`` steps, the newest ``keep_last`` kept
    metrics.jsonl      one JSON object per log or validation event
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from . import evaluate
from .average import step_checkpoints
from .checkpoint import (
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    tokenizer_from_tensors,
    tokenizer_to_tensors,
)
from .config import Config, ConfigError, apply_overrides, config_from_dict, config_to_dict, with_vocab
from .corpus import DataError, EncodedCorpus, ParallelText, encode_corpus, encoding_workers, load_split, strip_pairs, stripped_side
from .data import Batch, TokenBatchSampler, collate
from .loss import LossOutput, label_smoothed_loss
from .model import Transformer, count_parameters
from .schedule import build_scheduler
from .tokenizer import Tokenizer, tokenizer_from_config, train_tokenizer
from .translate import best_strings, resolve_device, translate_lines

log = logging.getLogger("nmt.train")


@dataclass
class Progress:
    """Where a run stands: optimizer steps done, the sampler's position, the best score."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already trained on
    best_bleu: float = -1.0
    bad_validations: int = 0  # validations since the last BLEU improvement


@dataclass
class ValidationSet:
    corpus: EncodedCorpus
    src_lines: list[str]
    ref_lines: list[str]


def prepare(cfg: Config, run_dir: Path, tokenizer: Tokenizer | None, write: bool = True) -> tuple[Tokenizer, EncodedCorpus, ValidationSet]:
    """Read and clean the data, train (or reuse) the tokenizer and encode both splits.

    Training text is streamed: the tokenizer trains on a stream (SentencePiece samples
    ``tokenizer.input_sentence_size`` sentences) and ``data.workers`` processes encode it
    into a memory-mapped cache, so memory does not grow with the corpus. With ``write``
    the tokenizer is saved in ``run_dir`` and encodings cached under ``run_dir/cache``
    (rank 0 does this; other ranks then read them back).
    """
    started = time.perf_counter()
    train_text = load_split(cfg.data, "train")
    valid_text = load_split(cfg.data, "valid")
    if tokenizer is None:
        tokenizer = tokenizer_from_config(cfg.tokenizer)
    if tokenizer is None:
        log.info("training SentencePiece %s tokenizer (vocab %d, %s)", cfg.tokenizer.type, cfg.tokenizer.vocab_size, "joint" if cfg.tokenizer.joint else "separate")
        tokenizer = train_tokenizer(stripped_side(train_text, 0), stripped_side(train_text, 1), cfg.tokenizer)
        log.info("tokenizer trained in %.1f s", time.perf_counter() - started)
    if write:  # created only now: a missing input leaves no empty run directory behind
        run_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(run_dir)
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "cache"
    workers = encoding_workers(cfg.data.workers)
    encoding = time.perf_counter()
    corpus, report = encode_corpus(train_text, tokenizer, cache, cfg.data.max_len, cfg.data.max_len_ratio, write=write, workers=workers)
    if write:
        log.info("train: %s; encoded or loaded from %s in %.1f s (workers: %d)", report, cache, time.perf_counter() - encoding, workers)
    if len(corpus) == 0:
        raise DataError(f"no training pairs left after cleaning ({report}); check the training files, data.max_len and data.max_len_ratio")
    vsrc, vtgt, vreport = strip_pairs(*valid_text.read())
    if not vsrc:
        raise DataError(f"the validation set has no pair with text on both sides ({vreport}); check the validation files")
    if cfg.data.valid_max_sentences:
        vsrc, vtgt = vsrc[: cfg.data.valid_max_sentences], vtgt[: cfg.data.valid_max_sentences]
    valid, _ = encode_corpus(ParallelText.lists(vsrc, vtgt), tokenizer, cache, write=write)
    if write:
        capped = f"; the first {len(vsrc)} used (data.valid_max_sentences)" if len(vsrc) < vreport.kept else ""
        log.info("valid: %s%s", vreport, capped)
    return tokenizer, corpus, ValidationSet(valid, vsrc, vtgt)


@torch.no_grad()
def validate(model: Transformer, tokenizer: Tokenizer, valid: ValidationSet, cfg: Config, device: torch.device) -> dict:
    """Validation loss, perplexity and BLEU/chrF of beam-search translations.

    Translations are scored by :func:`nmt.evaluate.score`, the code ``nmt evaluate`` uses.
    """
    model.eval()
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    sampler = TokenBatchSampler(valid.corpus.src_lengths, valid.corpus.tgt_lengths, cfg.train.max_tokens, seed=0)
    for indices in sampler.epoch_batches(0):
        batch = collate(valid.corpus, indices).to(device)
        out = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, cfg.train.label_smoothing)
        loss_sum += float(out.loss)
        nll_sum += float(out.nll)
        n_tokens += int(out.n_tokens)
    decode = replace(cfg.decode, beam_size=cfg.train.valid_beam_size, n_best=1)
    hyps = best_strings(tokenizer, translate_lines(model, tokenizer, valid.src_lines, decode, device))
    scores = evaluate.score(hyps, [valid.ref_lines])
    nll = nll_sum / max(1, n_tokens)
    return {"valid_loss": loss_sum / max(1, n_tokens), "valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0)), "bleu": scores["bleu"], "chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"], "example": hyps[0] if hyps else ""}


def _write_metrics(run_dir: Path, record: dict) -> None:
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


class Distributed:
    """This process's place in a ``torchrun`` job (rank 0 of 1 without one).

    ``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; the process group uses
    NCCL on GPUs and Gloo on CPUs. Only rank 0 writes files.
    """

    def __init__(self, device_name: str):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = resolve_device(device_name)
        if self.world_size > 1:
            if self.device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast(self, value):
        """Rank 0's ``value`` on every rank."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps, so the run saves
    ``last.pt`` and exits cleanly instead of dying mid-step (or mid-write)."""

    def __init__(self):
        self.received: int | None = None
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(cfg: Config, resume: bool = False, overrides: list[str] | None = None) -> dict:
    """Train a model as ``cfg`` says, or continue the run in ``cfg.train.run_dir``.

    With ``resume``, the configuration, tokenizer, weights, optimizer, schedule and
    gradient-scaler states, sampler position, early-stopping counter and RNG states come
    from ``run_dir/last.pt``; ``overrides`` (``section.key=value``) may change settings
    such as ``train.max_steps``. Under ``torchrun`` every process trains on its own share
    of each epoch's batches (see :class:`~nmt.data.TokenBatchSampler`).

    Returns:
        The final validation metrics plus ``step``, ``train_seconds``, ``best_bleu`` and
        ``interrupted`` (a signal stopped the run after saving ``last.pt``).

    Raises:
        ConfigError: a fresh run would overwrite an existing run's checkpoints, or
            ``resume`` finds none.
        nmt.corpus.DataError, nmt.tokenizer.TokenizerError: unusable input.
    """
    run_dir = Path(cfg.train.run_dir)
    payload = None
    if resume:
        if not (run_dir / "last.pt").is_file():
            raise ConfigError(f"--resume: {run_dir / 'last.pt'} does not exist; start a fresh run instead")
        fixed = [o for o in overrides or [] if o.strip().startswith(("model.", "tokenizer."))]
        if fixed:
            raise ConfigError(f"--resume cannot change the model or tokenizer of a run ({', '.join(fixed)}); start a new run instead")
        payload = load_checkpoint(run_dir / "last.pt")
        cfg = config_from_dict(apply_overrides(payload["config"], overrides or []), str(run_dir / "last.pt"))
    elif run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"train.run_dir {run_dir} is a file; choose a directory")
    else:
        existing = sorted(p.name for p in [run_dir / "last.pt", run_dir / "best.pt", run_dir / "metrics.jsonl", *run_dir.glob("step_*.pt")] if p.exists())
        if existing:
            raise ConfigError(f"{run_dir} already holds a run ({', '.join(existing)}); pass --resume to continue it or choose another train.run_dir")
    tc = cfg.train
    ddp = Distributed(tc.device)
    device = ddp.device
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)

    tokenizer = Tokenizer.from_protos(tokenizer_from_tensors(payload["tokenizer"])) if payload else None
    if ddp.main:
        tokenizer, corpus, valid = prepare(cfg, run_dir, tokenizer)
    ddp.barrier()
    if not ddp.main:  # the tokenizer and encoded corpora are rank 0's, read back from run_dir
        tokenizer, corpus, valid = prepare(cfg, run_dir, tokenizer or Tokenizer.load_dir(run_dir), write=False)
    cfg = with_vocab(cfg, tokenizer.src.get_piece_size(), tokenizer.tgt.get_piece_size())
    if ddp.main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")

    model = Transformer(cfg.model).to(device)
    updater = Updater(model, tc, device, ddp)
    optimizer, scheduler, scaler = updater.optimizer, updater.scheduler, updater.scaler
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, tc.max_tokens, tc.seed, ddp.rank, ddp.world_size)
    progress = Progress()
    if payload:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        if "scaler" in payload:
            scaler.load_state_dict(payload["scaler"])
        progress = Progress(**payload["progress"])
        set_rng_state(payload["rng"])
        log.info("resumed %s at step %d (epoch %d, batch %d)", run_dir, progress.step, progress.epoch, progress.batch_in_epoch)
        if payload.get("data_key") not in (None, corpus.key):
            log.warning("the training text changed since %s was written: resuming, but not exactly (the sampler position now points into other batches)", run_dir / "last.pt")
    log.info(
        "model: %s parameters; %d training pairs, padding %.1f%% of batch tokens; %d process(es) × update_freq %d × max_tokens %d",
        f"{count_parameters(model):,}", len(corpus), 100 * sampler.padding_fraction(progress.epoch), ddp.world_size, tc.update_freq, tc.max_tokens,
    )
    writer = _tensorboard(run_dir) if ddp.main and tc.tensorboard else None

    def record(values: dict) -> None:
        _write_metrics(run_dir, values)
        if writer is not None:
            for key, value in values.items():
                if key != "step" and isinstance(value, (int, float)):
                    writer.add_scalar(key, value, values["step"])

    def checkpoint(name: str) -> None:
        if not ddp.main:
            return
        save_checkpoint(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "progress": vars(progress).copy(),
                "rng": rng_state(),
                "config": config_to_dict(cfg),
                "tokenizer": tokenizer_to_tensors(tokenizer.protos()),
                "data_key": corpus.key,
            },
            run_dir / name,
        )

    def run_validation() -> dict:
        """Validate on rank 0; every rank learns whether patience ran out."""
        metrics = {}
        if ddp.main:
            metrics = validate(model, tokenizer, valid, cfg, device)
            improved = metrics["bleu"] > progress.best_bleu
            if improved:
                progress.best_bleu, progress.bad_validations = metrics["bleu"], 0
            else:
                progress.bad_validations += 1
            log.info("step %d validation: loss %.3f (label-smoothed) ppl %.2f BLEU %.2f chrF %.2f%s | %s", progress.step, metrics["valid_loss"], metrics["valid_ppl"], metrics["bleu"], metrics["chrf"], " (best)" if improved else "", metrics["example"])
            record({"step": progress.step, **{k: v for k, v in metrics.items() if k != "example"}})
            if improved:
                checkpoint("best.pt")
        progress.best_bleu, progress.bad_validations = ddp.broadcast((progress.best_bleu, progress.bad_validations))
        return metrics

    start = time.perf_counter()
    window = Window(device)
    pin = device.type == "cuda"  # page-locked host batches: copies to the GPU run asynchronously
    metrics: dict = {}
    stop = interrupted = False
    bar = tqdm(total=tc.max_steps, initial=progress.step, unit="step", disable=not (tc.progress_bar and ddp.main) or None, dynamic_ncols=True)
    with StopSignal() as signals, logging_redirect_tqdm():
        while not stop and progress.step < tc.max_steps and progress.epoch < tc.max_epochs:
            batches = sampler.epoch_batches(progress.epoch)
            while progress.batch_in_epoch < len(batches):
                group = [collate(corpus, b, pin_memory=pin) for b in batches[progress.batch_in_epoch : progress.batch_in_epoch + tc.update_freq]]
                progress.batch_in_epoch += len(group)
                for out in updater.step(group):
                    window.add(out)
                window.tokens += updater.last_tokens
                progress.step += 1
                bar.update(1)
                metrics = {}
                if progress.step % tc.log_every == 0:
                    values = window.flush(progress, scheduler.get_last_lr()[0])
                    if ddp.main:
                        log.info("step %d epoch %d: loss %.3f (label-smoothed) nll %.3f ppl %.2f lr %.2e %.0f tgt tok/s", values["step"], values["epoch"], values["loss"], values["nll"], values["ppl"], values["lr"], values["tgt_tokens_per_s"])
                        bar.set_postfix(loss=f"{values['loss']:.3f}", lr=f"{values['lr']:.1e}", tok_s=f"{values['tgt_tokens_per_s']:.0f}")
                        record(values)
                if progress.step % tc.validate_every == 0:
                    metrics = run_validation()
                    checkpoint("last.pt")
                    if tc.patience and progress.bad_validations >= tc.patience:
                        log.info("early stop: %d validations without a BLEU improvement", progress.bad_validations)
                        stop = True
                if tc.save_every and progress.step % tc.save_every == 0:
                    checkpoint(f"step_{progress.step}.pt")
                    if ddp.main:
                        for old in step_checkpoints(run_dir)[: -tc.keep_last]:
                            old.unlink()
                received = signals.received is not None
                if ddp.enabled:  # every process must stop at the same step
                    flag = torch.tensor(int(received), device=device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    received = bool(flag)
                if received:
                    log.info("signal received: saving %s and stopping", run_dir / "last.pt")
                    stop = interrupted = True
                if stop or progress.step >= tc.max_steps or (tc.max_time_s and time.perf_counter() - start >= tc.max_time_s):
                    stop = True
                    break
            else:
                progress.epoch += 1
                progress.batch_in_epoch = 0
        bar.close()
        if not metrics:  # a validation step has just saved last.pt already
            if not interrupted:
                metrics = run_validation()
            checkpoint("last.pt")
    if writer is not None:
        writer.close()
    seconds = time.perf_counter() - start
    if ddp.main:
        best = f"{progress.best_bleu:.2f}" if progress.best_bleu >= 0 else "none (no validation ran)"
        log.info("done: at step %d after %.0f s of training in this invocation; best validation BLEU %s", progress.step, seconds, best)
    return {**metrics, "step": progress.step, "train_seconds": seconds, "best_bleu": progress.best_bleu, "interrupted": interrupted}


class Updater:
    """One optimizer update: forward and backward over ``update_freq`` micro-batches, then
    clipping, the Adam step and the schedule (Vaswani et al. 2017, §5.3-5.4).

    :func:`train` and ``scripts/bench_train.py`` both run it. The loss of an update is
    normalised by the non-pad target tokens of all its micro-batches on all processes
    (not averaged per micro-batch), so ``update_freq`` k on one process and k processes
    compute the same gradient. Nothing here reads a device value on the host.
    """

    def __init__(self, model: Transformer, tc, device: torch.device, ddp: "Distributed | None" = None, loss_fn=label_smoothed_loss):
        """``loss_fn(logits, target, smoothing) -> LossOutput`` (sums); benchmarks swap in
        other implementations. ``model.cfg.d_model`` sets the noam scale."""
        self.model, self.tc, self.device, self.loss_fn = model, tc, device, loss_fn
        # fused: one kernel for all parameters instead of a Python loop over them (17% of a CPU step).
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=tc.adam_betas, eps=tc.adam_eps, weight_decay=tc.weight_decay, fused=True)
        self.scheduler = build_scheduler(self.optimizer, tc, model.cfg.d_model)
        self.scaler = torch.amp.GradScaler(device.type, enabled=tc.precision == "fp16")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tc.precision)
        distributed = ddp is not None and ddp.enabled
        # Buffers (the position table) are deterministic: no need to broadcast them every step.
        trained = DistributedDataParallel(model, broadcast_buffers=False) if distributed else model
        if tc.compile:
            log.info("train.compile: compiling the training step; the first steps take a minute or more")
        self.trained = torch.compile(trained, dynamic=True) if tc.compile else trained
        self.ddp_model = trained if distributed else None
        self.world_size = ddp.world_size if distributed else 1
        self.last_tokens = 0  # non-pad target tokens of the last update on this process

    def step(self, group: list[Batch]) -> list[LossOutput]:
        """Train on ``group`` (host tensors, up to ``update_freq`` batches) and update once."""
        self.last_tokens = sum(b.n_tgt_tokens for b in group)  # counted on the host: no device sync
        n_update = float(self.last_tokens)
        if self.ddp_model is not None:  # DDP averages gradients over processes, hence world_size
            total = torch.tensor(n_update, device=self.device)
            dist.all_reduce(total)
            scale = self.world_size / total
        else:
            scale = 1.0 / n_update
        self.trained.train()
        outs = []
        for k, batch in enumerate(group):
            batch = batch.to(self.device)
            last = self.ddp_model is None or k == len(group) - 1
            with contextlib.nullcontext() if last else self.ddp_model.no_sync():
                with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None):
                    logits = self.trained(batch.src, batch.tgt_in)
                out = self.loss_fn(logits, batch.tgt_out, self.tc.label_smoothing)
                self.scaler.scale(out.loss * scale).backward()
            outs.append(out)
        if self.tc.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return outs


class Window:
    """Training statistics since the last log line, kept on the device until read."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), device=self.device)
        self.nll = torch.zeros((), device=self.device)
        self.tokens = 0
        self.time = time.perf_counter()

    def add(self, out) -> None:
        self.loss += out.loss.detach()
        self.nll += out.nll.detach()

    def flush(self, progress: Progress, lr: float) -> dict:
        """Per-token means over the window (the one host sync per log interval)."""
        tokens = max(1, self.tokens)
        values = {"step": progress.step, "epoch": progress.epoch, "loss": float(self.loss) / tokens, "nll": float(self.nll) / tokens, "lr": lr}
        values["ppl"] = math.exp(min(values["nll"], 50.0))
        values["tgt_tokens_per_s"] = self.tokens / (time.perf_counter() - self.time)
        self.reset()
        return values


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.info("tensorboard is not installed: no TensorBoard scalars (metrics.jsonl has them all)")
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))
