"""Tokenizers whose ids come from a vocabulary of their own: Marian's (OPUS-MT), as ``transformers``
publishes it.

A Marian model directory cuts text with two SentencePiece models used only to segment
(``source.spm``, ``target.spm``) and numbers the pieces with one vocabulary, ``vocab.json``
(``target_vocab.json`` as well where the target side has its own), whose ids are not the
SentencePiece models' ids: ``</s>`` 0, ``<unk>`` 1, the other pieces as Marian counted them,
and ``<pad>`` last (``transformers``' converter adds it; decoding starts from it).

Every other part of nmt relies on PAD 0, UNK 1, BOS 2, EOS 3 (:mod:`nmt.data.tokenizer`), so a
:class:`Layout` numbers Marian's pieces in that layout:

======  ==========================================================================
nmt id  piece
======  ==========================================================================
0       :data:`PAD_PIECE`, a row nmt adds: padding only, never predicted
1       Marian's ``<unk>``
2       Marian's ``<pad>``: the decoder starts from it, so it is nmt's BOS
3       Marian's ``</s>``
4, ...  Marian's other pieces, in Marian's order
======  ==========================================================================

:class:`MarianTokenizer` keeps :class:`~nmt.data.tokenizer.Tokenizer`'s interface (``encode_src``,
``encode_tgt``, ``decode_tgt``, ``src``/``tgt``, ``protos``, ...); its ``src`` and ``tgt`` are
:class:`Segmenter` objects, which answer what a ``SentencePieceProcessor`` answers (``encode``,
``decode``, ``id_to_piece``, ``get_piece_size``, ``is_byte``, ...) in nmt's ids, so that the
search, alignments, the server and the encoding cache need not know which kind they hold.

Text is cut as ``transformers.MarianTokenizer`` (transformers 5) cuts it, so that the ids are
the same for any text:

* the special tokens' spellings (``</s>``, ``<unk>``, ``<pad>``) are split off and read as
  those tokens, unless the directory's ``tokenizer_config.json`` sets ``split_special_tokens``;
* a fragment that starts with ``>>`` and holds ``<<`` begins with a language code
  (``>>fra<<``), which is one token (multi-target models choose their output language with
  it), looked up in the vocabulary (UNK if it is not there); the rest goes to SentencePiece;
* a piece the vocabulary lacks is UNK;
* no other normalisation: ``MarianTokenizer`` sets up Moses' punctuation normaliser when
  ``sacremoses`` is installed, but does not apply it when it tokenizes.

Decoding is ``MarianTokenizer.batch_decode(ids, skip_special_tokens=True)``: special tokens
(UNK among them) are dropped and the rest joined by the target model's ``decode_pieces``.
"""

# Size: module at most 450 lines: Marian's vocabulary-based tokenizer, read and written as
# transformers publishes it.

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm

from nmt.files import atomic_write

from .tokenizer import BOS, EOS, PAD, UNK, Tokenizer, TokenizerError, encode_options, pieces_of

#: The piece nmt's PAD row stands for. No text encodes to it and it is never predicted; a
#: Marian model has no such row (it pads with its ``<pad>``, which is nmt's BOS).
PAD_PIECE = "<nmt:pad>"
#: The files :meth:`MarianTokenizer.save` writes in a run directory (beside nothing of
#: :class:`Tokenizer`'s).
SAVED = {"src": "spm.src.spm", "tgt": "spm.tgt.spm", "vocab": "spm.vocab.json"}
WORD_START = "\u2581"  # SentencePiece's mark for a space


