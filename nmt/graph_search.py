"""Beam search held on the device, each step (the model's and the search's) one CUDA graph replay.

:class:`~nmt.graphs.StaticScorer` made the model's step replayable, but the host's search still ran
between steps: at batch 128 on an H200, 46 ms of kernels in a 202 ms batch, with about 60 launches
and 6 reads of the device a step outside the graphs. :class:`GraphSearch` runs plain beam search
with :class:`~nmt.core.device_search.DeviceBeams` instead, in the slab of its bucket: one graph per
key/value buffer and count of positions the cache's reorder copies (a multiple of
:data:`~nmt.graphs.CAPACITY_MULTIPLE`), captured when first needed and kept with the slab; the
host reads one flag a step, a step late. Sampling, steering, ensembles and shortlists, and limits
past :data:`SEARCH_CAPACITY`, stay with the step-wise :class:`~nmt.graphs.StaticScorer` it
extends. On a CPU the same code runs eagerly: the twin ``tests/test_graphs.py`` compares with the
dynamic cache.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from .config import DecodeConfig
from .core.device_search import DeviceBeams
from .core.pieces import BOS, OutputRules
from .core.search import INITIAL_CAPACITY, beam_search
from .graphs import (
    CAPACITY_MULTIPLE,
    SOURCE_MULTIPLE,
    Slab,
    StaticScorer,
    bound_memory,
    cross_kv,
    graphs_work,
    round_up,
    sentence_bucket,
    slab_for,
)

log = logging.getLogger("nmt.graphs")

# The longest output (pieces and EOS) the search held on the device serves: its capacity is set
# for the batch's limit up front, where the step-wise search starts small and doubles.
SEARCH_CAPACITY = 256

_FAILED: list[str] = []  # why the search held on a GPU failed in this process, once it has


class GraphSearch(StaticScorer):
    """The static step with plain beam search held on the device (what ``decode.cache`` ``auto``
    runs on a GPU); :func:`nmt.core.search.translate_batch` calls :meth:`beam_search` where
    :meth:`searches` allows, and the step-wise methods it inherits otherwise."""

    @staticmethod
    def searches(longest: int) -> bool:
        """Whether :meth:`beam_search` serves a batch whose longest output limit is ``longest``
        pieces (EOS not counted)."""
        return longest + 1 <= SEARCH_CAPACITY and not _FAILED

    @classmethod
    def beam_search(
        cls,
        model,
        src: Tensor,
        max_lens: Tensor,
        decode: DecodeConfig,
        rules: OutputRules | None = None,
    ) -> list[list]:
        """:func:`nmt.core.search.beam_search` of ``src`` ``(n, src_len)`` without steering, held on
        the device: the same hypotheses and scores up to the static step's rounding. ``max_lens``
        ``(n,)``: at most :data:`SEARCH_CAPACITY` - 1 pieces (:meth:`searches`). If it fails on a
        GPU (other than by running out of memory), that is said once in one line and this batch and
        every later one decode with the step-wise search, the path measured before it."""
        memory, src_mask = model.encode(src)
        n, longest = memory.size(0), int(max_lens.max())
        on_gpu = _on_gpu(memory)
        graphs = on_gpu and graphs_work()
        size = (
            sentence_bucket(n),
            decode.beam_size,
            round_up(memory.size(1), SOURCE_MULTIPLE),
            round_up(longest + 1, CAPACITY_MULTIPLE),
        )
        slab = slab_for(model, *size, memory.dtype, memory.device, keep=graphs)
        slab.load(model, cross_kv(model, memory), src_mask)
        try:
            beams = searcher(slab, decode, rules)
            beams.reset_(max_lens)
            slab.tokens.fill_(BOS)
            if graphs and not slab.search_graphs:
                warm_up(slab, model, beams)
            return _search(slab, model, beams, n, longest, graphs)
        except Exception as exc:
            if not on_gpu or isinstance(exc, torch.OutOfMemoryError):
                raise
            _failed(exc)
        slab.search = None
        scorer, state = cls.start(
            model, memory, src_mask, decode.beam_size, min(longest + 1, INITIAL_CAPACITY)
        )
        return beam_search(scorer, state, max_lens, decode, rules)


def _on_gpu(memory: Tensor) -> bool:
    """Whether the search runs on a GPU (where its CUDA graphs are captured)."""
    return memory.is_cuda


def _failed(error: Exception) -> None:
    """Record that the search held on a GPU failed: the step-wise search serves from now on."""
    if not _FAILED:
        text = str(error).strip()
        _FAILED.append(text.splitlines()[0] if text else type(error).__name__)
        log.warning(
            "warning: beam search held on the GPU failed (%s); decoding with the step-wise "
            "static step instead",
            _FAILED[0],
        )


def searcher(slab: Slab, decode: DecodeConfig, rules: OutputRules | None) -> DeviceBeams:
    """The state of ``slab``'s search for these settings, made on first use (a change of settings
    drops the slab's search graphs, which hold the old ones as constants)."""
    key = (
        decode.beam_size,
        decode.n_best,
        decode.min_len,
        decode.allow_unk,
        decode.length_penalty,
        decode.length_normalization,
        rules,
    )
    if slab.search is None or slab.search[0] != key:
        beams = DeviceBeams.start(
            slab.sentences, slab.capacity + 1, decode, rules, slab.tokens.device
        )
        slab.search, slab.search_graphs = (key, beams), {}
    return slab.search[1]


