"""One model for several language pairs (Johnson et al. 2017, "Google's Multilingual Neural
Machine Translation System": one encoder-decoder, one vocabulary, the target chosen by a tag).

* **Directions.** ``data.directions`` lists them, ``SRC-TGT`` each (``[en-de, en-fr, de-en]``);
  without it a run has the one direction ``data.src_lang``-``data.tgt_lang``. Each direction
  reads its own files ``{split}.{src}-{tgt}.{lang}`` from ``data.dir`` (fairseq's names) where
  they exist, else the shared ``{split}.{lang}`` (a multi-way parallel corpus such as Multi30k),
  or its two languages of ``data.hf_dataset``'s ``translation`` rows.
* **Tags.** When the directions have more than one target language, every source starts with
  its target's tag, ``>>fr<<``: OPUS-MT's and Marian's syntax, so an exported model (and an
  imported multi-target OPUS-MT one) takes the same input. The tag is a user-defined piece of
  the joint SentencePiece model (never split) put before the source's pieces by id, the way
  ``MarianTokenizer`` puts it; it is never generated. A model with one target language (one
  direction, or several sources into one target, like OPUS-MT's ``mul-en``) has no tags, and
  one direction trains exactly as before directions existed.
* **Tokenizer.** Trained on every language's text, each language's share of the
  ``tokenizer.input_sentence_size`` sentences in proportion to ``n^(1/T)`` for its ``n``
  sentences and ``T`` = ``tokenizer.sampling_temperature`` (1.5), a small language's
  sentences repeated to fill its share (XLM's sampling, Conneau and Lample 2019, §3.1).
* **Batches.** An epoch draws as many examples as the directions hold together, direction
  ``d`` ``N · p_d`` of them with ``p_d ∝ n_d^(1/T)``, ``T`` = ``data.sampling_temperature``
  (1.5, fairseq's ``--sampling-temperature`` default; Arivazhagan et al. 2019, §4.2): a
  direction above its size repeats its examples, one below it draws a different subset each
  epoch. With ``T`` = 1 that is every example once. Every draw is a function of the seed and
  the epoch, so ``--resume`` and every ``torchrun`` process cut the same batches.
* **Translation.** ``--tgt-lang`` chooses the target (:func:`target`); a direction that was
  not trained (de→fr beside en-de, de-en and en-fr) may be asked for too: zero-shot.

This module needs no torch.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from nmt.errors import Key
from nmt.fields import ConfigError, did_you_mean

from .clean import stripped_side
from .corpus import DataError, ParallelText, load_split
from .tokenizer import (
    AUTO_COVERAGE_SENTENCES,
    UNK,
    Tokenizer,
    TokenizerError,
    coverage_settings,
    reservoir_sample,
    train_sentencepiece,
)

log = logging.getLogger("nmt.train")


@dataclass(frozen=True)
class Direction:
    """A language pair, ``src`` into ``tgt``; written ``SRC-TGT``."""

    src: str
    tgt: str

    def __str__(self) -> str:
        return f"{self.src}-{self.tgt}"


def directions(data) -> tuple[Direction, ...]:
    """The directions ``data`` (a :class:`~nmt.config.DataConfig`) trains: ``data.directions``, else
    its one pair."""
    if data.directions:
        return tuple(Direction(*pair.split("-")) for pair in data.directions)
    return (Direction(data.src_lang, data.tgt_lang),)


def target_languages(data) -> tuple[str, ...]:
    """The languages ``data``'s directions translate into, in the order first written."""
    return tuple(dict.fromkeys(d.tgt for d in directions(data)))


def source_languages(data) -> tuple[str, ...]:
    """The languages ``data``'s directions translate from, in the order first written."""
    return tuple(dict.fromkeys(d.src for d in directions(data)))


def tag(lang: str) -> str:
    """The tag that asks for a translation into ``lang``: ``>>lang<<``."""
    return f">>{lang}<<"


def tags(data) -> tuple[str, ...]:
    """The target tags of ``data``'s model: one per target language when there are several, else
    none."""
    langs = target_languages(data)
    return tuple(map(tag, langs)) if len(langs) > 1 else ()


def check_tags(tokenizer: Tokenizer, data) -> None:
    """Raise unless every target tag of ``data`` is one piece of ``tokenizer``'s source vocabulary.

    Raises:
        TokenizerError: a tag the vocabulary lacks (a reused ``tokenizer.model`` trained without
            it).
    """
    missing = [t for t in tags(data) if tokenizer.src.piece_to_id(t) == UNK]
    if missing:
        raise TokenizerError(
            f"the tokenizer has no piece {', '.join(missing)}: the target tags of data.directions "
            "must be pieces of their own; "
            "let nmt train the tokenizer (it reserves them), or train yours with "
            "user_defined_symbols=" + ",".join(tags(data))
        )


def tag_ids(tokenizer: Tokenizer, data, lang: str) -> tuple[int, ...]:
    """The ids put before a source to translate it into ``lang``: its tag's, or none for a model
    without tags."""
    return (tokenizer.src.piece_to_id(tag(lang)),) if tags(data) else ()


