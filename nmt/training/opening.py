"""Opening a run before its first step: the run directory locked, the checkpoint chosen (fresh,
``--resume`` or ``--init-from``), the config settled and the data prepared (tokenizer, encoded
corpora, validation sets). Rank 0 does the work; the other processes read it back.
"""

# Size: module at most 450 lines, open_run() at most 65: a run opened in the order training needs
# it: lock, checkpoint, config, data; open_run() is that order.

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from nmt.config import Config, ConfigError, config_from_dict, config_to_yaml, with_vocab
from nmt.data.clean import clean_pairs, shown, stripped_side, unknowns
from nmt.data.corpus import DataError, ParallelText, check_inputs
from nmt.data.encoded import EncodedCorpus, encode_corpus, encoding_threads
from nmt.data.multilingual import (
    check_tags,
    directions,
    split_text,
    tag_ids,
    tags,
    train_multilingual_tokenizer,
)
from nmt.data.overlap import Overlap, corpus_hashes, duplicate_pairs
from nmt.data.tokenizer import Tokenizer, reservoir_sample, tokenizer_from_config, train_tokenizer
from nmt.data.vocab import tokenizer_from_dir
from nmt.errors import Key
from nmt.files import atomic_write
from nmt.runs.checkpoint import Checkpoint, load_checkpoint
from nmt.runs.progress import Progress
from nmt.runs.rundir import RunDir, absolute_paths, init_config, resume_config
from nmt.scoring import evaluate
from nmt.temporaries import remove_abandoned_temporaries

from .validation import ValidationSet

log = logging.getLogger("nmt.train")

#: Training pairs, drawn through the whole text, on which a tokenizer not trained on it is measured
#: (:func:`warn_if_uncovered`) ...
COVERAGE_SAMPLE = 10_000
#: ... and the share of a side's lines holding the unknown piece from which the run is warned: a
#: tokenizer trained on its own text leaves none (character coverage 1.0, or byte fallback), one of
#: the same language pair from elsewhere well under this, one of another language most lines (an
#: English-German one on French: 98.5%).
MATERIAL_UNKNOWN_LINES = 0.01


@dataclass(frozen=True)
class Prepared:
    """A run's data: its tokenizer, the training corpus (every direction's, one after another) and a
    :class:`~nmt.training.validation.ValidationSet` per direction."""

    tokenizer: Tokenizer
    corpus: EncodedCorpus
    valid: list[ValidationSet]


def prepare(
    cfg: Config,
    run_dir: Path,
    tokenizer: Tokenizer | None,
    write: bool = True,
    foreign: tuple[str, str] | None = None,
) -> Prepared:
    """Read and clean the data, train (or reuse) the tokenizer and encode both splits of every
    direction.

    Training text is streamed: the tokenizer trains on a stream (SentencePiece samples
    ``tokenizer.input_sentence_size`` sentences) and ``data.workers`` SentencePiece threads
    encode it into a memory-mapped cache, so memory does not grow with the corpus. With ``write``
    the tokenizer is saved in ``run_dir`` and encodings cached under ``run_dir/cache``
    (rank 0 does this; other ranks then read them back). Several directions
    (:mod:`nmt.data.multilingual`) give one training corpus of them all, one after another, and a
    validation set each. A tokenizer not trained on this text, ``tokenizer`` with ``foreign`` (where
    it came from, and what to do instead: ``--init-from``) or one the config names, is measured on
    it first (:func:`warn_if_uncovered`).

    Raises:
        DataError: as :func:`nmt.data.corpus.check_inputs`, or no training pair is left after
        cleaning.
    """
    started = time.perf_counter()
    texts = [
        (d, split_text(cfg.data, d, "train"), split_text(cfg.data, d, "valid"))
        for d in directions(cfg.data)
    ]
    if write:
        for _, train_text, valid_text in texts:
            check_inputs(train_text, valid_text)
    if tokenizer is None:
        tokenizer = tokenizer_from_config(cfg.tokenizer)
        foreign = (
            (f"given by {_named_models(cfg.tokenizer)}", "leave those keys unset")
            if tokenizer is not None
            else None
        )
    if tokenizer is None:
        log.info(
            "training SentencePiece %s tokenizer (vocab %d, %s)",
            cfg.tokenizer.type,
            cfg.tokenizer.vocab_size,
            "joint" if cfg.tokenizer.joint else "separate",
        )
        if len(texts) == 1:
            tokenizer = train_tokenizer(
                stripped_side(texts[0][1], 0),
                stripped_side(texts[0][1], 1),
                cfg.tokenizer,
                cfg.train.seed,
            )
        else:
            tokenizer = train_multilingual_tokenizer(
                [(d, t) for d, t, _ in texts], cfg.tokenizer, cfg.train.seed, tags(cfg.data)
            )
        log.info("tokenizer trained in %.1f s", time.perf_counter() - started)
    check_tags(tokenizer, cfg.data)
    if write and foreign:
        for _, train_text, _ in texts:
            warn_if_uncovered(train_text, tokenizer, *foreign, cfg.train.seed)
    if write:
        tokenizer.save(run_dir)
    caching = (Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "cache", write)
    corpora, valid = [], []
    for direction, train_text, valid_text in texts:
        name = str(direction) if len(texts) > 1 else ""
        corpus, hashes = _encode_training_text(cfg, train_text, tokenizer, caching, name, direction)
        corpora.append(corpus)
        valid.append(_validation_set(cfg, valid_text, tokenizer, caching, name, direction, hashes))
    return Prepared(tokenizer, EncodedCorpus.joined(corpora), valid)