def search_step(slab: Slab, model, beams: DeviceBeams, which: int, step: int, graphs: bool) -> None:
    """Step ``step`` from key/value buffer ``which``: the model's step, the search's
    (:meth:`DeviceBeams.update`), the cache's written positions (rounded up to
    :data:`~nmt.graphs.CAPACITY_MULTIPLE`) following the back-pointers into the other buffer, and
    the new last tokens. With ``graphs``, one CUDA graph per buffer and count of positions, captured
    when first needed (after :func:`warm_up`) and replayed."""
    written = min(round_up(step + 1, CAPACITY_MULTIPLE), slab.capacity)
    if not graphs:
        return _step(slab, model, beams, which, written)
    key = (which, written)
    if key not in slab.search_graphs:
        device = slab.tokens.device
        reserved = torch.cuda.memory_reserved(device)
        graph = torch.cuda.CUDAGraph()
        # a capture runs nothing: the state is untouched until the replay below
        with torch.cuda.graph(graph, pool=slab.arena.pool):
            _step(slab, model, beams, which, written)
        slab.search_graphs[key], slab.bound = graph, bound_memory(model)
        slab.arena.graph_bytes += torch.cuda.memory_reserved(device) - reserved
    slab.search_graphs[key].replay()


def _step(slab: Slab, model, beams: DeviceBeams, which: int, written: int) -> None:
    lprobs = model.decode_step(slab.tokens, slab.caches[which])[0]
    back, new = beams.update(lprobs)
    if slab.beam > 1:
        source, target = slab.kv[which], slab.kv[1 - which]
        torch.index_select(source[..., :written, :], 2, back, out=target[..., :written, :])
    slab.tokens.copy_(new)


def warm_up(slab: Slab, model, beams: DeviceBeams) -> None:
    """Run a step twice on a side stream before the slab's first capture (CUDA graphs need the
    libraries' lazy set-up done), then put back the state it changed. The keys and values it wrote
    are finite and rewritten before they are read."""
    device = slab.tokens.device
    state = [slab.tokens, slab.length, *beams.tensors()]
    saved = [t.clone() for t in state]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            _step(slab, model, beams, 0, CAPACITY_MULTIPLE)
    torch.cuda.current_stream(device).wait_stream(side)
    for t, value in zip(state, saved):
        t.copy_(value)


def _search(slab: Slab, model, beams: DeviceBeams, n: int, longest: int, graphs: bool) -> list:
    """Run the loaded search to its end and read its results. Whether any sentence is still searched
    is copied to the host after each step (on a GPU to pinned memory, without waiting) and read
    after the next step is launched, so that the GPU always has a step queued: the loop stops one
    step late, which changes nothing (settled sentences are masked), on a CPU as on a GPU."""
    which, flags, events = 0, torch.ones(2, dtype=torch.bool), None
    if graphs:
        flags, events = flags.pin_memory(), [torch.cuda.Event(), torch.cuda.Event()]
    for step in range(longest + 1):
        search_step(slab, model, beams, which, step, graphs)
        if slab.beam > 1:
            which = 1 - which
        flags[step % 2].copy_(beams.active.any(), non_blocking=graphs)
        if events:
            events[step % 2].record()
        if step:
            if events:
                events[(step - 1) % 2].synchronize()
            if not bool(flags[(step - 1) % 2]):
                break
    return beams.results(n)
