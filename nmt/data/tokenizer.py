"""SentencePiece subword models (Kudo and Richardson 2018), trained with the special-token ids
of :mod:`nmt.core.pieces` (PAD 0, UNK 1, BOS 2, EOS 3) and read back with them checked."""

# Size: module at most 500 lines: training, encoding (and which text a line's pieces cover), the id
# layout and the output rules of one SentencePiece pair.

from __future__ import annotations

import functools
import io
import itertools
import logging
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from nmt.core.pieces import BOS, EOS, PAD, UNK, OutputRules
from nmt.errors import NmtError
from nmt.files import atomic_write

# SentencePiece's mark for a space: the piece "▁" alone, or the start of "▁the"
WORD_BOUNDARY = "\u2581"
#: A target-language tag, ``>>de<<`` (OPUS-MT's and Marian's syntax; see
# :mod:`nmt.data.multilingual`).
TAG = re.compile(r">>[A-Za-z][A-Za-z0-9_]*<<")

#: ``character_coverage: auto`` looks at this many sentences of each side ...
AUTO_COVERAGE_SENTENCES = 10_000
#: ... and treats more distinct characters than this as a large character set. Alphabets
#: stay far below (English 40, German 90 on 10,000 sentences, Cyrillic or Devanagari text
#: with Latin mixed in about 200); Japanese has 1,490, and Chinese and Korean (Hangul
#: syllables) are in the thousands too.
LARGE_CHARACTER_SET = 500

#: Characters no translation may contain: every C0 control (NUL, tab, line feed, carriage return
#: ...), DEL, every C1 control (U+0085 NEXT LINE among them) and the Unicode line and paragraph
#: separators. Each ends a line for some reader (``str.splitlines``, editors, JavaScript) or is
#: invisible in one.
NEVER_OUTPUT = frozenset(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]))
_NEVER_OUTPUT_TO_SPACE = dict.fromkeys(map(ord, NEVER_OUTPUT), " ")

log = logging.getLogger("nmt.tokenizer")


class TokenizerError(NmtError, ValueError):
    """A SentencePiece model is missing, unreadable or has other special-token ids."""


