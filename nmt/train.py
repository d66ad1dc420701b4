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

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml

from . import evaluate
from .checkpoint import (
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    tokenizer_from_tensors,
    tokenizer_to_tensors,
)
from .config import Config, ConfigError, apply_overrides, config_from_dict, config_to_dict, with_vocab
from .data import EncodedCorpus, TokenBatchSampler, collate, encode_corpus, load_split, strip_pairs
from .loss import label_smoothed_loss
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


@dataclass
class ValidationSet:
    corpus: EncodedCorpus
    src_lines: list[str]
    ref_lines: list[str]


def prepare(cfg: Config, run_dir: Path, tokenizer: Tokenizer | None) -> tuple[Tokenizer, EncodedCorpus, ValidationSet]:
    """Read and clean the data, train (or reuse) the tokenizer and encode both splits."""
    train_src, train_tgt = load_split(cfg.data, "train")
    valid_src, valid_tgt = load_split(cfg.data, "valid")
    if tokenizer is None:
        tokenizer = tokenizer_from_config(cfg.tokenizer)
    if tokenizer is None:
        src, tgt, _ = strip_pairs(train_src, train_tgt)
        log.info("training SentencePiece %s tokenizer (vocab %d, %s) on %d pairs", cfg.tokenizer.type, cfg.tokenizer.vocab_size, "joint" if cfg.tokenizer.joint else "separate", len(src))
        tokenizer = train_tokenizer(src, tgt, cfg.tokenizer)
    tokenizer.save(run_dir)
    cache = run_dir / "cache"
    corpus, report = encode_corpus(train_src, train_tgt, tokenizer, cache, cfg.data.max_len, cfg.data.max_len_ratio)
    log.info("train: %s", report)
    if len(corpus) == 0:
        raise ConfigError("no training pairs left after cleaning; check data paths, data.max_len and data.max_len_ratio")
    vsrc, vtgt, vreport = strip_pairs(valid_src, valid_tgt)
    if cfg.data.valid_max_sentences:
        vsrc, vtgt = vsrc[: cfg.data.valid_max_sentences], vtgt[: cfg.data.valid_max_sentences]
    valid, _ = encode_corpus(vsrc, vtgt, tokenizer, cache)
    log.info("valid: %s", vreport)
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
        n_tokens += out.n_tokens
    decode = replace(cfg.decode, beam_size=cfg.train.valid_beam_size, n_best=1)
    hyps = best_strings(tokenizer, translate_lines(model, tokenizer, valid.src_lines, decode, device))
    scores = evaluate.score(hyps, [valid.ref_lines])
    nll = nll_sum / max(1, n_tokens)
    return {"valid_loss": loss_sum / max(1, n_tokens), "valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0)), "bleu": scores["bleu"], "chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"], "example": hyps[0] if hyps else ""}


def _write_metrics(run_dir: Path, record: dict) -> None:
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def train(cfg: Config, resume: bool = False, overrides: list[str] | None = None) -> dict:
    """Train a model as ``cfg`` says, or continue the run in ``cfg.train.run_dir``.

    With ``resume``, the configuration, tokenizer, weights, optimizer and schedule states,
    sampler position and RNG states come from ``run_dir/last.pt``; ``overrides``
    (``section.key=value``) may change settings such as ``train.max_steps``.

    Returns:
        The final validation metrics plus ``step`` and ``train_seconds``.

    Raises:
        ConfigError: a fresh run would overwrite an existing run's checkpoints, or
            ``resume`` finds none.
        nmt.data.DataError, nmt.tokenizer.TokenizerError: unusable input.
    """
    run_dir = Path(cfg.train.run_dir)
    payload = None
    if resume:
        if not (run_dir / "last.pt").is_file():
            raise ConfigError(f"--resume: {run_dir / 'last.pt'} does not exist; start a fresh run instead")
        payload = load_checkpoint(run_dir / "last.pt")
        cfg = config_from_dict(apply_overrides(payload["config"], overrides or []), str(run_dir / "last.pt"))
    elif (run_dir / "last.pt").exists():
        raise ConfigError(f"{run_dir} already holds a run (last.pt); pass --resume to continue it or choose another train.run_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    tc = cfg.train
    device = resolve_device(tc.device)
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)

    tokenizer = Tokenizer.from_protos(tokenizer_from_tensors(payload["tokenizer"])) if payload else None
    tokenizer, corpus, valid = prepare(cfg, run_dir, tokenizer)
    cfg = with_vocab(cfg, tokenizer.src.get_piece_size(), tokenizer.tgt.get_piece_size())
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")

    model = Transformer(cfg.model).to(device)
    # fused: one kernel for all parameters instead of a Python loop over them (17% of a CPU step).
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=tc.adam_betas, eps=tc.adam_eps, weight_decay=tc.weight_decay, fused=True)
    scheduler = build_scheduler(optimizer, tc, cfg.model.d_model)
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, tc.max_tokens, tc.seed)
    progress = Progress()
    if payload:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        progress = Progress(**payload["progress"])
        set_rng_state(payload["rng"])
        log.info("resumed %s at step %d (epoch %d, batch %d)", run_dir, progress.step, progress.epoch, progress.batch_in_epoch)
    log.info("model: %s parameters; %d training pairs, padding %.1f%% of batch tokens", f"{count_parameters(model):,}", len(corpus), 100 * sampler.padding_fraction(progress.epoch))

    def checkpoint(name: str) -> None:
        save_checkpoint(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "progress": vars(progress).copy(),
                "rng": rng_state(),
                "config": config_to_dict(cfg),
                "tokenizer": tokenizer_to_tensors(tokenizer.protos()),
            },
            run_dir / name,
        )

    def run_validation() -> dict:
        metrics = validate(model, tokenizer, valid, cfg, device)
        improved = metrics["bleu"] > progress.best_bleu
        if improved:
            progress.best_bleu = metrics["bleu"]
        log.info("step %d validation: loss %.3f ppl %.2f BLEU %.2f chrF %.2f%s | %s", progress.step, metrics["valid_loss"], metrics["valid_ppl"], metrics["bleu"], metrics["chrf"], " (best)" if improved else "", metrics["example"])
        _write_metrics(run_dir, {"step": progress.step, **{k: v for k, v in metrics.items() if k != "example"}})
        if improved:
            checkpoint("best.pt")
        return metrics

    start = time.perf_counter()
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "time": time.perf_counter()}
    metrics: dict = {}
    stop = False
    while not stop and progress.step < tc.max_steps and progress.epoch < tc.max_epochs:
        batches = sampler.epoch_batches(progress.epoch)
        while progress.batch_in_epoch < len(batches):
            batch = collate(corpus, batches[progress.batch_in_epoch]).to(device)
            progress.batch_in_epoch += 1
            model.train()
            out = label_smoothed_loss(model(batch.src, batch.tgt_in), batch.tgt_out, tc.label_smoothing)
            (out.loss / out.n_tokens).backward()
            if tc.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            progress.step += 1
            window["loss"] += out.loss.item()
            window["nll"] += out.nll.item()
            window["tokens"] += out.n_tokens
            metrics = {}
            if progress.step % tc.log_every == 0:
                elapsed = time.perf_counter() - window["time"]
                record = {"step": progress.step, "epoch": progress.epoch, "loss": window["loss"] / window["tokens"], "nll": window["nll"] / window["tokens"], "lr": scheduler.get_last_lr()[0], "tgt_tokens_per_s": window["tokens"] / elapsed}
                record["ppl"] = math.exp(min(record["nll"], 50.0))
                log.info("step %d epoch %d: loss %.3f ppl %.2f lr %.2e %.0f tgt tok/s", record["step"], record["epoch"], record["loss"], record["ppl"], record["lr"], record["tgt_tokens_per_s"])
                _write_metrics(run_dir, record)
                window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "time": time.perf_counter()}
            if progress.step % tc.validate_every == 0:
                metrics = run_validation()
                checkpoint("last.pt")
            if tc.save_every and progress.step % tc.save_every == 0:
                checkpoint(f"step_{progress.step}.pt")
                for old in sorted(run_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))[: -tc.keep_last]:
                    old.unlink()
            if progress.step >= tc.max_steps or (tc.max_time_s and time.perf_counter() - start >= tc.max_time_s):
                stop = True
                break
        else:
            progress.epoch += 1
            progress.batch_in_epoch = 0
    if not metrics:
        metrics = run_validation()
    checkpoint("last.pt")
    seconds = time.perf_counter() - start
    log.info("done: %d steps in %.0f s, best validation BLEU %.2f", progress.step, seconds, progress.best_bleu)
    return {**metrics, "step": progress.step, "train_seconds": seconds, "best_bleu": progress.best_bleu}
