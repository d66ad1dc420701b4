"""Batched beam search (greedy search is beam size 1).

The search only needs a :class:`Scorer`: something that gives next-token
log-probabilities for every hypothesis and can reorder or shrink its state. The
Transformer's cached decoder is one (:class:`TransformerScorer`); tests drive the same
search with scripted scorers whose probabilities are fixed by hand.

Shapes: ``batch`` active sentences, ``beam`` hypotheses each, rows of
``(batch*beam, ...)`` tensors ordered sentence-major (row ``b*beam + k``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from .model import beam_rows
from .tokenizer import BOS, EOS, PAD, UNK


@dataclass(frozen=True)
class Hypothesis:
    """A finished translation: ``tokens`` without BOS/EOS, ``log_prob`` = log P(Y|X) summed
    over the tokens and EOS (nats), ``score`` = ``log_prob / lp(|Y|)``."""

    tokens: list[int]
    score: float
    log_prob: float


class Scorer(Protocol):
    def step(self, prefix: Tensor, state: Any) -> tuple[Tensor, Any]:
        """Log-probabilities ``(batch*beam, vocab)`` of the token after ``prefix`` ``(batch*beam, t)``
        (which starts with BOS), and the state extended by that prefix's last token."""

    def reorder(self, state: Any, index: Tensor) -> Any:
        """Keep hypothesis rows ``index`` ``(batch*beam,)``."""

    def select_sentences(self, state: Any, keep: Tensor) -> Any:
        """Keep sentences ``keep`` ``(new_batch,)`` with all their beams."""


class TransformerScorer:
    """The production path: :meth:`nmt.model.Transformer.decode_step` over a
    :class:`~nmt.model.DecoderCache` whose source side is shared by each sentence's beams."""

    def __init__(self, model):
        self.model = model

    @classmethod
    def start(cls, model, memory: Tensor, src_mask: Tensor, beam: int, capacity: int = 32):
        """The scorer and its first state; ``capacity``: target positions to allocate for."""
        return cls(model), model.start_decoding(memory, src_mask, beam, capacity)

    def step(self, prefix, cache):
        return self.model.decode_step(prefix[:, -1], cache)

    def reorder(self, cache, index):
        return cache.reorder(index)

    def select_sentences(self, cache, keep):
        return cache.select_sentences(keep)


class TiledScorer(TransformerScorer):
    """Reference: the source side copied ``beam`` times, one copy per hypothesis (what most
    toolkits do). Kept to prove, and to measure, what sharing it saves."""

    @classmethod
    def start(cls, model, memory, src_mask, beam, capacity=32):
        scorer = cls(model)
        scorer.beam = beam
        return scorer, model.start_decoding(memory.repeat_interleave(beam, 0), src_mask.repeat_interleave(beam, 0), 1, capacity)

    def select_sentences(self, cache, keep):
        return cache.select_sentences(beam_rows(keep, self.beam))


class RecomputeScorer:
    """Reference: no cache; the whole decoder reruns over the full prefix at every step
    (against a tiled source). Kept to prove the cache exact and to measure what it saves."""

    def __init__(self, model, beam: int):
        self.model, self.beam = model, beam

    @classmethod
    def start(cls, model, memory, src_mask, beam, capacity=0):
        return cls(model, beam), (memory.repeat_interleave(beam, 0), src_mask.repeat_interleave(beam, 0))

    def step(self, prefix, state):
        logits = self.model.decode(prefix, *state)[:, -1]
        return torch.log_softmax(logits.float(), dim=-1), state

    def reorder(self, state, index):
        return state[0].index_select(0, index), state[1].index_select(0, index)

    def select_sentences(self, state, keep):
        return self.reorder(state, beam_rows(keep, self.beam))