@dataclass
class Tokenizer:
    """Source and target SentencePiece processors (the same object when joint)."""

    src: spm.SentencePieceProcessor
    tgt: spm.SentencePieceProcessor

    @property
    def joint(self) -> bool:
        """Whether source and target share one model (and vocabulary)."""
        return self.src is self.tgt

    def encode_src(
        self, lines: list[str], threads: int = -1, alpha: float = 0.0
    ) -> list[list[int]]:
        """Piece ids of each line (:func:`controls_as_spaces` first); ``threads`` -1 lets
        SentencePiece use every core. Training, validation, translation and serving all
        encode through here, so they all see the same pieces for the same text.

        ``alpha`` > 0 samples a segmentation instead of the best one (subword regularisation,
        ``tokenizer.subword_alpha``): BPE-dropout's merge-dropping probability for a BPE model
        (Provilkov et al. 2020, §2), the smoothing exponent of unigram sampling (Kudo 2018, §3).
        The draws follow SentencePiece's generator, which each call seeds afresh from
        ``spm.set_random_generator_seed``; they use one thread whatever ``threads`` says, since
        the split of lines among several would make them depend on scheduling."""
        return _encode(self.src, lines, threads, alpha)

    def encode_tgt(
        self, lines: list[str], threads: int = -1, alpha: float = 0.0
    ) -> list[list[int]]:
        """Target-side :meth:`encode_src`."""
        return _encode(self.tgt, lines, threads, alpha)

    def unknown_src(self, line: str) -> list[str]:
        """The stretches of ``line`` the source vocabulary reads as UNK (each once, in the order
        they come): what :meth:`encode_src` gives the model as an unknown piece, whose text the
        translation cannot hold."""
        pieces = zip(self.src_surfaces(line), self.encode_src([line])[0])
        return list(dict.fromkeys(text for text, i in pieces if i == UNK and text))

    def src_surfaces(self, line: str) -> list[str]:
        """The text of each piece :meth:`encode_src` gives ``line``, word boundaries stripped."""
        return [p.surface.strip() for p in pieces_of(self.src, controls_as_spaces(line))]

    def decode_tgt(
        self, ids: list[list[int]], copied: list[tuple[str, ...]] | None = None
    ) -> list[str]:
        """Target text of each id sequence; always one line, whatever the ids. ``copied``: per
        sequence, the source text its UNK pieces stand for, in order (``--replace-unk``).

        The search never generates what would break that
        (:class:`nmt.decode.restrictions.Restrictions`); this is the last guard, for ids from
        elsewhere and for a character the length limit cut: byte pieces that do not spell valid
        UTF-8 are dropped (SentencePiece would write U+FFFD for them), and a character of
        :data:`NEVER_OUTPUT` becomes a space.
        """
        values = self.output_rules.byte_values
        if values:
            ids = [_drop_broken_characters(seq, values) for seq in ids]
        texts = self.tgt.decode(ids)
        unknown = self.tgt.decode([UNK])  # " ⁇ ", with the spaces SentencePiece adds around it
        for i, words in enumerate(copied or ()):
            for word in words:  # the spaces of the pieces around it stay
                texts[i] = texts[i].replace(unknown, word, 1)
            texts[i] = texts[i].strip() if words else texts[i]
        return [text.translate(_NEVER_OUTPUT_TO_SPACE) for text in texts]

    @functools.cached_property
    def tgt_pieces(self) -> tuple[str, ...]:
        """Every target piece's text by id (``▁`` marks a word's start), looked up once."""
        return tuple(self.tgt.id_to_piece(i) for i in range(self.tgt.get_piece_size()))

    @functools.cached_property
    def output_rules(self) -> OutputRules:
        """The target vocabulary's :class:`OutputRules`, worked out once. A byte piece is unwritable
        when it is a whole character (below 0x80) of :data:`NEVER_OUTPUT`; multi-byte characters
        are judged as they are spelt, by the search. A target-language tag (``>>de<<``) is
        unwritable too: it chooses what a source is translated into, and is never text."""
        sp = self.tgt
        values = [
            int(sp.id_to_piece(i)[3:5], 16) if sp.is_byte(i) else -1
            for i in range(sp.get_piece_size())
        ]
        unwritable = [
            i
            for i, v in enumerate(values)
            if (0 <= v < 0x80 and chr(v) in NEVER_OUTPUT)
            or (v < 0 and not NEVER_OUTPUT.isdisjoint(sp.id_to_piece(i)))
            or TAG.fullmatch(sp.id_to_piece(i))
        ]
        return OutputRules(tuple(unwritable), tuple(values) if max(values, default=-1) >= 0 else ())

    def protos(self) -> dict[str, bytes]:
        """Serialized models, for storing inside a checkpoint."""
        if self.joint:
            return {"joint": self.src.serialized_model_proto()}
        return {"src": self.src.serialized_model_proto(), "tgt": self.tgt.serialized_model_proto()}

    @classmethod
    def from_protos(cls, protos: dict[str, bytes]) -> "Tokenizer":
        """The SentencePiece tokenizer :meth:`protos` serialized (one with a vocabulary of its own,
        an imported Marian model's, is :func:`nmt.data.vocab.tokenizer_from_protos`'s). Raises
        :class:`TokenizerError` if a model does not load."""
        if "joint" in protos:
            sp = _load(model_proto=protos["joint"], what="checkpoint tokenizer")
            return cls(sp, sp)
        return cls(
            _load(model_proto=protos["src"], what="checkpoint src tokenizer"),
            _load(model_proto=protos["tgt"], what="checkpoint tgt tokenizer"),
        )

    def save(self, directory: Path) -> None:
        """Write ``spm.model`` (joint) or ``spm.src.model`` and ``spm.tgt.model``."""
        for name, proto in self.protos().items():
            filename = "spm.model" if name == "joint" else f"spm.{name}.model"
            atomic_write(directory / filename, proto)

    @classmethod
    def load_dir(cls, directory: Path) -> "Tokenizer | None":
        """The SentencePiece tokenizer :meth:`save` wrote in ``directory``, or None if there is none
        (:func:`nmt.data.vocab.tokenizer_from_dir` reads a Marian vocabulary's too)."""
        if (directory / "spm.model").is_file():
            return cls.from_protos({"joint": (directory / "spm.model").read_bytes()})
        if (directory / "spm.src.model").is_file():
            return cls.from_protos(
                {k: (directory / f"spm.{k}.model").read_bytes() for k in ("src", "tgt")}
            )
        return None


