"""The decoder cache: what one decoding step of the Transformer reads and extends.

Shapes as in :mod:`nmt.core.model`: ``batch`` sentences, ``beam`` hypotheses each, rows of
``(batch*beam, ...)`` tensors ordered sentence-major (row ``b*beam + k``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

#: Why the cache refuses keys and values that record autograd. Each layer writes into one shared
#: buffer in place; under autograd the buffer's history then holds the saved views of it that
#: later layers read, a reference cycle inside the autograd graph that Python's garbage collector
#: cannot see, so every step's graph stayed alive after the decode returned (2.4x slower decoding
#: and a memory peak that grew with every batch). Decoding runs under ``torch.inference_mode()``
#: (:func:`nmt.decode.search.translate_batch`); a caller outside it gets this error, not the leak.
RECORDING = (
    "the decoder cache was written with tensors that record autograd (which would keep every "
    "step's graph alive); "
    "decode under torch.inference_mode(), as nmt.decode.search.translate_batch does"
)


def beam_rows(keep: Tensor, beam: int) -> Tensor:
    """Flat ``(len(keep)*beam,)`` row indices of every beam of sentences ``keep`` ``(n,)``."""
    return (keep.unsqueeze(1) * beam + torch.arange(beam, device=keep.device)).view(-1)


@dataclass(frozen=True)
class OutputColumns:
    """The target pieces a batch may generate (a vocabulary shortlist,
    :mod:`nmt.translation.shortlist`): ``ids`` ``(n,)`` sorted target ids out of ``vocab``, and
    their rows of the output matrix, ``weight`` ``(n, d_model)`` and ``bias`` ``(n,)`` (or None),
    gathered once per batch from the model's own (float) output matrix: an int8 model's quantized
    copy of it is not used here."""

    ids: Tensor
    weight: Tensor
    bias: Tensor | None
    vocab: int

    def log_probs(self, h: Tensor) -> Tensor:
        """Log-probabilities ``(..., vocab)`` in float32 from decoder states ``(..., d_model)``: the
        log-softmax over these columns only (normalised over them, as Marian's shortlist is),
        -inf in every other column, so the search and its restrictions see the usual width."""
        sub = F.log_softmax(F.linear(h, self.weight, self.bias).float(), dim=-1)
        # 3x index_copy_'s speed here
        return sub.new_full((*sub.shape[:-1], self.vocab), float("-inf")).scatter_(
            -1, self.ids.expand_as(sub), sub
        )


class DecoderCache:
    """Everything a decode step needs besides the new tokens; the only writer of its tensors.

    ``self_kv``: ``(n_layers, 2, batch*beam, n_heads, capacity, head_dim)``, every layer's
    self-attention keys (``[:, 0]``) and values (``[:, 1]``), one row per hypothesis; positions
    below ``length`` are filled. One tensor, so that following the beams' back-pointers is a
    single ``index_select``. ``capacity`` grows by doubling when a step needs more, so a
    generous length limit costs nothing until a hypothesis gets that long.

    ``cross_kv``: ``(n_layers, 2, batch, n_heads, src_len, head_dim)``, computed once from the
    encoder output and shared by each sentence's beams. ``src_mask``: ``(batch, 1, 1,
    src_len)``, True on real source tokens. ``columns``: the :class:`OutputColumns` the batch's
    log-probabilities are computed over, None for the whole vocabulary.

    It changes only through its own methods, each in place: :meth:`append` (one layer's
    keys and values of the new position) and :meth:`advance_` (the position then counts),
    :meth:`reorder_` (follow back-pointers) and :meth:`keep_sentences_` (drop finished
    sentences). The last two copy rows into a spare buffer and swap the two, so that following
    the beams every step alternates between two buffers instead of allocating (and, on a
    CPU, page-faulting in) a new one each time.
    """

    def __init__(
        self,
        self_kv: Tensor,
        cross_kv: Tensor,
        src_mask: Tensor,
        beam: int,
        columns: OutputColumns | None = None,
    ):
        self.self_kv, self.cross_kv, self.src_mask, self.beam, self.columns = (
            self_kv,
            cross_kv,
            src_mask,
            beam,
            columns,
        )
        self.length = 0
        self._spare: Tensor | None = None

    def layer(self, i: int) -> LayerCache:
        """Decoder layer ``i``'s view: what its self-attention appends to."""
        return LayerCache(self, i)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, None]:
        """Write ``layer``'s keys and values ``k``/``v`` ``(batch*beam, n_heads, new, head_dim)`` at
        positions ``length..length+new-1`` (growing the capacity if needed), and return that
        layer's keys and values of every position so far, ``(batch*beam, n_heads, length+new,
        head_dim)``, and None: no mask, as every position returned is written."""
        if k.requires_grad or v.requires_grad:
            raise RuntimeError(RECORDING)
        end = self.length + k.size(2)
        if end > self.self_kv.size(4):
            self._grow(end)
        kv = self.self_kv[layer]
        kv[0, :, :, self.length : end] = k
        kv[1, :, :, self.length : end] = v
        return kv[0, :, :, :end], kv[1, :, :, :end], None

    def advance_(self, new: int = 1) -> None:
        """Count the ``new`` positions every layer has appended."""
        self.length += new

    def reorder_(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` ``(batch*beam,)`` (flat back-pointers).

        Only the per-hypothesis self-attention keys/values move; the source side is
        shared by a sentence's beams and stays where it is.
        """
        self._gather_rows_(index)

    def keep_sentences_(self, keep: Tensor) -> None:
        """Keep sentences ``keep`` ``(new_batch,)`` (dropping finished ones), all their beams."""
        self._gather_rows_(beam_rows(keep, self.beam))
        self.cross_kv, self.src_mask = (
            self.cross_kv.index_select(2, keep),
            self.src_mask.index_select(0, keep),
        )

    def _gather_rows_(self, index: Tensor) -> None:
        """``self_kv`` becomes its rows ``index`` (positions below ``length``), written into the
        spare buffer when it fits."""
        n, shape, spare = index.numel(), self.self_kv.shape, self._spare
        if (
            spare is None
            or spare.size(2) < n
            or spare.shape[:2] != shape[:2]
            or spare.shape[3:] != shape[3:]
        ):
            spare = self.self_kv.new_empty((*shape[:2], n, *shape[3:]))
        out = spare[:, :, :n]
        torch.index_select(
            self.self_kv[..., : self.length, :], 2, index, out=out[..., : self.length, :]
        )
        self._spare, self.self_kv = self.self_kv, out

    def _grow(self, needed: int) -> None:
        """Room for at least ``needed`` positions: the capacity doubles (at least)."""
        shape = list(self.self_kv.shape)
        shape[4] = max(needed, 2 * shape[4])
        grown = self.self_kv.new_empty(shape)
        grown[..., : self.length, :] = self.self_kv[..., : self.length, :]
        self.self_kv, self._spare = grown, None


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's part of a :class:`DecoderCache` (or of a
    :class:`~nmt.decode.static.StaticCache`): its self-attention calls :meth:`append`, which returns
    the keys, the values and a mask or None."""

    cache: DecoderCache
    index: int

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """See :meth:`DecoderCache.append`."""
        return self.cache.append(self.index, k, v)
