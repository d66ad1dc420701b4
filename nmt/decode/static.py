"""The search's step in fixed shapes, so that a GPU can replay it as a CUDA graph.

On a GPU one decoding step of the Transformer is about 130 small kernels whose launches, not
their arithmetic, take the time (a batch of 32 at beam 5 kept the H200 idle most of each
step), and the search between steps read the device about 6 times a step (at batch 128, 46 ms of
kernels in a 202 ms batch). A CUDA graph launches a whole step at once, but only replays the exact
shapes and memory it was captured with. The dynamic cache (:class:`~nmt.core.cache.DecoderCache`)
changes both every step: the key length grows, and settled sentences leave the batch. Here
instead:

* :class:`StaticCache` has a fixed capacity; the position a step writes is a ``(1,)`` tensor on
  the device, and self-attention reads every position under a mask of those written so far.
* A :class:`Slab` holds the buffers of one bucket ``(sentences, source length, capacity)``: a
  power of two of sentences, the source length rounded up to :data:`SOURCE_MULTIPLE` and the
  capacity to :data:`CAPACITY_MULTIPLE`, with the search's own state
  (:class:`~nmt.decode.beams.Beams`) for each settings. Settled sentences stay, masked. Slabs
  stay with their model and are reused by later batches of the same bucket (:func:`graph_report`).
* :class:`StaticStep` runs the search's step over a slab. On a GPU (:func:`capture`) it captures
  the whole step, the model's and the search's with the cache's reorder, as one graph per
  key/value buffer and count of positions the reorder copies, when first needed, and replays it;
  a sampled or steered search, whose choice reads the host, captures the model's part only.

On a CPU the same step runs eagerly (the dynamic cache is faster there, docs/performance.md): the
twin the tests compare with the dynamic path, the same hypotheses with scores equal to float32
rounding (attention over the capacity sums its masked zeros in another order).
"""

# Size: module at most 415 lines: the static cache, its arena and slabs, and the step that captures
# them are one mechanism: a graph reads the slabs' addresses, and a slab holds its graphs.

from __future__ import annotations

import logging
import weakref

import torch
from torch import Tensor

from nmt.core.cache import LayerCache

log = logging.getLogger("nmt.graphs")

SOURCE_MULTIPLE = 16  # source lengths of a bucket: 1-16, 17-32, ...
CAPACITY_MULTIPLE = 16  # target capacities are multiples of this
# The longest output (pieces and EOS) a static step serves: its capacity is set for the batch's
# limit up front, where the dynamic cache starts small and doubles.
STATIC_CAPACITY = 256


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
    src_len)``; ``length``: ``(1,)``. Each axis is the largest any bucket
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
        self.slabs = {}

    def buffer_bytes(self) -> int:
        """Bytes of the arena's tensors."""
        if not self.slabs:
            return 0
        return sum(
            t.numel() * t.element_size()
            for t in (self.length, *self.kv, self.cross_kv, self.src_mask)
        )