# Control characters (Unicode category Cc: C0 U+0000-U+001F, DEL, C1 U+0080-U+009F) other than
# TAB, which SentencePiece already reads as a space; and the surrogate code points, which only an
# in-memory string or JSON's \uD800 escapes can hold and which SentencePiece cannot take at all.
_SPACED = {c: " " for c in (*range(0x20), *range(0x7F, 0xA0)) if c != 0x09} | {
    c: "\ufffd" for c in range(0xD800, 0xE000)
}


def controls_as_spaces(line: str) -> str:
    r"""``line`` with every control character but TAB replaced by a space, and every surrogate
    code point by U+FFFD (the replacement character), before SentencePiece sees it.

    SentencePiece's ``nmt_nfkc`` normaliser deletes most controls, so that neighbouring
    words fuse (``dog\x01sees`` becomes the pieces of ``dogsees``), keeps NUL and U+0085
    (NEL) as unknown characters, and reads TAB, LF, CR and FF as spaces. Read as spaces,
    controls separate words as a line break does. A surrogate (not a character; UTF-8 cannot
    hold one) would make SentencePiece raise; ``nmt_nfkc`` reads U+FFFD as a space too.
    """
    return line if line.isprintable() else line.translate(_SPACED)


def encode_options(threads: int, alpha: float) -> dict:
    """``SentencePieceProcessor.encode``'s options: ``threads`` threads for the best segmentation,
    or for ``alpha`` > 0 a sampled one on one thread (see :meth:`Tokenizer.encode_src`)."""
    return (
        {"enable_sampling": True, "alpha": alpha, "nbest_size": -1, "num_threads": 1}
        if alpha > 0
        else {"num_threads": threads}
    )


def _encode(
    sp: spm.SentencePieceProcessor, lines: list[str], threads: int, alpha: float
) -> list[list[int]]:
    """:meth:`Tokenizer.encode_src` with one processor."""
    return sp.encode([controls_as_spaces(line) for line in lines], **encode_options(threads, alpha))


def pieces_of(sp: spm.SentencePieceProcessor, text: str):
    """The pieces ``sp`` cuts ``text`` into, each with its ``id``, ``piece`` and ``surface`` (the
    text it covers)."""
    try:
        return sp.encode(text, return_type="proto").pieces
    except TypeError:  # SentencePiece before 0.2.1
        return sp.encode(text, out_type="immutable_proto").pieces


def unknown_only(ids: Sequence[int], sp: spm.SentencePieceProcessor) -> bool:
    """Whether one encoded line (``ids`` of ``sp``, no EOS) has pieces but none a model can
    read: every piece is UNK or the bare word boundary ``▁``.

    A line of characters outside the vocabulary (an emoji, ``!!!``, ``42``, another script,
    without byte fallback) encodes as ``[▁, UNK]``; a model given it invents a sentence, and
    a model trained on it learns to. Training drops such pairs and counts them
    (:data:`nmt.data.clean.UNKNOWN`); translation should warn about such a line and count it.
    A line of no pieces is not "unknown only": it is empty.
    """
    boundary = sp.piece_to_id(WORD_BOUNDARY)  # UNK itself when the vocabulary has no bare "▁"
    return len(ids) > 0 and all(i == UNK or i == boundary for i in ids)


def _load(
    *, model_file: str | None = None, model_proto: bytes | None = None, what: str
) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        if model_file is not None:
            sp.load(model_file)
        else:
            sp.load_from_serialized_proto(model_proto)
    except (OSError, RuntimeError) as exc:
        reason = (
            f"{len(model_proto):,} bytes that are not one"
            if model_proto is not None
            else " ".join(str(exc).split())
        )
        raise TokenizerError(f"{what}: cannot load SentencePiece model: {reason}") from None
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD, UNK, BOS, EOS):
        raise TokenizerError(
            f"{what}: special ids (pad, unk, bos, eos) are {ids}, nmt needs "
            f"{(PAD, UNK, BOS, EOS)}; "
            "retrain it with pad_id=0 unk_id=1 bos_id=2 eos_id=3 or let nmt train train one"
        )
    return sp


def _drop_broken_characters(ids: list[int], byte_values: tuple[int, ...]) -> list[int]:
    """``ids`` without the byte pieces that are not part of a valid UTF-8 character (RFC 3629)."""
    if all(i >= len(byte_values) or byte_values[i] < 0 for i in ids):
        return ids
    out: list[int] = []
    run: list[int] = []
    for i in [*ids, -1]:
        if 0 <= i < len(byte_values) and byte_values[i] >= 0:
            run.append(i)
            continue
        start = 0
        while start < len(run):  # keep each complete, valid character of the run of byte pieces
            lead = byte_values[run[start]]
            size = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            chunk = run[start : start + size]
            try:
                bytes(byte_values[j] for j in chunk).decode("utf-8")
            except UnicodeDecodeError:
                start += 1
                continue
            out += chunk
            start += size
        run = []
        if i >= 0:
            out.append(i)
    return out


