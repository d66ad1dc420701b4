"""A decode step whose shapes repeat from step to step, so that a GPU can replay it as a CUDA graph.

On a GPU one decoding step of the Transformer is about 130 small kernels whose launches, not
their arithmetic, take the time (a batch of 32 at beam 5 kept the H200 idle most of each
step). A CUDA graph launches them all at once, but only replays the exact shapes and memory
it was captured with. The dynamic path (:class:`~nmt.core.cache.DecoderCache`) changes both every
step: the key length grows, and finished sentences leave the batch. Here instead:

* :class:`StaticCache` has a fixed capacity; the position a step writes is a ``(1,)`` tensor on
  the device, and self-attention reads every position under a mask of those written so far.
* :class:`StaticScorer` keeps the rows of finished sentences (their output is ignored) until
  the live sentences fit a bucket half the size, and only then compacts; its state maps the
  search's rows (live sentences, sentence-major) to the rows of the buffers.
* A :class:`Slab` holds the buffers of one bucket ``(sentences, source length, capacity)``, a
  power of two of sentences, the source length rounded up to :data:`SOURCE_MULTIPLE`, and a
  capacity that doubles when a step needs more, and, on a GPU, the two graphs that step
  from either of its two key/value buffers (following the beams' back-pointers copies from
  one into the other, as the dynamic cache does). Slabs stay with their model and are reused
  by later batches of the same bucket: :func:`graph_report` says how many and how much memory.

The search itself is unchanged: it calls the same :class:`~nmt.core.scorers.Scorer` methods. On a
CPU the static step runs eagerly (the dynamic one is faster there, docs/performance.md); it
is the twin the tests compare with the dynamic path: the same hypotheses, and scores equal
to float32 rounding (attention over the capacity sums its zeros in another order than over
the written positions, so the last bits may differ).
"""

# Size: module at most 460 lines: the static cache, the arena, its slabs and the scorer that replays
# them are one mechanism.

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from .core.cache import LayerCache, beam_rows

log = logging.getLogger("nmt.graphs")

SOURCE_MULTIPLE = 16  # source lengths of a bucket: 1-16, 17-32, ...
CAPACITY_MULTIPLE = 16  # target capacities are multiples of this, doubled when a step needs more


def sentence_bucket(n: int) -> int:
    """The power of two of sentences whose slab holds ``n`` sentences (``n`` >= 1)."""
    return 1 << (n - 1).bit_length()


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