@dataclass(frozen=True)
class Layout:
    """One Marian vocabulary numbered in nmt's layout (see the module docstring).

    ``pieces``: each nmt id's piece; ``marian_ids``: each nmt id's Marian id (-1 for the PAD row nmt
    adds); ``ids``: piece → nmt id. A vocabulary whose decoding starts from another piece than its
    ``<pad>`` (a directory ``nmt export`` wrote: ``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3)
    keeps its ``<pad>`` as nmt's PAD and its start piece as BOS: no row is added.
    """

    pieces: tuple[str, ...]
    marian_ids: tuple[int, ...]
    ids: dict[str, int] = field(compare=False, repr=False)

    @classmethod
    def of(
        cls,
        vocab: dict[str, int],
        eos: str,
        unk: str,
        pad: str,
        start: str | None = None,
        what: str = "vocab.json",
    ) -> Layout:
        """The layout of ``vocab`` (piece → Marian id), whose special pieces are spelt ``eos``,
        ``unk``, ``pad`` and ``start`` (the piece decoding starts from; ``pad`` when None, as in
        OPUS-MT's).

        Raises:
            TokenizerError: the ids are not 0 … N-1, each once, a special piece is missing or two
                coincide, or :data:`PAD_PIECE` is one of the pieces.
        """
        start = start or pad
        if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and type(v) is int for k, v in vocab.items()
        ):
            raise TokenizerError(f"{what}: not a mapping of pieces to integer ids")
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise TokenizerError(
                f"{what}: its {len(vocab):,} ids are not 0 ... {len(vocab) - 1:,}, each once"
            )
        missing = [p for p in (eos, unk, pad, start) if p not in vocab]
        if missing:
            raise TokenizerError(
                f"{what}: no {', '.join(dict.fromkeys(missing))} piece (the special tokens of "
                "tokenizer_config.json and config.json)"
            )
        if len({eos, unk, pad}) < 3 or start in (eos, unk):
            raise TokenizerError(
                f"{what}: the special tokens {eos}, {unk}, {pad} and the start piece {start} must "
                "be different pieces"
            )
        if PAD_PIECE in vocab:
            raise TokenizerError(
                f"{what}: it has the piece {PAD_PIECE}, which nmt reserves for its padding row"
            )
        special = (
            {PAD_PIECE: PAD, unk: UNK, pad: BOS, eos: EOS}
            if start == pad
            else {pad: PAD, unk: UNK, start: BOS, eos: EOS}
        )
        rest = sorted((p for p in vocab if p not in special), key=vocab.__getitem__)
        pieces = (*special, *rest)
        marian = (*(vocab.get(p, -1) for p in special), *(vocab[p] for p in rest))
        return cls(pieces, marian, {p: i for i, p in enumerate(pieces)})

    @property
    def extra_pad(self) -> bool:
        """Whether nmt's PAD is a row of its own (Marian pads with the piece it starts from)."""
        return self.marian_ids[PAD] < 0

    def to_marian(self) -> list[int]:
        """The nmt id of each Marian id, in Marian's order (an added PAD has none): the rows a
        Marian matrix takes from nmt's."""
        order = [0] * (len(self.pieces) - self.extra_pad)
        for nmt_id, marian_id in enumerate(self.marian_ids):
            if marian_id >= 0:
                order[marian_id] = nmt_id
        return order


def remove_language_code(text: str) -> tuple[str | None, str]:
    """``MarianTokenizer.remove_language_code``: a leading ``>>...<<`` (up to the first ``<<``) and
    the rest."""
    end = text.find("<<") if text.startswith(">>") else -1
    return (text[: end + 2], text[end + 2 :]) if end >= 0 else (None, text)