def _named_models(tk) -> str:
    """The keys of a :class:`~nmt.config.TokenizerConfig` that name its SentencePiece models, with
    the files."""
    return (
        f"tokenizer.model {tk.model}"
        if tk.joint
        else f"tokenizer.src_model {tk.src_model} and tokenizer.tgt_model {tk.tgt_model}"
    )


def warn_if_uncovered(
    text: ParallelText, tokenizer: Tokenizer, origin: str, instead: str, seed: int
) -> None:
    """Warn in one line for each side of ``text`` (training pairs) of which ``tokenizer``, not
    trained on it, encodes :data:`MATERIAL_UNKNOWN_LINES` of the lines or more to the unknown piece
    (:func:`nmt.data.clean.unknowns`, on :data:`COVERAGE_SAMPLE` pairs drawn with ``seed``): a model
    can never write what its target tokenizer cannot spell, nor read it in a source. ``origin`` says
    where the tokenizer came from, ``instead`` how to train one on this text.

    Raises:
        DataError: as :func:`nmt.data.clean.stripped_side`.
    """
    sample = reservoir_sample(
        zip(stripped_side(text, 0), stripped_side(text, 1)), COVERAGE_SAMPLE, seed
    )
    for k, (side, encode, path, effect) in enumerate(
        (
            ("source", tokenizer.encode_src, text.src_path, "read"),
            ("target", tokenizer.encode_tgt, text.tgt_path, "write"),
        )
    ):
        found = unknowns(encode, [pair[k] for pair in sample])
        if found.holding >= MATERIAL_UNKNOWN_LINES:
            top = (
                ", ".join(f"{shown(ch)} {n:,}" for ch, n in found.missing.most_common(5))
                or "none alone: pieces outside the vocabulary"
            )
            log.warning(
                "warning: the tokenizer %s was not trained on this text: %.1f%% of the %s side's "
                "pieces (%s) are unknown, in %.1f%% of its lines "
                "(%s lines sampled); most frequent missing characters: %s; the model can never %s "
                "them: train a tokenizer on this text (%s), or accept it",
                origin,
                100 * found.pieces,
                side,
                path or text.name,
                100 * found.holding,
                f"{found.lines:,}",
                top,
                effect,
                instead,
            )


def _encode_training_text(
    cfg: Config,
    text: ParallelText,
    tokenizer: Tokenizer,
    caching: tuple[Path, bool],
    name: str,
    direction,
) -> tuple[EncodedCorpus, tuple | None]:
    """One direction's training pairs, cleaned and encoded (or loaded from ``caching``'s directory,
    written when its flag says), and with the flag their hashes
    (:func:`nmt.data.overlap.corpus_hashes`); ``name``: the direction, in a run of several."""
    cache, write = caching
    threads = encoding_threads(cfg.data.workers, cfg.train.threads)
    encoding = time.perf_counter()
    corpus, report = encode_corpus(
        text,
        tokenizer,
        cache,
        cfg.data.max_len,
        cfg.data.max_len_ratio,
        write=write,
        threads=threads,
        src_prefix=tag_ids(tokenizer, cfg.data, direction.tgt),
    )
    hashes = corpus_hashes(corpus) if write else None
    if write:
        log.info(
            "train%s: %s; %d pairs repeat an earlier one; encoded or loaded from %s in %.1f s "
            "(threads: %d)",
            f" {name}" if name else "",
            report,
            duplicate_pairs(hashes[1]),
            cache,
            time.perf_counter() - encoding,
            threads,
        )
    if len(corpus) == 0:
        raise DataError(
            f"no training pairs left after cleaning{f' in {text.name}' if name else ''} "
            f"({report}); check the training files, "
            "data.max_len and data.max_len_ratio"
        )
    return corpus, hashes