def load_model_file(path: str) -> spm.SentencePieceProcessor:
    """A SentencePiece model file with nmt's special ids. Raises :class:`TokenizerError`
    otherwise."""
    if not Path(path).is_file():
        raise TokenizerError(f"SentencePiece model {path} does not exist")
    return _load(model_file=path, what=path)


def reservoir_sample(items: Iterable[str], k: int, seed: int) -> list[str]:
    """``k`` items drawn uniformly without replacement from a stream of unknown length, or all
    of them (in order) when there are at most ``k``. Memory holds ``k`` items, never the stream.

    Algorithm L (Li 1994, "Reservoir-sampling algorithms of time complexity O(n(1 + log(N/n)))"):
    after the first ``k`` items it draws how many to skip, not a number per item. The same
    ``seed`` and stream give the same sample in any process.
    """
    rng = random.Random(seed)
    stream = iter(items)
    sample = list(itertools.islice(stream, k))
    if len(sample) < k:
        return sample

    def u() -> float:  # in (0, 1]: log() is defined
        return 1.0 - rng.random()

    w = math.exp(math.log(u()) / k)
    index, upcoming = k - 1, k - 1 + math.floor(math.log(u()) / math.log1p(-w)) + 1
    for index, item in enumerate(stream, start=k):
        if index == upcoming:
            sample[rng.randrange(k)] = item
            w *= math.exp(math.log(u()) / k)
            upcoming += math.floor(math.log(u()) / math.log1p(-w)) + 1
    return sample