@dataclass(frozen=True)
class Target:
    """What a translation into ``lang`` needs: ``src_prefix``, the ids before each source (its tag,
    or none)."""

    lang: str
    src_prefix: tuple[int, ...] = ()


def target(cfg, tokenizer: Tokenizer, tgt_lang: str | None) -> Target:
    """The target a checkpoint (its :class:`~nmt.config.Config` and tokenizer) translates into when
    asked for ``tgt_lang`` (``--tgt-lang``; None: not given).

    A model of several target languages needs one of them; a model of one takes it, or nothing.
    The source language is not asked: a source language the model never saw with that target
    (de→fr beside en-de, de-en and en-fr) is zero-shot.

    Raises:
        ConfigError: naming ``tgt_lang`` (as :class:`~nmt.errors.Key` data): not given for a model
            of several targets, or not one of the model's targets.
    """
    langs = target_languages(cfg.data)
    if tgt_lang is not None and tgt_lang not in langs:
        into = (
            f"{langs[0]} only (its config's target language)"
            if len(langs) == 1
            else ", ".join(langs)
        )
        if not tgt_lang.strip():
            raise ConfigError(
                Key("tgt_lang"),
                f" {tgt_lang!r}: this model translates into {into}; give a language code "
                f"({', '.join(langs)})",
            )
        # The code a user may have meant by the tag's spelling (>>fr<<) or a region (fr-FR);
        # did_you_mean ignores case (FR).
        meant = tgt_lang.strip().strip("<>").split("-")[0]
        raise ConfigError(
            Key("tgt_lang"),
            f" {tgt_lang}: this model translates into {into}{did_you_mean(meant, langs)}",
        )
    if tgt_lang is None and len(langs) > 1:
        raise ConfigError(
            f"this model translates into {', '.join(langs)} (directions "
            f"{', '.join(map(str, directions(cfg.data)))}): choose one with ",
            Key("tgt_lang"),
        )
    lang = tgt_lang or langs[0]
    return Target(lang, tag_ids(tokenizer, cfg.data, lang))


def split_text(data, direction: Direction, split: str) -> ParallelText:
    """The ``split`` ("train" or "valid") of one ``direction`` of ``data``: its own files
    ``{split}.{src}-{tgt}.{lang}`` in ``data.dir`` where both exist (with ``data.directions``),
    else what :func:`nmt.data.corpus.load_split` finds for the pair. Files are not read yet.

    Raises:
        nmt.data.corpus.DataError: as :func:`~nmt.data.corpus.load_split`.
    """
    if not data.directions:
        return load_split(data, split)
    one = replace(data, src_lang=direction.src, tgt_lang=direction.tgt, directions=None)
    if data.dir:
        stem = f"{data.train_split if split == 'train' else data.valid_split}.{direction}"
        own = [_split_file(Path(data.dir), stem, lang) for lang in (direction.src, direction.tgt)]
        if all(own):
            return ParallelText.files(*own)
    try:
        return load_split(one, split)
    except DataError as exc:
        raise DataError(
            f"data.directions {direction}: {exc}"
            + (f"; or give {stem}.{direction.src} and {stem}.{direction.tgt}" if data.dir else "")
        ) from None


def _split_file(directory: Path, stem: str, lang: str) -> Path | None:
    return next(
        (p for p in (directory / f"{stem}.{lang}", directory / f"{stem}.{lang}.gz") if p.is_file()),
        None,
    )


# ------------------------------------------------------------------------- tokenizer


def language_shares(sizes: dict[str, int], total: int, temperature: float) -> dict[str, int]:
    """How many of ``total`` sentences each language gets, in proportion to ``size^(1/temperature)``
    (at least one each; :func:`temperature_weights`)."""
    weights = temperature_weights(list(sizes.values()), temperature)
    return {lang: max(1, round(total * w)) for lang, w in zip(sizes, weights)}


def temperature_weights(sizes: list[int], temperature: float) -> np.ndarray:
    """``size^(1/T)`` normalised to sum to 1 (Arivazhagan et al. 2019, §4.2), in logs so that no
    power overflows."""
    logs = np.log(np.maximum(np.asarray(sizes, dtype=np.float64), 1)) / temperature
    weights = np.exp(logs - logs.max())
    return weights / weights.sum()


def language_sample(lines, share: int, seed: int) -> list[str]:
    """``share`` sentences of ``lines`` (a stream): a uniform sample when it holds more, else every
    sentence as often as fits and a uniform sample of them for the rest."""
    sample = reservoir_sample(lines, share, seed)
    if not sample or len(sample) >= share:
        return sample
    copies, rest = divmod(share, len(sample))
    return sample * copies + random.Random(seed).sample(sample, rest)