def _validation_set(
    cfg: Config,
    text: ParallelText,
    tokenizer: Tokenizer,
    caching: tuple[Path, bool],
    name: str,
    direction,
    train: tuple | None,
) -> ValidationSet:
    """One direction's validation pairs, cleaned (never filtered by length), the first
    ``data.valid_max_sentences``, and encoded (cached under ``caching``'s directory, written when
    its flag says); with the flag, logged with what they share with the direction's training
    pairs (``train``, their hashes), warned about as :meth:`~.Overlap.worth_saying` says."""
    cache, write = caching
    tgt_lang, prefix = direction.tgt, tag_ids(tokenizer, cfg.data, direction.tgt)
    pairs = clean_pairs(tokenizer, *text.read())
    vsrc, vtgt, vreport = pairs.src, pairs.tgt, pairs.report
    if not vsrc:
        raise DataError(
            f"the validation set ({text.name}) has no pair with pieces on both sides ({vreport}); "
            "check those files"
        )
    if cfg.data.valid_max_sentences:
        vsrc, vtgt = vsrc[: cfg.data.valid_max_sentences], vtgt[: cfg.data.valid_max_sentences]
    corpus, _ = encode_corpus(
        ParallelText.lists(vsrc, vtgt), tokenizer, cache, write=write, src_prefix=prefix
    )
    if write:
        capped = (
            f"; the first {len(vsrc)} used (data.valid_max_sentences)"
            if len(vsrc) < vreport.kept
            else ""
        )
        overlap = Overlap.of(train, corpus_hashes(corpus))
        log.info("valid%s: %s%s; %s", f" {name}" if name else "", vreport, capped, overlap)
        if said := overlap.worth_saying(text.name):
            log.warning("warning: %s", said)
        _warn_if_unsegmented(cfg, vtgt, tgt_lang, text.name)
    return ValidationSet(corpus, vsrc, vtgt, name, tgt_lang, prefix)


def _warn_if_unsegmented(cfg: Config, references: list[str], tgt_lang: str, name: str) -> None:
    """Warn in one line when validation references (of the files ``name``) look like Chinese,
    Japanese or Korean text but their language code ``tgt_lang`` chooses 13a
    (:func:`nmt.scoring.evaluate.cjk_language` places no such language in it), which scores such
    text near 0: best.pt and ``train.patience`` would follow a meaningless score."""
    guessed = (
        evaluate.guess_cjk_language(references)
        if cfg.eval.tokenize == "auto" and evaluate.config_tokenizer(cfg, tgt_lang) == "13a"
        else None
    )
    if guessed:
        log.warning(
            "warning: the validation references (%s) look like %s text, but their language code %s "
            "chooses BLEU tokenizer 13a, which scores it near 0 "
            "and best.pt and train.patience would follow that: set eval.tokenize=%s, or name the "
            "language as nmt knows it (%s)",
            name,
            guessed,
            tgt_lang,
            evaluate.LANGUAGE_TOKENIZERS[guessed],
            guessed,
        )


@dataclass
class Opened:
    """What rank 0 found and prepared in the run directory."""

    cfg: Config
    checkpoint: str | None  # the checkpoint resumed from
    resumed: Checkpoint | None  # it, read once
    done: dict | None = None  # a resumed run with nothing left to do: step, best_bleu, message
    data: Prepared | None = None
    # init_from (the checkpoint a fine-tuning run started from) and imported_from, kept in every
    # checkpoint
    origin: dict = field(default_factory=dict)
    init: Checkpoint | None = None  # the checkpoint a new run starts from (--init-from)


def read_back(
    run: RunDir, cfg_dict: dict, checkpoint: str | None, done: dict | None, origin: dict
) -> Opened:
    """On ranks other than 0: rank 0's config, checkpoint, tokenizer and encoded corpora, read
    back."""
    opened = Opened(config_from_dict(cfg_dict), checkpoint, None, done, origin=origin)
    if not done:
        opened.resumed = load_checkpoint(checkpoint, training=True) if checkpoint else None
        if not checkpoint and "init_from" in origin:
            opened.init = load_checkpoint(origin["init_from"]["path"])
        tokenizer = opened.resumed.tokenizer if opened.resumed else tokenizer_from_dir(run.path)
        opened.data = prepare(opened.cfg, run.path, tokenizer, write=False)
    return opened