class StaticCache:
    """A decoder cache of fixed shapes: what :meth:`nmt.core.model.Transformer.decode_step` reads
    and extends.

    ``self_kv``: ``(n_layers, 2, rows, n_heads, capacity, head_dim)``; ``cross_kv``:
    ``(n_layers, 2, sentences, n_heads, src_len, head_dim)``; ``src_mask``: ``(sentences, 1, 1,
    src_len)``; ``length``: ``(1,)`` the position this step writes, on the device. Its methods
    are those of :class:`~nmt.core.cache.DecoderCache` that a step calls: :meth:`append` writes at
    ``length`` and returns the whole capacity with the mask of written positions,
    :meth:`advance_` adds 1 to ``length`` on the device. No host value changes between steps.
    """

    columns = None  # a shortlist changes the output width per batch: the dynamic path serves it

    def __init__(
        self, self_kv: Tensor, cross_kv: Tensor, src_mask: Tensor, beam: int, length: Tensor
    ):
        self.self_kv, self.cross_kv, self.src_mask, self.beam, self.length = (
            self_kv,
            cross_kv,
            src_mask,
            beam,
            length,
        )
        self._positions = torch.arange(self_kv.size(4), device=self_kv.device)
        self._mask: Tensor | None = None

    def layer(self, i: int) -> LayerCache:
        """Decoder layer ``i``'s view: what its self-attention appends to."""
        return LayerCache(self, i)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``layer``'s keys and values ``(rows, n_heads, 1, head_dim)`` at position
        ``length``; returns that layer's keys and values ``(rows, n_heads, capacity, head_dim)`` and
        the mask ``(1, 1, 1, capacity)``, True at positions ``0..length``."""
        kv = self.self_kv[layer]
        kv[0].index_copy_(2, self.length, k)
        kv[1].index_copy_(2, self.length, v)
        if layer == 0:  # every layer is at the same position: one mask a step
            self._mask = (self._positions <= self.length).view(1, 1, 1, -1)
        return kv[0], kv[1], self._mask

    def advance_(self, new: int = 1) -> None:
        """The next step writes ``new`` positions further (on the device)."""
        self.length.add_(new)


class Arena:
    """One model's memory for static decoding, shared by the slabs of every bucket (views of it).

    ``kv``: two buffers ``(n_layers, 2, rows, n_heads, capacity, head_dim)``; ``cross_kv``:
    ``(n_layers, 2, sentences, n_heads, src_len, head_dim)``; ``src_mask``: ``(sentences, 1, 1,
    src_len)``; ``tokens``: ``(rows,)``; ``length``: ``(1,)``. Each axis is the largest any bucket
    has needed, so the memory is that of the largest batch, not of every bucket together; on a
    GPU the graphs share one memory pool (they never run at once). Growing an axis allocates
    anew (zero-filled: unused positions and rows hold finite values, as a masked NaN would still
    poison a sum) and drops the slabs, whose graphs read the old addresses.
    """

    def __init__(self, model, dtype: torch.dtype, device: torch.device):
        cfg = model.cfg
        self.dtype, self.device = dtype, device
        self.layers, self.heads, self.head_dim = (
            cfg.n_decoder_layers,
            cfg.n_heads,
            cfg.d_model // cfg.n_heads,
        )
        self.size = (0, 0, 0, 0)  # rows, capacity, sentences, src_len
        self.slabs: dict[tuple[int, int, int, int], Slab] = {}
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graph_bytes = 0  # GPU memory the captures reserved in the pool

    def slab(self, model, sentences: int, beam: int, src_len: int, capacity: int) -> Slab:
        """The slab of this bucket, made on first use (after growing the arena if it is too
        small)."""
        key = (sentences, beam, src_len, capacity)
        if key not in self.slabs:
            needed = (sentences * beam, capacity, sentences, src_len)
            if any(n > have for n, have in zip(needed, self.size)):
                self._grow(tuple(max(n, have) for n, have in zip(needed, self.size)))
            model.grow_positions(capacity)
            self.slabs[key] = Slab(self, sentences, beam, src_len, capacity)
        return self.slabs[key]

    def _grow(self, size: tuple[int, int, int, int]) -> None:
        rows, capacity, sentences, src_len = self.size = size
        shape, options = (
            (self.layers, 2, rows, self.heads, capacity, self.head_dim),
            dict(dtype=self.dtype, device=self.device),
        )
        self.kv = [torch.zeros(shape, **options) for _ in range(2)]
        self.cross_kv = torch.zeros(
            self.layers, 2, sentences, self.heads, src_len, self.head_dim, **options
        )
        self.src_mask = torch.zeros(sentences, 1, 1, src_len, dtype=torch.bool, device=self.device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.slabs = {}

    def buffer_bytes(self) -> int:
        """Bytes of the arena's tensors."""
        if not self.slabs:
            return 0
        return sum(
            t.numel() * t.element_size()
            for t in (self.tokens, self.length, *self.kv, self.cross_kv, self.src_mask)
        )


class Slab:
    """One bucket: views of its :class:`Arena` of ``sentences*beam`` rows, ``capacity`` positions,
    ``sentences`` slots of ``src_len`` source positions, and, on a GPU, the CUDA graphs of a step
    from either key/value buffer. ``caches``: a :class:`StaticCache` over each buffer."""

    def __init__(self, arena: Arena, sentences: int, beam: int, src_len: int, capacity: int):
        rows = sentences * beam
        self.arena, self.sentences, self.beam, self.src_len, self.capacity = (
            arena,
            sentences,
            beam,
            src_len,
            capacity,
        )
        self.tokens, self.length = arena.tokens[:rows], arena.length
        self.kv = [kv[:, :, :rows, :, :capacity] for kv in arena.kv]
        self.cross_kv = arena.cross_kv[:, :, :sentences, :, :src_len]
        self.src_mask = arena.src_mask[:sentences, ..., :src_len]
        self.caches = [
            StaticCache(kv, self.cross_kv, self.src_mask, beam, self.length) for kv in self.kv
        ]
        self.graphs: list[torch.cuda.CUDAGraph | None] = [None, None]
        self.outputs: list[Tensor | None] = [None, None]
        # where the model's tensors were when the graphs were captured
        self.bound: tuple | None = None
        # what nmt.graph_search keeps here: the search's settings and state, and its graphs
        self.search: tuple | None = None
        self.search_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def load(self, model, cross_kv: Tensor, src_mask: Tensor) -> None:
        """A new batch of ``model``: its sentences' cross-attention keys/values ``(n_layers, 2, n,
        n_heads, src_len, head_dim)`` and source mask ``(n, 1, 1, src_len)`` in the first ``n``
        slots, nothing written yet. Slots past ``n`` attend to one zero key, so that they compute
        finite values. Graphs captured before the model's tensors moved are dropped
        (:func:`bound_memory`)."""
        if self.bound is not None and self.bound != bound_memory(model):
            self.graphs, self.outputs, self.bound = [None, None], [None, None], None
            self.search, self.search_graphs = None, {}
        n, src_len = src_mask.size(0), src_mask.size(-1)
        self.cross_kv.zero_()
        self.cross_kv[:, :, :n, :, :src_len] = cross_kv
        self.src_mask.zero_()
        self.src_mask[:n, ..., :src_len] = src_mask
        self.src_mask[n:, ..., 0] = True
        self.length.zero_()

    def run(self, model, which: int, graphs: bool) -> Tensor:
        """One step from buffer ``which``: log-probabilities ``(rows, vocab)`` in float32 of
        ``tokens``. With ``graphs`` the step is captured the first time and replayed after; the
        returned tensor is then the graph's own output, valid until the next replay of any graph."""
        if not graphs:
            return model.decode_step(self.tokens, self.caches[which])[0]
        if self.graphs[which] is None:
            self._capture(model, which)
        self.graphs[which].replay()
        return self.outputs[which]

    def _capture(self, model, which: int) -> None:
        """Capture the step from buffer ``which`` into the arena's pool (after warm-up runs on a
        side stream, as CUDA graphs need); the warm-up writes at positions not yet written, and
        ``length`` is restored."""
        device = self.tokens.device
        saved = self.length.clone()
        reserved = torch.cuda.memory_reserved(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                model.decode_step(self.tokens, self.caches[which])
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.arena.pool):
                self.outputs[which] = model.decode_step(self.tokens, self.caches[which])[0]
        finally:
            self.length.copy_(saved)
        self.graphs[which], self.bound = graph, bound_memory(model)
        self.arena.graph_bytes += torch.cuda.memory_reserved(device) - reserved