class Slab:
    """One bucket: views of its :class:`Arena` of ``sentences*beam`` rows, ``capacity`` positions,
    ``sentences`` slots of ``src_len`` source positions; ``caches``: a :class:`StaticCache` over
    each key/value buffer. ``search``: the search's settings and its state (:class:`~nmt.decode.
    beams.Beams` and restrictions, at fixed addresses for the graphs); ``graphs``: the CUDA graphs
    captured for it, by key (see :meth:`StaticStep.run`)."""

    def __init__(self, arena: Arena, sentences: int, beam: int, src_len: int, capacity: int):
        rows = sentences * beam
        self.arena, self.sentences, self.beam, self.src_len, self.capacity = (
            arena,
            sentences,
            beam,
            src_len,
            capacity,
        )
        self.length = arena.length
        self.kv = [kv[:, :, :rows, :, :capacity] for kv in arena.kv]
        self.cross_kv = arena.cross_kv[:, :, :sentences, :, :src_len]
        self.src_mask = arena.src_mask[:sentences, ..., :src_len]
        self.caches = [
            StaticCache(kv, self.cross_kv, self.src_mask, beam, self.length) for kv in self.kv
        ]
        # where the model's tensors were when the graphs were captured
        self.bound: tuple | None = None
        self.search: tuple | None = None
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor | None]] = {}

    def load(self, model, cross_kv: Tensor, src_mask: Tensor) -> None:
        """A new batch of ``model``: its sentences' cross-attention keys/values ``(n_layers, 2, n,
        n_heads, src_len, head_dim)`` and source mask ``(n, 1, 1, src_len)`` in the first ``n``
        slots, nothing written yet. Slots past ``n`` attend to one zero key, so that they compute
        finite values. Graphs captured before the model's tensors moved are dropped
        (:func:`bound_memory`)."""
        if self.bound is not None and self.bound != bound_memory(model):
            self.search, self.graphs, self.bound = None, {}, None
        n, src_len = src_mask.size(0), src_mask.size(-1)
        self.cross_kv.zero_()
        self.cross_kv[:, :, :n, :, :src_len] = cross_kv
        self.src_mask.zero_()
        self.src_mask[:n, ..., :src_len] = src_mask
        self.src_mask[n:, ..., 0] = True
        self.length.zero_()

    def state(self, key: tuple, make):
        """The search's state for settings ``key``, made by ``make()`` on first use (a change of
        settings drops the graphs, which hold the old state's addresses and constants)."""
        if self.search is None or self.search[0] != key:
            self.search, self.graphs = (key, make()), {}
        return self.search[1]


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
        "graphs": sum(len(s.graphs) for s in slabs),
        "buffer_bytes": arena.buffer_bytes() if arena else 0,
        "graph_pool_bytes": arena.graph_bytes if arena else 0,
        "capture_failed": _BROKEN[0] if _BROKEN else None,
    }


def release_graphs(model) -> None:
    """Forget ``model``'s arena, slabs and graphs (their memory returns to PyTorch's allocator)."""
    _ARENAS.pop(model, None)


def cross_kv(model, memory: Tensor) -> Tensor:
    """Every decoder layer's cross-attention keys and values of ``memory`` ``(n, src_len,
    d_model)``: ``(n_layers, 2, n, n_heads, src_len, head_dim)``."""
    return torch.stack([torch.stack(layer.cross_attn.memory_kv(memory)) for layer in model.decoder])