SCORERS = {"cached": TransformerScorer, "tiled": TiledScorer, "recompute": RecomputeScorer}


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al. 2016, §7); 1 when ``alpha`` is 0."""
    return ((5.0 + length) / 6.0) ** alpha


def _settled(done: list[Hypothesis], best_running: float, beam: int, n_best: int, alpha: float, step: int, max_len: int) -> bool:
    """Whether a sentence's result can no longer change.

    Either ``beam`` hypotheses have finished (the usual rule), or the ``n_best`` best
    finished ones all score at least what the best running hypothesis could still reach:
    its log-probability can only fall, so its score is at most ``best_running / lp(L)``
    for the most favourable final length ``L`` (EOS counted). This bound is exact: stopping
    then returns the same n-best list as searching on, in fewer steps.
    """
    if len(done) >= beam:
        return True
    if len(done) < n_best:
        return False
    lp = max(length_penalty(step + 2, alpha), length_penalty(max_len + 1, alpha))
    bound = best_running / lp if best_running < 0 else best_running
    return min(h.score for h in sorted(done, key=lambda h: -h.score)[:n_best]) >= bound


def beam_search(
    scorer: Scorer,
    state: Any,
    max_lens: Tensor,
    beam_size: int,
    alpha: float = 0.0,
    n_best: int = 1,
    min_len: int = 0,
    allow_unk: bool = False,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences.

    Each step scores ``beam`` hypotheses per sentence over the whole vocabulary and keeps
    the ``2·beam`` best extensions. Those ending in EOS among the first ``beam`` are set
    aside as finished, and the best ``beam`` that do not end in EOS continue, so finished
    hypotheses never starve the beam. A sentence stops once it has ``beam`` finished
    hypotheses, once no running hypothesis can still enter its n-best list (see
    :func:`_settled`), or at its length limit (then EOS is forced); it then leaves the batch.

    Args:
        scorer: see :class:`Scorer`; ``state`` must already hold ``beam_size`` rows per sentence.
        max_lens: ``(batch,)`` most pieces to generate per sentence, EOS not counted.
        beam_size: hypotheses per sentence; 1 is greedy search.
        alpha: GNMT length-penalty exponent for ranking finished hypotheses.
        n_best: hypotheses returned per sentence (at most ``beam_size``).
        min_len: EOS is forbidden before this many pieces (benchmarks force a length).
        allow_unk: let hypotheses contain UNK; otherwise it is never generated, like PAD and BOS.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    batch, beam = max_lens.size(0), beam_size
    device = max_lens.device
    max_lens_cpu = max_lens.tolist()
    tokens = torch.full((batch * beam, 1), BOS, dtype=torch.long, device=device)
    scores = torch.zeros(batch, beam, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    sentence_ids = list(range(batch))  # original index of each active sentence
    beam_offsets = torch.arange(batch, device=device).unsqueeze(1) * beam
    step = 0
    while sentence_ids:
        n = len(sentence_ids)
        lprobs, state = scorer.step(tokens, state)  # (n*beam, vocab)
        vocab = lprobs.size(-1)
        lprobs[:, PAD] = float("-inf")
        lprobs[:, BOS] = float("-inf")
        if not allow_unk:
            lprobs[:, UNK] = float("-inf")
        if step < min_len:
            lprobs[:, EOS] = float("-inf")
        force = step >= max_lens  # (n,)
        if bool(force.any()):
            rows = force.repeat_interleave(beam)
            eos = lprobs[rows, EOS]
            lprobs[rows] = float("-inf")
            lprobs[rows, EOS] = eos

        candidates = (scores.unsqueeze(2) + lprobs.view(n, beam, vocab)).view(n, beam * vocab)
        top_scores, top_index = candidates.topk(2 * beam, dim=1)  # (n, 2*beam)
        top_beam, top_token = top_index // vocab, top_index % vocab
        is_eos = (top_token == EOS) & torch.isfinite(top_scores)

        # Finished hypotheses: EOS among the first `beam` candidates.
        eos_rows, eos_cols = is_eos[:, :beam].nonzero(as_tuple=True)
        if eos_rows.numel():
            penalty = length_penalty(step + 1, alpha)
            src_rows = (eos_rows * beam + top_beam[eos_rows, eos_cols]).tolist()
            for r, src_row, log_prob in zip(eos_rows.tolist(), src_rows, top_scores[eos_rows, eos_cols].tolist()):
                done = finished[sentence_ids[r]]
                if len(done) < beam:
                    done.append(Hypothesis(tokens[src_row, 1:].tolist(), log_prob / penalty, log_prob))

        # Continuing hypotheses: the first `beam` candidates that are not EOS.
        rank = is_eos.long() * (2 * beam) + torch.arange(2 * beam, device=device)
        chosen = rank.topk(beam, dim=1, largest=False).indices  # (n, beam)
        scores = top_scores.gather(1, chosen)
        back = (beam_offsets[:n] + top_beam.gather(1, chosen)).view(-1)  # flat back-pointers
        tokens = torch.cat([tokens.index_select(0, back), top_token.gather(1, chosen).view(-1, 1)], dim=1)
        if beam > 1:
            state = scorer.reorder(state, back)

        best_running = scores[:, 0].tolist()
        keep = [r for r, s in enumerate(sentence_ids) if step < max_lens_cpu[r] and not _settled(finished[s], best_running[r], beam, n_best, alpha, step, max_lens_cpu[r])]
        if len(keep) < n:
            sentence_ids = [sentence_ids[r] for r in keep]
            max_lens_cpu = [max_lens_cpu[r] for r in keep]
            if not keep:
                break
            keep_t = torch.tensor(keep, device=device)
            max_lens = max_lens.index_select(0, keep_t)
            scores = scores.index_select(0, keep_t)
            tokens = tokens.view(n, beam, -1).index_select(0, keep_t).view(len(keep) * beam, -1)
            state = scorer.select_sentences(state, keep_t)
        step += 1
    return [sorted(h, key=lambda hyp: -hyp.score)[:n_best] for h in finished]


@torch.inference_mode()
def translate_batch(
    model, src: Tensor, beam_size: int, alpha: float, max_len_a: float, max_len_b: int,
    n_best: int = 1, min_len: int = 0, scorer: str = "cached", allow_unk: bool = False,
) -> list[list[Hypothesis]]:
    """Encode ``src`` ``(batch, src_len)`` once and beam-search each sentence.

    The length limit is ``max_len_a · src_len + max_len_b`` pieces, ``src_len`` counting
    the sentence's non-pad source tokens (EOS included). ``scorer`` picks the production
    path (``"cached"``) or a reference (``"tiled"``, ``"recompute"``; see :data:`SCORERS`).
    """
    memory, src_mask = model.encode(src)
    src_lens = (src != PAD).sum(1)
    max_lens = (max_len_a * src_lens.double() + max_len_b).long()
    # Room for the longest possible output (pieces + EOS): the cache never has to grow.
    step_scorer, state = SCORERS[scorer].start(model, memory, src_mask, beam_size, capacity=int(max_lens.max()) + 1)
    return beam_search(step_scorer, state, max_lens, beam_size, alpha, n_best, min_len, allow_unk)