def bound_memory(model) -> tuple[int, ...]:
    """The addresses of the tensors a captured step reads besides its slab. A graph replays reads of
    these addresses, so a table or weight replaced since (the position table grown, the model moved
    or cast) must not be read through it; in-place updates (an optimizer step, ``load_state_dict``)
    keep the addresses and are seen by the next replay."""
    return tuple(t.data_ptr() for t in (model.positions, *model.parameters(), *model.buffers()))


# Each model's arena, kept while the model lives (a GPU reuses its graphs batch after batch).
_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def slab_for(
    model,
    sentences: int,
    beam: int,
    src_len: int,
    capacity: int,
    dtype: torch.dtype,
    device: torch.device,
    keep: bool,
) -> Slab:
    """The slab of this bucket in the model's own arena (made on first use) when ``keep``, else in a
    new one."""
    arena = _ARENAS.get(model) if keep else None
    if arena is None or arena.dtype != dtype or arena.device != device:
        arena = Arena(model, dtype, device)
        if keep:
            _ARENAS[model] = arena
    return arena.slab(model, sentences, beam, src_len, capacity)


def graph_report(model) -> dict:
    """What static decoding keeps for ``model``: its buckets' slabs, the CUDA graphs they captured,
    and the bytes of the arena's buffers and of the graphs' memory pool."""
    arena = _ARENAS.get(model)
    slabs = list(arena.slabs.values()) if arena else []
    return {
        "slabs": len(slabs),
        "graphs": sum(g is not None for s in slabs for g in s.graphs)
        + sum(len(s.search_graphs) for s in slabs),
        "buffer_bytes": arena.buffer_bytes() if arena else 0,
        "graph_pool_bytes": arena.graph_bytes if arena else 0,
        "capture_failed": _BROKEN[0] if _BROKEN else None,
    }


def release_graphs(model) -> None:
    """Forget ``model``'s arena, slabs and graphs (their memory returns to PyTorch's allocator)."""
    _ARENAS.pop(model, None)


@dataclass
class Slots:
    """Where the search's rows are in a slab: the state :class:`StaticScorer` passes the search.

    ``slot``: ``(n,)`` each live sentence's slot; ``rows``: ``(n*beam,)`` the slab rows of the
    search's rows (sentence-major); ``whole``: every slot is live, in order (no row to map);
    ``which``: the buffer the next step reads; ``written``: positions written so far.
    """

    slab: Slab
    slot: Tensor
    rows: Tensor
    whole: bool
    which: int = 0
    written: int = 0