class Segmenter:
    """One side of a :class:`MarianTokenizer`: a SentencePiece model that cuts text into pieces, and
    the :class:`Layout` that numbers them. Its methods are ``SentencePieceProcessor``'s, in nmt's
    ids."""

    def __init__(
        self,
        sp: spm.SentencePieceProcessor,
        layout: Layout,
        special: tuple[str, ...],
        split_special_tokens: bool,
    ):
        self.sp, self.layout = sp, layout
        # Longest first, so that of two spellings starting at one place the longer wins (as
        # transformers' trie does).
        ordered = sorted((s for s in special if s), key=len, reverse=True)
        self._special = (
            None
            if split_special_tokens or not ordered
            else re.compile("(" + "|".join(map(re.escape, ordered)) + ")")
        )
        self._skipped = frozenset(
            [PAD, BOS, EOS, UNK, *(layout.ids[s] for s in special if s in layout.ids)]
        )

    def get_piece_size(self) -> int:
        """The vocabulary size (Marian's ids, in nmt's layout)."""
        return len(self.layout.pieces)

    def id_to_piece(self, i: int) -> str:
        """The piece of id ``i``."""
        return self.layout.pieces[i]

    def piece_to_id(self, piece: str) -> int:
        """The id of ``piece``; UNK for a piece outside the vocabulary."""
        return self.layout.ids.get(piece, UNK)

    def is_control(self, i: int) -> bool:
        """Whether ``i`` is PAD, BOS or EOS."""
        return i in (PAD, BOS, EOS)

    def is_unknown(self, i: int) -> bool:
        """Whether ``i`` is UNK."""
        return i == UNK

    def is_byte(self, i: int) -> bool:
        """Whether piece ``i`` is one of the SentencePiece model's byte pieces (``<0x41>``)."""
        piece = self.layout.pieces[i]
        own = self.sp.piece_to_id(piece)
        return self.sp.id_to_piece(own) == piece and self.sp.is_byte(own)

    def serialized_model_proto(self) -> bytes:
        """The source segmenter's SentencePiece model, serialized."""
        return self.sp.serialized_model_proto()

    def _fragments(self, line: str) -> list[int | str]:
        """``line`` as ``MarianTokenizer`` cuts it before SentencePiece: ids of special tokens and
        language codes, and text."""
        parts = self._special.split(line) if self._special is not None else [line]
        out: list[int | str] = []
        for k, part in enumerate(parts):
            if k % 2:  # a special token's spelling (the split's captured group)
                out.append(self.piece_to_id(part))
            elif part:
                code, text = remove_language_code(part)
                if code is not None:
                    out.append(self.piece_to_id(code))
                out.append(text)
        return out

    def encode(
        self, lines: list[str] | str, num_threads: int = -1, alpha: float = 0.0
    ) -> list[list[int]] | list[int]:
        """The ids of each line (EOS not appended), as ``MarianTokenizer`` gives them; one line
        gives one list.
        ``alpha`` > 0 samples the pieces (subword regularisation, as
        :meth:`nmt.data.tokenizer.Tokenizer.encode_src`)."""
        if isinstance(lines, str):
            return self.encode([lines], num_threads, alpha)[0]
        cut = [self._fragments(line) for line in lines]
        texts = [part for parts in cut for part in parts if isinstance(part, str)]
        pieces = iter(
            self.sp.encode(texts, out_type=str, **encode_options(num_threads, alpha))
            if texts
            else []
        )
        ids = self.layout.ids.get
        out = []
        for parts in cut:
            seq: list[int] = []
            for part in parts:
                if isinstance(part, str):
                    seq += [ids(p, UNK) for p in next(pieces)]
                else:
                    seq.append(part)
            out.append(seq)
        return out

    def decode(self, ids: list[list[int]] | list[int]) -> list[str] | str:
        """The text of each id sequence, as ``MarianTokenizer.batch_decode(ids,
        skip_special_tokens=True)`` writes it."""
        if not ids:
            return ""
        if isinstance(ids[0], int):
            return self.decode([ids])[0]
        pieces = self.layout.pieces
        return [
            self.sp.decode_pieces([pieces[i] for i in seq if i not in self._skipped])
            .replace(WORD_START, " ")
            .strip()
            for seq in ids
        ]


