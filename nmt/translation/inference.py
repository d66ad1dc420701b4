"""The one way into decoding: :class:`Inference` holds loaded models on one device in one dtype
and translates lines for every command (translate, evaluate, tune-decode, serve, validation
during training), owning inference mode, the device's attention kernels and decode step
(:mod:`nmt.runtime.device`), and batching; what a call asks travels as one :class:`Decoding`."""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from nmt.config import Config, DecodeConfig
from nmt.core.batching import pad_sources, token_batches
from nmt.core.model import Transformer
from nmt.data.clean import has_text
from nmt.data.tokenizer import BOS, UNK, Tokenizer, tokenizer_difference, unknown_only
from nmt.decode.search import Hypothesis, Sampling, sample_seed, translate_batch
from nmt.decode.steering import Steering
from nmt.errors import Capped
from nmt.runs.checkpoint import CheckpointError, load_checkpoint
from nmt.runtime.device import attention_backends, to_dtype

from .align import add_alignments, copy_unknown
from .shortlist import Shortlist

log = logging.getLogger("nmt.translate")


@dataclass(frozen=True)
class Decoding:
    """How lines are to be translated, as one value: the search settings and what a call adds.

    ``decode``: a :class:`~nmt.config.DecodeConfig`: the search settings (beam size, length
    penalty and limits, n-best, ...), the batch budget ``max_tokens``, ``max_input_pieces`` and
    the decode step (``cache``). ``sampling``: draw ``decode.n_best`` samples per line instead
    of beam search; line ``i``'s draws are seeded by ``sample_seed(sampling.seed, i)`` (``i``
    counting from the start of the whole input). ``alignment``: fill in each hypothesis's
    source-target alignment (:mod:`nmt.translation.align`). ``src_prefix``: piece ids put before
    every line that is translated: a multilingual model's target tag
    (:func:`nmt.data.multilingual.target`); ``max_input_pieces`` and the checks count the line's own
    pieces, alignments index them (a link to the tag is left out), and the output limit counts the
    tag as a source token, as the model reads it. ``shortlist``: restrict each batch's output to the
    target pieces its source pieces (and steering) allow
    (:class:`~nmt.translation.shortlist.Shortlist`): faster, and no longer exact. ``rankings``: more
    ``(normalisation, α)`` pairs the search must be exact for, each line then getting every finished
    hypothesis (what ``nmt tune-decode`` re-ranks). ``replace_unk``: let the search write UNK, and
    give each hypothesis the source text each of its UNK pieces stands for
    (:func:`nmt.translation.align.copy_unknown`; OpenNMT's ``-replace_unk``).
    """

    decode: DecodeConfig
    sampling: Sampling | None = None
    alignment: bool = False
    src_prefix: tuple[int, ...] = ()
    shortlist: Shortlist | None = None
    rankings: tuple[tuple[str, float], ...] = ()
    replace_unk: bool = False


# the kinds of line left untranslated (Inference.untranslatable), as a count of them reads
_UNTRANSLATED = {
    "no_text": "no text to translate",
    "too_long": "over the input length limit",
    "unknown": "only text the vocabulary lacks",
}