class StaticStep:
    """The search's step over the slab of one model's batch: the model's part reads each row's last
    token from the search's state and writes at the cache's position on the device; following the
    back-pointers copies the written positions (rounded up to :data:`CAPACITY_MULTIPLE`) from one
    key/value buffer into the other. Nothing a step computes depends on a host value but the step
    number, so :meth:`run` may capture it (``graphs``, on a GPU) and replay it.

    ``compacts``: False, settled sentences stay in the slab, masked, and the loop learns one step
    late that every sentence has settled (:class:`~nmt.decode.search.LateFlag`), so that the GPU
    always has a step queued.
    """

    compacts = False
    name = "static"

    def __init__(self, model, slab: Slab, graphs: bool, reorders: bool):
        self.model, self.slab, self.graphs = model, slab, graphs
        self.reorders = reorders and slab.beam > 1
        self.vocab = model.cfg.tgt_vocab_size

    @classmethod
    def start(
        cls, model, src: Tensor, rows: int, longest: int, reorders: bool = True
    ) -> StaticStep:
        """The step for sentences ``src`` ``(n, src_len)`` at ``rows`` hypotheses a sentence and
        outputs of at most ``longest`` pieces (below :data:`STATIC_CAPACITY`): the batch's source
        side loaded into the slab of its bucket. ``reorders``: the rows follow back-pointers (not a
        sampler's, which stay in place)."""
        memory, src_mask = model.encode(src)
        graphs = captures(memory)
        size = (
            sentence_bucket(memory.size(0)),
            rows,
            round_up(memory.size(1), SOURCE_MULTIPLE),
            round_up(longest + 1, CAPACITY_MULTIPLE),
        )
        slab = slab_for(model, *size, memory.dtype, memory.device, keep=graphs)
        slab.load(model, cross_kv(model, memory), src_mask)
        return cls(model, slab, graphs, reorders)

    def which(self, step: int) -> int:
        """The key/value buffer step ``step`` reads (they alternate when the rows are reordered)."""
        return step % 2 if self.reorders else 0

    def score(self, beams, step: int) -> Tensor:
        """Log-probabilities ``(rows, vocab)`` in float32 after each row's last token."""
        last = beams.tokens.index_select(1, beams.step).view(-1)
        return self.model.decode_step(last, self.slab.caches[self.which(step)])[0]

    def follow(self, back: Tensor, step: int) -> None:
        """The written positions follow the back-pointers ``back`` ``(rows,)`` into the other
        buffer."""
        slab, which = self.slab, self.which(step)
        written = min(round_up(step + 1, CAPACITY_MULTIPLE), slab.capacity)
        source, target = slab.kv[which], slab.kv[1 - which]
        torch.index_select(source[..., :written, :], 2, back, out=target[..., :written, :])

    def run(self, step: int, fn, whole: bool, state):
        """``fn()`` of step ``step``: eagerly, or with ``graphs`` as a CUDA graph captured once per
        (``whole`` search step or the model's part, buffer, positions copied) and replayed; its
        output is then the graph's own, valid until the next replay. ``state()``: the search's
        tensors, put back after the warm-up before the slab's first capture."""
        if not self.graphs:
            return fn()
        slab = self.slab
        key = (whole, self.which(step), min(round_up(step + 1, CAPACITY_MULTIPLE), slab.capacity))
        if key not in slab.graphs:
            try:
                if not slab.graphs:
                    warm_up(fn, [slab.length, *state()])
                slab.graphs[key] = capture(fn, slab.arena)
                slab.bound = bound_memory(self.model)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as exc:
                graphs_failed(exc)
                raise GraphsFailed from exc
        graph, out = slab.graphs[key]
        graph.replay()
        return out


class GraphsFailed(RuntimeError):
    """A CUDA graph could not be captured: the batch is decoded again by the dynamic step."""


def warm_up(fn, state: list[Tensor]) -> None:
    """Run ``fn`` twice on a side stream before a slab's first capture (CUDA graphs need the
    libraries' lazy set-up done), then put back the ``state`` it changed. The keys and values it
    wrote are finite and rewritten before they are read."""
    device = state[0].device
    saved = [t.clone() for t in state]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    for t, value in zip(state, saved):
        t.copy_(value)


def capture(fn, arena: Arena) -> tuple[torch.cuda.CUDAGraph, Tensor | None]:
    """``fn`` captured as a CUDA graph in ``arena``'s memory pool (a capture runs nothing: the state
    is untouched until the graph is replayed), and its output."""
    reserved = torch.cuda.memory_reserved(arena.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=arena.pool):
        out = fn()
    arena.graph_bytes += torch.cuda.memory_reserved(arena.device) - reserved
    return graph, out


_BROKEN: list[str] = []  # why a CUDA graph capture failed in this process, once one has


def captures(memory: Tensor) -> bool:
    """Whether the steps of a batch whose encoder output is ``memory`` are captured as CUDA graphs:
    on a GPU, unless a capture has failed in this process."""
    return memory.is_cuda and graphs_work()


def graphs_work() -> bool:
    """Whether steps are captured as CUDA graphs: False once a capture has failed in this
    process."""
    return not _BROKEN


def graphs_failed(error: Exception) -> None:
    """Record a failed capture: decoding falls back to the dynamic cache, said once in one line."""
    if not _BROKEN:
        text = str(error).strip()
        _BROKEN.append(text.splitlines()[0] if text else type(error).__name__)
        log.warning(
            "warning: CUDA graph capture failed (%s); decoding with the dynamic cache instead",
            _BROKEN[0],
        )