@dataclass
class MarianTokenizer(Tokenizer):
    """Marian's tokenization (see the module docstring): ``src`` and ``tgt`` are :class:`Segmenter`
    objects.

    ``spec`` is what ``protos()["vocab"]`` stores, as JSON: ``vocab`` (piece → Marian id),
    ``target_vocab`` (the same for the target side, or None where both sides share ``vocab``),
    the special tokens' spellings ``eos``, ``unk``, ``pad`` and ``special`` (all of them), ``start``
    (the piece decoding starts from, when it is not ``pad``),
    ``split_special_tokens``, and ``source_lang``/``target_lang`` as the directory names them.
    """

    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def joint(self) -> bool:
        """One vocabulary for both sides (the two SentencePiece models may still differ)."""
        return self.spec.get("target_vocab") is None

    def encode_src(
        self, lines: list[str], threads: int = -1, alpha: float = 0.0
    ) -> list[list[int]]:
        """Ids of each line as ``MarianTokenizer`` gives them (without the ``</s>`` it appends: nmt
        appends EOS itself); ``alpha`` > 0 samples the pieces."""
        return self.src.encode(lines, num_threads=threads, alpha=alpha)

    def encode_tgt(
        self, lines: list[str], threads: int = -1, alpha: float = 0.0
    ) -> list[list[int]]:
        """Target ids as ``MarianTokenizer(text_target=...)`` gives them (without ``</s>``)."""
        return self.tgt.encode(lines, num_threads=threads, alpha=alpha)

    def src_surfaces(self, line: str) -> list[str]:
        """See :meth:`nmt.data.tokenizer.Tokenizer.src_surfaces`: a special token or language code
        stands for its own spelling."""
        out = []
        for part in self.src._fragments(line):
            if isinstance(part, int):
                out.append(self.src.id_to_piece(part))
            else:
                out += [p.surface.strip() for p in pieces_of(self.src.sp, part)]
        return out

    def protos(self) -> dict[str, bytes]:
        """Both SentencePiece models and the spec (UTF-8 JSON), for storing inside a checkpoint."""
        return {
            "src": self.src.serialized_model_proto(),
            "tgt": self.tgt.serialized_model_proto(),
            "vocab": json.dumps(self.spec, ensure_ascii=False, sort_keys=True).encode("utf-8"),
        }

    @classmethod
    def build(
        cls,
        src_proto: bytes,
        tgt_proto: bytes,
        spec: dict[str, Any],
        what: str = "Marian tokenizer",
    ) -> MarianTokenizer:
        """The tokenizer of two serialized SentencePiece models and a spec (see the class
        docstring).

        Raises:
            TokenizerError: a model does not load, or the spec's vocabularies are not valid
                (:meth:`Layout.of`).
        """
        names = {k: spec.get(k) for k in ("eos", "unk", "pad")}
        if not all(isinstance(v, str) and v for v in names.values()) or not isinstance(
            spec.get("vocab"), dict
        ):
            raise TokenizerError(f"{what}: its spec lacks the vocabulary or a special token")
        special = tuple(dict.fromkeys([*names.values(), *spec.get("special", [])]))
        names["start"] = spec.get("start")
        src_layout = Layout.of(spec["vocab"], **names, what=f"{what} vocabulary")
        tgt_layout = (
            src_layout
            if spec.get("target_vocab") is None
            else Layout.of(spec["target_vocab"], **names, what=f"{what} target vocabulary")
        )
        split = bool(spec.get("split_special_tokens", False))
        sides = [
            Segmenter(_segmenter(proto, f"{what} {name}"), layout, special, split)
            for proto, layout, name in (
                (src_proto, src_layout, "source model"),
                (tgt_proto, tgt_layout, "target model"),
            )
        ]
        return cls(*sides, spec=dict(spec))

    @classmethod
    def from_protos(cls, protos: dict[str, bytes]) -> MarianTokenizer:
        """The tokenizer :meth:`protos` serialized.

        Raises:
            TokenizerError: an entry is missing or does not load.
        """
        try:
            spec = json.loads(protos["vocab"].decode("utf-8"))
        except (KeyError, UnicodeDecodeError, ValueError):
            raise TokenizerError(
                "checkpoint tokenizer: its vocabulary entry is not the UTF-8 JSON nmt stores"
            ) from None
        if not isinstance(spec, dict) or "src" not in protos or "tgt" not in protos:
            raise TokenizerError(
                "checkpoint tokenizer: a vocabulary without both SentencePiece models (src, tgt)"
            )
        return cls.build(protos["src"], protos["tgt"], spec, "checkpoint tokenizer")

    def save(self, directory: Path) -> None:
        """Write :data:`SAVED`'s files in ``directory`` (a run directory; :meth:`load_dir` reads
        them back)."""
        for name, proto in self.protos().items():
            atomic_write(Path(directory) / SAVED[name], proto)

    @classmethod
    def load_dir(cls, directory: Path) -> MarianTokenizer | None:
        """The tokenizer :meth:`save` wrote in ``directory``, or None if there is none."""
        if not (Path(directory) / SAVED["vocab"]).is_file():
            return None
        return cls.from_protos(
            {name: (Path(directory) / filename).read_bytes() for name, filename in SAVED.items()}
        )


def tokenizer_from_protos(protos: dict[str, bytes]) -> Tokenizer:
    """The tokenizer a checkpoint stores (:meth:`Tokenizer.protos`): an imported Marian model's,
    with a vocabulary of its own over two segmenters, or SentencePiece's.

    Raises:
        TokenizerError: an entry is missing or does not load.
    """
    return (
        MarianTokenizer.from_protos(protos) if "vocab" in protos else Tokenizer.from_protos(protos)
    )


def tokenizer_from_dir(directory: Path) -> Tokenizer | None:
    """The tokenizer a run directory holds (:meth:`Tokenizer.save`, :meth:`MarianTokenizer.save`),
    or None."""
    return MarianTokenizer.load_dir(directory) or Tokenizer.load_dir(Path(directory))


def _segmenter(proto: bytes, what: str) -> spm.SentencePieceProcessor:
    """A SentencePiece model that only segments (its own ids are not used, so any special ids
    do)."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.load_from_serialized_proto(proto)
    except (OSError, RuntimeError):
        raise TokenizerError(
            f"{what}: cannot load SentencePiece model: {len(proto):,} bytes that are not one"
        ) from None
    return sp