@dataclass
class Inference:
    """Models that decode together (one, or an ensemble whose probabilities are averaged), their
    tokenizer and config (the first checkpoint's: hence the decode defaults), on ``device``."""

    models: list[Transformer]
    tokenizer: Tokenizer
    device: torch.device
    cfg: Config | None = None
    said: Capped = field(default_factory=lambda: Capped(log))  # per-line warnings, capped

    @classmethod
    def load(
        cls, paths: list, device: torch.device, dtype: torch.dtype = torch.float32
    ) -> Inference:
        """Read each checkpoint (a file, or a run directory's ``best.pt``) once, onto ``device`` in
        ``dtype`` (:func:`nmt.runtime.device.to_dtype`).

        Raises:
            nmt.runs.checkpoint.CheckpointError: a checkpoint is missing, damaged or inconsistent,
            or its
                tokenizer differs from the first one's (the message names the difference).
        """
        loaded = [load_checkpoint(path) for path in paths]
        for path, other in zip(paths[1:], loaded[1:]):
            difference = tokenizer_difference(loaded[0].tokenizer, other.tokenizer)
            if difference:
                raise CheckpointError(
                    f"{path}: its tokenizer differs from {paths[0]}'s ({difference}); an ensemble "
                    "needs one tokenizer"
                )
        models = [to_dtype(c.model.to(device), dtype) for c in loaded]
        return cls(models, loaded[0].tokenizer, device, loaded[0].config)

    @property
    def model(self) -> Transformer:
        """The first (or only) model."""
        return self.models[0]

    def translate(
        self,
        lines: list[str],
        decoding: Decoding,
        steering: list[Steering] | None = None,
        first_index: int = 0,
        progress: Callable[[int], object] | None = None,
        skipped: Counter | None = None,
    ) -> list[list[Hypothesis]]:
        """Translate every line; returns, in input order, each line's n-best list.

        Lines are sorted by length into batches of at most ``decode.max_tokens`` source tokens
        (padding included), each decoded by :func:`~nmt.decode.search.translate_batch` with the
        device's decode step and attention kernels (:mod:`nmt.runtime.device`), under inference
        mode. A blank line yields an empty list without running the model; so do, each with a
        warning naming it, a line of no text (:func:`nmt.data.clean.has_text`: only format, control
        or space characters such as U+202E, which a tokenizer may keep as pieces the model would
        answer with an invented sentence) or of no pieces, a line of more than
        ``decode.max_input_pieces`` pieces, and a line of only unknown pieces
        (:func:`nmt.data.tokenizer.unknown_only`: an emoji, ``!!!`` or another script outside the
        vocabulary).

        Args:
            decoding: the search settings and what this call adds (:class:`Decoding`).
            steering: per line, its prefix, constraints and banned phrases (:func:`steering`); a
                line whose length limit ended it before its constraints appeared is named in a
                warning, as is a line for which the search found no translation at all.
            first_index: the index of ``lines[0]`` in the whole input (:meth:`stream` calls this per
                buffer).
            progress: told how many more lines are done, batch by batch (a progress bar's
                ``update``).
            skipped: counts the lines left untranslated, by reason (``no_text``, ``too_long``,
                ``unknown``).
        """
        decode, src_prefix = decoding.decode, decoding.src_prefix
        # SentencePiece's normalisation strips whitespace, as in training
        encoded = self.tokenizer.encode_src(lines)
        present = self._translatable(
            lines,
            encoded,
            decode.max_input_pieces,
            first_index,
            skipped if skipped is not None else Counter(),
            decoding.replace_unk,
        )
        ids = (
            [[*src_prefix, *encoded[i]] for i in present]
            if src_prefix
            else [encoded[i] for i in present]
        )
        lengths = np.array([len(s) + 1 for s in ids], dtype=np.int64)
        # each present line's pieces' text, for --replace-unk (the tag's count as none)
        surfaces = (
            [[""] * len(src_prefix) + self.tokenizer.src_surfaces(lines[i]) for i in present]
            if decoding.replace_unk
            else None
        )
        results: list[list[Hypothesis]] = [[] for _ in lines]
        if progress is not None:
            progress(len(lines) - len(present))  # the lines left untranslated are done too
        for batch in token_batches(lengths, decode.max_tokens, np.argsort(lengths, kind="stable")):
            with torch.inference_mode(), attention_backends(self.device):
                hyps = self._batch(ids, present, batch, decoding, steering, first_index, surfaces)
            for i, h in zip(batch, hyps):
                results[present[i]] = h
                if not h:
                    self.said(
                        "the search found no translation",
                        "warning: input line %d: the search found no translation (every piece it "
                        "could write was forbidden, or the model's scores are not numbers); its "
                        "output line is left empty",
                        first_index + present[i] + 1,
                    )
                elif h[0].unmet:
                    self.said(
                        "the length limit ended the translation before its constraints appeared",
                        "warning: input line %d: its length limit ended the translation before %d "
                        "of its constraints appeared; raise --max-len-a or --max-len-b",
                        first_index + present[i] + 1,
                        h[0].unmet,
                    )
            if progress is not None:
                progress(len(batch))
        return results

    def _translatable(
        self,
        lines: list[str],
        encoded: list[list[int]],
        max_input_pieces: int,
        first_index: int,
        skipped: Counter,
        replacing: bool = False,
    ) -> list[int]:
        """The indices of the lines to translate (:meth:`translate`); each other line that is not
        blank is named in a one-line warning and counted in ``skipped`` by reason: ``no_text``,
        ``too_long``, ``unknown``."""
        present = []
        for i, (line, pieces) in enumerate(zip(lines, encoded)):
            why = self.untranslatable(line, pieces, max_input_pieces)
            if why is None:
                present.append(i)
                if UNK in pieces and (unknown := self.tokenizer.unknown_src(line)):
                    self.said(
                        "text the model's vocabulary lacks",
                        "warning: input line %d has text the model's vocabulary lacks (%s): the "
                        "model reads it as unknown and cannot write it%s",
                        first_index + i + 1,
                        ", ".join(map(repr, unknown)),
                        ""
                        if replacing
                        else " (--replace-unk copies it where the translation "
                        "writes an unknown piece)",
                    )
            elif why[0] != "blank":
                self.said(
                    _UNTRANSLATED[why[0]],
                    "warning: input line %d %s: its output line is left empty",
                    first_index + i + 1,
                    why[1],
                )
                skipped[why[0]] += 1
        return present

    def untranslatable(
        self, line: str, pieces: list[int], max_input_pieces: int
    ) -> tuple[str, str] | None:
        """Why ``line`` (encoded as ``pieces``) is not given to the model, as ``(reason, what the
        line has, in words)``, or None when it is. ``blank``; ``no_text``: nothing but format,
        control and space characters (a piece of U+202E is no text,
        :func:`nmt.data.clean.has_text`), or no pieces at all (U+FFFD and U+2581 are spaces to the
        tokenizer); ``too_long``: more than ``max_input_pieces`` (one huge line must not take the
        others down); ``unknown``: only unknown pieces, which the model would answer with an
        invented sentence."""
        if not line.strip():
            return "blank", "is empty"
        if not has_text(line) or not pieces:
            shown = next(f"U+{ord(ch):04X}" for ch in line if not ch.isspace())
            return "no_text", (
                "has no text to translate (only format, control or space characters, or ones the "
                f"tokenizer reads as spaces, such as {shown})"
            )
        if len(pieces) > max_input_pieces:
            return "too_long", (
                f"has {len(pieces)} pieces, over the limit of {max_input_pieces} "
                "(--max-input-pieces)"
            )
        if unknown_only(pieces, self.tokenizer.src):
            named = ", ".join(map(repr, self.tokenizer.unknown_src(line)))
            return "unknown", f"has only text the model's vocabulary lacks ({named})"
        return None

    def _batch(
        self,
        ids: list[list[int]],
        present: list[int],
        batch,
        decoding: Decoding,
        steering,
        first_index: int,
        surfaces: list[list[str]] | None = None,
    ) -> list[list[Hypothesis]]:
        """The n-best lists of the lines ``present[i]`` for ``i`` in ``batch`` (``ids``: the present
        lines' pieces; ``surfaces``: their text, with ``replace_unk``)."""
        decode, sampling, prefix = decoding.decode, decoding.sampling, decoding.src_prefix
        if decoding.replace_unk:
            decode = replace(decode, allow_unk=True)
        sources = [ids[i] for i in batch]
        src = pad_sources(sources).to(self.device)
        seeds = (
            [sample_seed(sampling.seed, first_index + present[i]) for i in batch]
            if sampling is not None
            else None
        )
        steer = [steering[present[i]] for i in batch] if steering else None
        columns = (
            decoding.shortlist.columns(sources, steer) if decoding.shortlist is not None else None
        )
        hyps = translate_batch(
            self.models,
            src,
            decode,
            sampling=sampling,
            seeds=seeds,
            rules=self.tokenizer.output_rules,
            steering=steer,
            columns=columns,
            rankings=decoding.rankings,
        )
        if surfaces is not None:
            hyps = copy_unknown(
                self.models,
                sources,
                [surfaces[i] for i in batch],
                hyps,
                self.device,
                decode.alignment_layer,
            )
        if decoding.alignment:
            hyps = add_alignments(self.models, sources, hyps, self.device, decode.alignment_layer)
            if prefix:
                hyps = [
                    [
                        replace(
                            h,
                            alignment=tuple(
                                (i - len(prefix), j) for i, j in h.alignment if i >= len(prefix)
                            ),
                        )
                        for h in line
                    ]
                    for line in hyps
                ]
        return hyps

    def attention(
        self, line: str, hyp: Hypothesis, src_prefix: tuple[int, ...] = ()
    ) -> tuple[list[str], list[str], torch.Tensor]:
        """What the first model's decoder read while writing ``hyp``, a translation of ``line``
        (after ``src_prefix``, a multilingual model's target tag): the source pieces and the output
        pieces (each ending in ``</s>``), and every decoder layer's cross-attention with heads
        averaged, ``(n_layers, tgt_len, src_len)`` in float32 on the CPU; row ``t`` is the step that
        produced output piece ``t``."""
        ids = [*src_prefix, *self.tokenizer.encode_src([line])[0]]
        with torch.inference_mode():
            src = pad_sources([ids]).to(self.device)
            tgt_in = torch.tensor([[BOS, *hyp.tokens]], device=self.device)
            # (n_layers, tgt_len, src_len)
            weights = self.model.cross_attention(src, tgt_in)[:, 0].mean(1)
        pieces = lambda sp, seq: [sp.id_to_piece(i) for i in seq] + ["</s>"]
        return (
            pieces(self.tokenizer.src, ids),
            pieces(self.tokenizer.tgt, hyp.tokens),
            weights.float().cpu(),
        )

    def stream(
        self,
        buffers: Iterable[list[str]],
        decoding: Decoding,
        steering: Iterable[Steering] | None = None,
        **options,
    ) -> Iterator[tuple[int, list[list[Hypothesis]]]]:
        """Translate input that arrives in buffers of lines, one buffer at a time, so that memory
        is bounded by a buffer and each buffer's output can be written before the next is read.

        Yields ``(index of the buffer's first line in the whole input, its n-best lists)``;
        ``steering`` gives one :class:`~nmt.decode.steering.Steering` per input line, read as the
        lines are; ``options`` are :meth:`translate`'s ``progress`` and ``skipped``.
        """
        first, steering = 0, iter(steering) if steering is not None else None
        for lines in buffers:
            steer = list(itertools.islice(steering, len(lines))) if steering is not None else None
            yield first, self.translate(lines, decoding, steer, first, **options)
            first += len(lines)
        self.said.say_unnamed()  # the input ended: the lines warned of but not named are counted

    def best_strings(self, results: list[list[Hypothesis]]) -> list[str]:
        """Detokenized best hypothesis per input line (empty string for blank input)."""
        return best_strings(self.tokenizer, results)


def best_strings(tokenizer: Tokenizer, results: list[list[Hypothesis]]) -> list[str]:
    """Detokenized best hypothesis per input line (empty string for blank input)."""
    best = [r[0] if r else None for r in results]
    return tokenizer.decode_tgt(
        [h.tokens if h else [] for h in best], [h.copied if h else () for h in best]
    )