class StaticScorer:
    """The :class:`~nmt.core.scorers.Scorer` over slabs: a step of fixed shapes, replayed as a CUDA
    graph on a GPU."""

    def __init__(self, model, beam: int, graphs: bool):
        self.model, self.beam, self.graphs = model, beam, graphs

    @classmethod
    def start(
        cls,
        model,
        memory: Tensor,
        src_mask: Tensor,
        beam: int,
        capacity: int = 32,
        columns: Tensor | None = None,
    ):
        """The scorer and its first :class:`Slots`: the batch's source side loaded into the slab of
        its bucket.

        Raises:
            ValueError: ``columns`` (a shortlist): the dynamic path serves it.
        """
        if columns is not None:
            raise ValueError(
                "a shortlist changes the output width per batch; decode it with the dynamic cache "
                "(scorer 'cached')"
            )
        graphs = memory.is_cuda and graphs_work()
        n, device = memory.size(0), memory.device
        size = (
            sentence_bucket(n),
            beam,
            round_up(memory.size(1), SOURCE_MULTIPLE),
            round_up(capacity, CAPACITY_MULTIPLE),
        )
        slab = slab_for(model, *size, memory.dtype, device, keep=graphs)
        slab.load(model, cross_kv(model, memory), src_mask)
        slot = torch.arange(n, device=device)
        return cls(model, beam, graphs), Slots(
            slab, slot, beam_rows(slot, beam), whole=n == slab.sentences
        )

    def step(self, prefix: Tensor, state: Slots) -> tuple[Tensor, Slots]:
        """See :meth:`~nmt.core.scorers.Scorer.step`: the slab's rows of finished sentences compute
        too, unread."""
        if state.written == state.slab.capacity:
            state = self._move(state, state.slot, state.slab.sentences, 2 * state.slab.capacity)
        slab, tokens = state.slab, prefix[:, -1]
        if state.whole:
            slab.tokens.copy_(tokens)
        else:
            slab.tokens.index_copy_(0, state.rows, tokens)
        try:
            out = slab.run(self.model, state.which, self.graphs)
        # a capture this device or build cannot make: the step runs eagerly
        except RuntimeError as exc:
            if not self.graphs:
                raise
            graphs_failed(exc)
            self.graphs = False
            out = slab.run(self.model, state.which, False)
        state.written += 1
        if state.whole:
            return (out.clone() if self.graphs else out), state
        return out.index_select(0, state.rows), state

    def reorder(self, state: Slots, index: Tensor) -> Slots:
        """See :meth:`~nmt.core.scorers.Scorer.reorder`: the written positions of the slab's rows
        follow the back-pointers into the other buffer (rows of finished sentences stay where they
        are)."""
        slab = state.slab
        if state.whole:
            full = index
        else:
            full = torch.arange(slab.sentences * slab.beam, device=index.device).index_copy_(
                0, state.rows, state.rows.index_select(0, index)
            )
        source, target, w = slab.kv[state.which], slab.kv[1 - state.which], state.written
        torch.index_select(source[..., :w, :], 2, full, out=target[..., :w, :])
        state.which = 1 - state.which
        return state

    def keep_sentences(self, state: Slots, keep: Tensor) -> Slots:
        """See :meth:`~nmt.core.scorers.Scorer.keep_sentences`: finished sentences' rows stay until
        the live ones fit a bucket of half the slots or less, which they then move to."""
        slot = state.slot.index_select(0, keep)
        smaller = sentence_bucket(slot.numel())
        if smaller < state.slab.sentences:
            return self._move(state, slot, smaller, state.slab.capacity)
        state.slot, state.rows, state.whole = slot, beam_rows(slot, self.beam), False
        return state

    def _move(self, state: Slots, slot: Tensor, sentences: int, capacity: int) -> Slots:
        """The live sentences ``slot`` into the first slots of the slab of ``sentences`` slots and
        ``capacity`` positions (a smaller bucket, or more room), their written positions copied."""
        old, w, n = state.slab, state.written, slot.numel()
        new = old.arena.slab(self.model, sentences, self.beam, old.src_len, capacity)
        new.load(self.model, old.cross_kv.index_select(2, slot), old.src_mask.index_select(0, slot))
        # the other buffer: the new slab may view the same memory
        rows, which = (beam_rows(slot, self.beam), 1 - state.which)
        torch.index_select(
            old.kv[state.which][..., :w, :],
            2,
            rows,
            out=new.kv[which][:, :, : rows.numel(), :, :w, :],
        )
        new.length.fill_(w)
        here = torch.arange(n, device=slot.device)
        return Slots(
            new, here, beam_rows(here, self.beam), whole=n == sentences, which=which, written=w
        )


def cross_kv(model, memory: Tensor) -> Tensor:
    """Every decoder layer's cross-attention keys and values of ``memory`` ``(n, src_len,
    d_model)``: ``(n_layers, 2, n, n_heads, src_len, head_dim)``."""
    return torch.stack([torch.stack(layer.cross_attn.memory_kv(memory)) for layer in model.decoder])


_BROKEN: list[str] = []  # why CUDA graphs failed in this process, once they have


def graphs_work() -> bool:
    """Whether steps are captured as CUDA graphs: False once a capture has failed in this
    process."""
    return not _BROKEN


def graphs_failed(error: Exception) -> None:
    """Record a failed capture: decoding falls back to the dynamic cache, said once in one line."""
    if not _BROKEN:
        _BROKEN.append(
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        log.warning(
            "warning: CUDA graph capture failed (%s); decoding with the dynamic cache instead",
            _BROKEN[0],
        )