def train_sentencepiece(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    seed: int = 1,
    byte_fallback: bool = False,
    user_defined_symbols: Sequence[str] = (),
) -> spm.SentencePieceProcessor:
    """Train a SentencePiece model in memory on ``input_sentence_size`` of ``sentences``.

    The sentences are sampled here (:func:`reservoir_sample` with ``seed``), not by
    SentencePiece, whose own sampling differs from process to process even with a fixed
    seed and one thread; so a run's config and seed fix its tokenizer. ``vocab_size``
    counts the four special pieces (and, with ``byte_fallback``, the 256 byte pieces
    ``<0x00>`` … ``<0xFF>`` that spell characters outside the vocabulary). If the text is too small
    for the requested size, SentencePiece's own error is raised as :class:`TokenizerError` with the
    largest size it allows; an error raised while reading ``sentences`` (a
    :class:`~nmt.data.corpus.DataError`, say) is raised as it is. ``user_defined_symbols`` (a
    multilingual model's target tags, ``>>de<<``) are pieces of their own, ids 4 on, never split.
    """
    # the text encode_src will give it
    sample = [controls_as_spaces(s) for s in reservoir_sample(sentences, input_sentence_size, seed)]
    buffer = io.BytesIO()
    extra = {"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}
    try:
        spm.SentencePieceTrainer.train(
            **extra,
            sentence_iterator=iter(sample),
            model_writer=buffer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            input_sentence_size=0,  # every sentence given: the sample is already drawn
            shuffle_input_sentence=False,
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as exc:
        hint = "; lower tokenizer.vocab_size" if "Vocabulary size too high" in str(exc) else ""
        if "smaller than required_chars" in str(exc):
            hint = (
                "; raise tokenizer.vocab_size (byte_fallback takes 256 pieces) or lower "
                "tokenizer.character_coverage"
            )
        raise TokenizerError(f"SentencePiece training failed: {str(exc).strip()}{hint}") from None
    return _load(model_proto=buffer.getvalue(), what="trained tokenizer")


def auto_character_coverage(samples: dict[str, list[str]]) -> tuple[float, str]:
    """SentencePiece's recommended ``character_coverage`` for text like ``samples``
    (side name → its first sentences): 0.9995 if any side uses more than
    :data:`LARGE_CHARACTER_SET` distinct characters (Chinese, Japanese, Korean), where
    covering every rare character would spend the vocabulary on pieces seen once; 1.0
    otherwise (alphabetic scripts), so that no character becomes UNK.

    Returns:
        The coverage and the reason, for the log.
    """
    counts = {side: len(set().union(*lines)) for side, lines in samples.items()}
    side, most = max(counts.items(), key=lambda item: item[1])
    found = (
        f"the {side} text has {most:,} distinct characters in its first "
        f"{len(samples[side]):,} "
        "sentences"
    )
    if most > LARGE_CHARACTER_SET:
        return (
            0.9995,
            f"{found}, more than {LARGE_CHARACTER_SET}: a large character set, as in Chinese or "
            "Japanese",
        )
    return 1.0, f"{found}, at most {LARGE_CHARACTER_SET}: an alphabet, every character kept"


def coverage_settings(cfg, heads: dict[str, list[str]]) -> tuple[float, bool]:
    """The character coverage and byte fallback ``cfg`` (a :class:`~nmt.config.TokenizerConfig`)
    asks for, ``auto`` decided from ``heads`` (each side's or language's first sentences) and logged
    with its reason."""
    coverage, fallback = cfg.character_coverage, cfg.byte_fallback
    if coverage == "auto":
        coverage, reason = auto_character_coverage(heads)
        log.info("tokenizer.character_coverage auto: %s (%s)", coverage, reason)
    if fallback == "auto":
        fallback = coverage < 1.0
        log.info(
            "tokenizer.byte_fallback auto: %s (character coverage %s: %s)",
            str(fallback).lower(),
            coverage,
            "characters left out are spelt in bytes, never UNK"
            if fallback
            else "every character has a piece",
        )
    return coverage, fallback


def train_tokenizer(src: Iterable[str], tgt: Iterable[str], cfg, seed: int = 1) -> Tokenizer:
    """Train the tokenizer ``cfg`` (a :class:`~nmt.config.TokenizerConfig`) describes, on
    sentences sampled with ``seed`` (``train.seed``).

    ``src`` and ``tgt`` may be streams; a joint model samples from all of ``src``, then ``tgt``.
    With ``character_coverage: auto`` the first :data:`AUTO_COVERAGE_SENTENCES` of each
    side decide it (:func:`auto_character_coverage`; logged with its reason);
    ``byte_fallback: auto`` is then on for a coverage below 1.0.
    """
    streams = {"source": iter(src), "target": iter(tgt)}
    heads = {
        side: list(itertools.islice(stream, AUTO_COVERAGE_SENTENCES))
        if cfg.character_coverage == "auto"
        else []
        for side, stream in streams.items()
    }
    text = {side: itertools.chain(heads[side], streams[side]) for side in streams}

    def train(sides: tuple[str, ...]) -> spm.SentencePieceProcessor:
        coverage, fallback = coverage_settings(cfg, {side: heads[side] for side in sides})
        sentences = itertools.chain.from_iterable(text[side] for side in sides)
        return train_sentencepiece(
            sentences, cfg.vocab_size, cfg.type, coverage, cfg.input_sentence_size, seed, fallback
        )

    if cfg.joint:
        sp = train(("source", "target"))
        return Tokenizer(sp, sp)
    return Tokenizer(train(("source",)), train(("target",)))


def tokenizer_difference(a: Tokenizer, b: Tokenizer) -> str | None:
    """What first differs between two tokenizers, in words; None if they are the same."""
    if a.joint != b.joint:
        return (
            f"{'joint' if a.joint else 'separate'} vs {'joint' if b.joint else 'separate'} "
            "source/target models"
        )
    for side in ("src", "tgt"):
        x, y = getattr(a, side), getattr(b, side)
        if x.get_piece_size() != y.get_piece_size():
            return f"{side} vocabulary of {x.get_piece_size()} vs {y.get_piece_size()} pieces"
        for i in range(x.get_piece_size()):
            if x.id_to_piece(i) != y.id_to_piece(i):
                return f"{side} piece {i} is {x.id_to_piece(i)!r} vs {y.id_to_piece(i)!r}"
        if x.serialized_model_proto() != y.serialized_model_proto():
            return f"{side} models have the same pieces but other scores or normalisation rules"
    return None


def tokenizer_from_config(cfg) -> Tokenizer | None:
    """Load the models named in ``cfg``, or None when the config asks for training."""
    if cfg.joint and cfg.model:
        sp = load_model_file(cfg.model)
        return Tokenizer(sp, sp)
    if not cfg.joint and cfg.src_model and cfg.tgt_model:
        return Tokenizer(load_model_file(cfg.src_model), load_model_file(cfg.tgt_model))
    return None