def train_multilingual_tokenizer(
    texts: list[tuple[Direction, ParallelText]], cfg, seed: int, user_defined: tuple[str, ...]
) -> Tokenizer:
    """A joint tokenizer of every language of ``texts`` (each direction's training text), ``cfg``
    a :class:`~nmt.config.TokenizerConfig`, with ``user_defined`` pieces (the target tags).

    A language's text is every distinct file (or dataset column) it has in ``texts``, each read
    once however many directions share it; languages share ``input_sentence_size`` sentences (or
    all the text, when less) by ``cfg.sampling_temperature`` (:func:`language_shares`).
    """
    sources: dict[str, dict[object, tuple[ParallelText, int]]] = {}
    for direction, text in texts:
        for side, lang in enumerate((direction.src, direction.tgt)):
            path = (text.src_path, text.tgt_path)[side]
            sources.setdefault(lang, {}).setdefault(
                path.resolve() if path is not None else (text.name, lang), (text, side)
            )
    sizes = {
        lang: sum(text.check() for text, _ in found.values()) for lang, found in sources.items()
    }
    shares = language_shares(
        sizes, min(cfg.input_sentence_size, sum(sizes.values())), cfg.sampling_temperature
    )
    log.info(
        "tokenizer text by language (tokenizer.sampling_temperature %s): %s",
        cfg.sampling_temperature,
        ", ".join(f"{lang} {shares[lang]:,} of {sizes[lang]:,} sentences" for lang in sizes),
    )
    samples = {}
    for i, (lang, found) in enumerate(sources.items()):
        lines = itertools.chain.from_iterable(
            stripped_side(text, side) for text, side in found.values()
        )
        samples[lang] = language_sample(lines, shares[lang], seed + i)
    coverage, fallback = coverage_settings(
        cfg, {lang: lines[:AUTO_COVERAGE_SENTENCES] for lang, lines in samples.items()}
    )
    sentences = list(itertools.chain.from_iterable(samples.values()))
    sp = train_sentencepiece(
        sentences, cfg.vocab_size, cfg.type, coverage, len(sentences), seed, fallback, user_defined
    )
    return Tokenizer(sp, sp)


# --------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class DirectionMix:
    """How an epoch draws from the corpora of several directions joined one after another
    (:meth:`nmt.data.encoded.EncodedCorpus.joined`): ``sizes`` examples each, mixed at
    ``temperature``."""

    sizes: tuple[int, ...]
    temperature: float

    @property
    def draws(self) -> tuple[int, ...]:
        """Examples of each direction in an epoch: ``N = sum(sizes)`` shared in proportion to
        ``size^(1/T)``, rounded so that they sum to ``N`` (largest remainders first); ``sizes`` at
        ``T`` = 1."""
        total = sum(self.sizes)
        if self.temperature == 1:
            return self.sizes
        quotas = total * temperature_weights(list(self.sizes), self.temperature)
        draws = np.floor(quotas).astype(np.int64)
        for i in np.argsort(-(quotas - draws), kind="stable")[: total - int(draws.sum())]:
            draws[i] += 1
        return tuple(int(n) for n in draws)

    def epoch_examples(self, seed: int, epoch: int) -> np.ndarray:
        """The examples of ``epoch`` (indices into the joined corpora, sorted): direction ``d``'s
        every example ``draws[d] // sizes[d]`` times, and a uniform sample without repeats for the
        rest."""
        # not the stream the sampler sorts and shuffles with
        rng = np.random.default_rng([seed, epoch, 1])
        starts = np.concatenate([[0], np.cumsum(self.sizes)])
        chosen = []
        for start, size, draws in zip(starts, self.sizes, self.draws):
            copies, rest = divmod(draws, size)
            chosen.append(
                start
                + np.concatenate(
                    [np.tile(np.arange(size), copies), rng.choice(size, rest, replace=False)]
                )
            )
        return np.sort(np.concatenate(chosen))

    def describe(self, names: list[str]) -> str:
        """Each direction's share of an epoch, for the log."""
        total = sum(self.draws)
        return ", ".join(
            f"{name} {d:,} of {n:,} pairs ({100 * d / total:.1f}%, each {d / n:.2f} times)"
            for name, n, d in zip(names, self.sizes, self.draws)
        )


# ------------------------------------------------------------------------- validation


def mean_validation(results: dict[str, dict]) -> dict:
    """One validation record of several directions' (``{direction: validate()'s dict}``): the
    mean over directions of BLEU, chrF and the losses (perplexity from the mean NLL), which
    ``best.pt`` and ``train.patience`` follow, then each direction's as ``KEY/DIRECTION``."""
    first = next(iter(results.values()))
    mean = {
        k: float(np.mean([r[k] for r in results.values()]))
        for k in ("bleu", "chrf", "valid_loss", "valid_nll")
    }
    signatures = list(dict.fromkeys(r["bleu_signature"] for r in results.values()))
    out = {
        **mean,
        "valid_ppl": math.exp(min(mean["valid_nll"], 50.0)),
        "bleu_signature": signatures[0] if len(signatures) == 1 else " ; ".join(signatures),
        "example": first["example"],
    }
    for name, r in results.items():
        out |= {
            f"{k}/{name}": r[k]
            for k in (
                "bleu",
                "chrf",
                "valid_loss",
                "valid_nll",
                "valid_ppl",
                "bleu_signature",
                "example",
            )
        }
    return out
