"""Source-target piece alignments read off the decoder's cross-attention.

Which attention: ``decode.alignment_layer`` if set, else the penultimate decoder layer of a
decoder of three or more layers and the last layer of a shallower one, with its heads averaged. Garg
et al. 2019 ("Jointly Learning to Align and Translate with Transformer Models", §3 and Table 2)
found the penultimate layer's attention the closest to human alignments in a Transformer trained
without alignment supervision, while the last layer attends more to what helps predict the next word
than to the word being translated. Single heads specialise (some look at the source EOS or at
neighbouring pieces); their average is what fairseq's ``--print-alignment`` uses too. An ensemble
averages its models' matrices. In a two-layer decoder the penultimate layer is the first, which
reads the source before the decoder has formed its target-side states: on a perfectly translated toy
sentence 4 of its 10 links were right while the second layer's attention was a clean diagonal, so
two layers use the last. Choose another with ``--alignment-layer`` after looking at ``nmt plot
attention``: the layer whose heatmap is closest to a one-to-one diagonal on sentences whose
word order you know is the one to read.

Each target piece ``j`` is aligned to the source piece ``i`` that the step predicting ``j``
attends to most (the source EOS excluded), written ``i-j`` with 0-based piece indices: the
format of fairseq, Moses and fast_align tools.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from nmt.core.batching import pad_sources
from nmt.data.tokenizer import BOS, PAD, UNK
from nmt.decode.search import Hypothesis


def alignment_layer(n_layers: int, chosen: int | None = None) -> int:
    """The 0-based decoder layer alignments are read from: ``chosen`` (1-based,
    ``decode.alignment_layer``), else the penultimate of three or more layers, the last of fewer
    (see the module docstring)."""
    if chosen is not None:
        return chosen - 1
    return n_layers - 2 if n_layers >= 3 else n_layers - 1


def attention_matrix(models, src: Tensor, tgt_in: Tensor, layer: int | None = None) -> Tensor:
    """Heads-averaged cross-attention of decoder layer ``layer`` (1-based; default
    :func:`alignment_layer`'s), averaged over ``models``: ``(batch, tgt_len, src_len)`` for ``src``
    ``(batch, src_len)`` and ``tgt_in`` ``(batch, tgt_len)`` (starting with BOS)."""
    matrices = []
    for model in models:
        weights = model.cross_attention(src, tgt_in)  # (n_layers, batch, n_heads, tgt_len, src_len)
        matrices.append(weights[alignment_layer(weights.size(0), layer)].mean(1))
    return torch.stack(matrices).mean(0)


def hard_alignment(attention: Tensor, n_src: int, n_tgt: int) -> tuple[tuple[int, int], ...]:
    """``(i, j)`` pairs: target piece ``j < n_tgt`` aligned to its most attended source piece
    ``i < n_src`` (the source EOS and padding beyond ``n_src`` excluded), from ``attention``
    ``(tgt_len, src_len)``."""
    if n_src == 0:
        return ()
    return tuple((int(i), j) for j, i in enumerate(attention[:n_tgt, :n_src].argmax(-1).tolist()))


def format_alignment(pairs: tuple[tuple[int, int], ...]) -> str:
    """``0-0 1-2 ...``: fairseq's and Moses' ``source-target`` format."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def add_alignments(
    models,
    sources: list[list[int]],
    results: list[list[Hypothesis]],
    device,
    layer: int | None = None,
) -> list[list[Hypothesis]]:
    """``results`` with every hypothesis's :attr:`~nmt.decode.beams.Hypothesis.alignment` filled in.

    ``sources``: each sentence's source piece ids (EOS not included); ``layer``: the decoder
    layer (1-based; None: :func:`alignment_layer`'s default). All hypotheses of the batch are
    teacher-forced together in one pass per model.
    """
    pairs = [(s, h) for s, hyps in enumerate(results) for h in hyps]
    if not pairs:
        return results
    src = pad_sources([sources[s] for s, _ in pairs]).to(device)
    tgt_in = pad_sequence(
        [torch.tensor([BOS, *h.tokens]) for _, h in pairs], batch_first=True, padding_value=PAD
    ).to(device)
    attention = attention_matrix(models, src, tgt_in, layer)
    aligned = iter(
        replace(h, alignment=hard_alignment(a, len(sources[s]), len(h.tokens)))
        for (s, h), a in zip(pairs, attention)
    )
    return [[next(aligned) for _ in hyps] for hyps in results]


def _text_at(surfaces: list[str], i: int) -> str:
    """The text of source piece ``i``; for a piece without text, SentencePiece's bare word
    boundary ``▁`` before a piece it keeps apart (an unknown one: ``▁`` ``龍``), the text of the
    piece it opens, the next one with text."""
    return next((text for text in surfaces[i:] if text), "")


def copy_unknown(
    models,
    sources: list[list[int]],
    surfaces: list[list[str]],
    results: list[list[Hypothesis]],
    device,
    layer: int | None = None,
) -> list[list[Hypothesis]]:
    """``results`` with each hypothesis that holds UNK pieces given the source text they stand for
    (:attr:`~nmt.decode.beams.Hypothesis.copied`): for each UNK piece, the text of the source piece
    the step that wrote it attends to most (its alignment, see the module docstring), as
    OpenNMT's ``-replace_unk`` copies the most attended source word.

    ``sources``: each sentence's source piece ids (EOS not included); ``surfaces``: the text of
    each of those pieces (:meth:`nmt.data.tokenizer.Tokenizer.src_surfaces`).
    """
    unknown = [[h for h in hyps if UNK in h.tokens] for hyps in results]
    aligned = iter(
        h for hyps in add_alignments(models, sources, unknown, device, layer) for h in hyps
    )
    out = []
    for s, hyps in enumerate(results):
        out.append([])
        for h in hyps:
            if UNK not in h.tokens:
                out[-1].append(h)
                continue
            source = {j: _text_at(surfaces[s], i) for i, j in next(aligned).alignment}
            words = tuple(source.get(j, "") for j, t in enumerate(h.tokens) if t == UNK)
            out[-1].append(replace(h, copied=words))
    return out