def _open_init(
    cfg: Config, overrides: list[str], config_file: Path | None, init_from: str | Path
) -> Opened:
    """A new run's start from the checkpoint ``init_from`` (a file, or a run directory's best.pt):
    its payload, the settled config and where the weights came from.

    Raises:
        ConfigError: ``init_from`` is a Hugging Face directory or a directory without best.pt, or
            the config asks for another architecture (:func:`nmt.runs.rundir.init_config`).
    """
    if (Path(init_from) / "config.json").is_file():
        raise ConfigError(
            Key("init_from"),
            f" {init_from} is a Hugging Face directory; import it first: nmt import --format "
            f"huggingface {init_from} --out model.pt, then --init-from model.pt",
        )
    if Path(init_from).is_dir() and not (Path(init_from) / "best.pt").is_file():
        raise ConfigError(
            Key("init_from"),
            f" {init_from} is a directory without best.pt (a run directory means its best.pt); "
            f"pass a checkpoint file, such as {Path(init_from) / 'last.pt'}",
        )
    # a run directory's best.pt, as translate reads it
    init = load_checkpoint(init_from)
    init_from = init.path
    step = init.payload.get("progress", {}).get("step")
    origin = init.payload.get("imported_from")
    settled = init_config(init.payload["config"], cfg, overrides, config_file, init_from)
    opened = Opened(settled, None, None, init=init)
    log.info(
        "initialised from %s (%s%s): its weights and tokenizer; %s, the schedule and the step "
        "counter start afresh",
        init_from,
        f"step {step}" if step is not None else "no step: not trained by nmt",
        f", imported from {origin['path']}" if origin else "",
        "Adam's moments from it"
        if not cfg.train.reset_optimizer and "optimizer" in init.payload
        else "Adam",
    )
    opened.origin = {"init_from": {"path": str(init_from.absolute()), "step": step}} | (
        {"imported_from": origin} if origin else {}
    )
    return opened


def open_run(
    run: RunDir,
    cfg: Config,
    resume: bool,
    overrides: list[str],
    config_file: Path | None,
    init_from: str | Path | None = None,
) -> Opened:
    """Lock the run directory, choose the checkpoint (or start fresh, or from ``init_from``), settle
    the config, prepare the data."""
    tk = cfg.tokenizer
    run.lock(
        resuming=resume, inputs=tuple(Path(m) for m in (tk.model, tk.src_model, tk.tgt_model) if m)
    )
    # what writers killed mid-write left, not what writers at work hold
    remove_abandoned_temporaries(run.path)
    opened, start = Opened(absolute_paths(cfg), None, None), 0
    if init_from is not None:
        opened = _open_init(cfg, overrides, config_file, init_from)
    if resume:
        path, resumed = run.newest_checkpoint()
        payload = resumed.payload
        progress = Progress(**payload["progress"])
        log.info("resuming from %s (step %d)", path, progress.step)
        opened = Opened(
            resume_config(payload["config"], overrides, config_file, path),
            str(path),
            resumed,
            origin={key: payload[key] for key in ("init_from", "imported_from") if key in payload},
        )
        tc = opened.cfg.train
        limits = [
            f"train.max_steps {tc.max_steps}" if progress.step >= tc.max_steps else "",
            f"train.max_epochs {tc.max_epochs}" if progress.epoch >= tc.max_epochs else "",
            f"train.patience {tc.patience}"
            if tc.patience and progress.bad_validations >= tc.patience
            else "",
        ]
        if (
            any(limits)
            and payload["progress"].get("validated_step", progress.step) == progress.step
        ):
            message = (
                f"{run.path} is finished at step {progress.step} "
                f"({', '.join(filter(None, limits))}): "
                "nothing left to do; raise the limit with --set to train on"
            )
            opened.done = {
                "step": progress.step,
                "best_bleu": progress.best_bleu,
                "message": message,
            }
            return opened
        start = progress.step
    else:
        run.check_fresh()
    # now, not at the first validation
    evaluate.check_tokenizer(evaluate.config_tokenizer(opened.cfg))
    given = opened.resumed or opened.init
    tokenizer = given.tokenizer if given else None
    # a resumed run's is its own
    foreign = (
        (f"from --init-from {init_from}", "start without --init-from")
        if opened.init is not None
        else None
    )
    opened.data = prepare(opened.cfg, run.path, tokenizer, foreign=foreign)
    run.keep_history_until(start)
    opened.cfg = with_vocab(
        opened.cfg,
        opened.data.tokenizer.src.get_piece_size(),
        opened.data.tokenizer.tgt.get_piece_size(),
    )
    atomic_write(run.path / "config.yaml", config_to_yaml(opened.cfg))
    return opened
