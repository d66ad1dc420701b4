"""Lexically constrained beam search by dynamic beam allocation (Post and Vilar 2018; Hu et al.
2019).

A sentence with constraints chooses its next beam differently from an unconstrained one.
Its candidates are the ``2·beam`` best extensions (as usual), each hypothesis's best
extension, and every extension that spells a constraint further; an end (EOS) is a
candidate only as one of the first two, never merely because a hypothesis could end. Each candidate
falls into the bank of how many constraint pieces it has spelt; the beam is shared out among the
banks, one slot per bank in turn from the fullest bank down (a bank with too few candidates
leaves its slots to the others), and within a bank by score. So hypotheses on their way to
meeting the constraints stay in the beam although the model scores them lower, instead of
being pruned by hypotheses that ignore them. A hypothesis ends only once every constraint
is met (:class:`~nmt.core.restrictions.Restrictions` forbids EOS before), unless its length limit
forces the end; ending candidates are set aside as finished when they rank within the
``beam`` best of the complete bank, where a forced end that misses a constraint ranks after
every candidate that has met them all.

Sentences without constraints keep the ordinary choice of :class:`~nmt.core.beams.Candidates`,
bit for bit, in the same batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .beams import Beams, Candidates
from .pieces import EOS, PAD


def allocate(top: Candidates, beams: Beams, lprobs: Tensor) -> Candidates:
    """``top`` with the rows of the sentences that have constraints chosen by dynamic beam
    allocation.

    Args:
        top: the ordinary candidates, ``(n, 2*beam)`` each.
        beams: the running hypotheses, with their :class:`~nmt.core.beams.ConstraintProgress`.
        lprobs: ``(n*beam, vocab)`` this step's restricted log-probabilities.
    """
    progress = beams.progress
    constrained = (
        (progress.total() > 0).nonzero().squeeze(1).tolist() if progress is not None else []
    )
    if not constrained:
        return top
    scores, back, token, is_eos = (
        top.scores.clone(),
        top.beam.clone(),
        top.token.clone(),
        top.is_eos.clone(),
    )
    for s in constrained:
        row = _sentence_candidates(s, beams, lprobs)
        width = row[0].numel()
        scores[s], back[s], token[s], is_eos[s] = float("-inf"), 0, PAD, False
        scores[s, :width], back[s, :width], token[s, :width], is_eos[s, :width] = row
    return Candidates(scores, back, token, is_eos)


def _sentence_candidates(
    s: int, beams: Beams, lprobs: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sentence ``s``'s candidates in the order the search reads them: those that end (finished),
    then the ``beam`` that go on; as (scores, hypothesis within the sentence, token, ends)."""
    progress, (_, beam), vocab = beams.progress, beams.scores.shape, lprobs.size(1)
    device = lprobs.device
    rows = torch.arange(s * beam, (s + 1) * beam, device=device)
    extended = beams.scores[s].unsqueeze(1) + lprobs[rows]  # (beam, vocab)
    flat = extended.view(-1)
    pool = [
        flat.topk(min(2 * beam, flat.numel())).indices,
        extended.argmax(1) + torch.arange(beam, device=device) * vocab,
    ]
    phrases, current, position, met = (
        progress.phrases[s],
        progress.current[rows],
        progress.position[rows],
        progress.met[rows],
    )
    # (beam,)
    goes_on = torch.where(
        current >= 0, phrases[current.clamp(min=0), position.clamp(max=phrases.size(1) - 1)], -1
    )
    starts = torch.where(met, -1, phrases[:, 0].unsqueeze(0))  # (beam, C)
    # (beam, C + 1) pieces that spell a constraint further
    spelling = torch.cat([goes_on.unsqueeze(1), starts], 1)
    pool.append((spelling + torch.arange(beam, device=device).unsqueeze(1) * vocab)[spelling >= 0])
    # An end is a candidate only as any other piece is (among the 2k best, or its hypothesis's
    # best): offering every hypothesis's EOS let improbable ends of the few complete hypotheses fill
    # the finished list within steps.
    index = torch.unique(torch.cat(pool))
    index = index[torch.isfinite(flat[index])]
    candidate_scores, hyp, tok = (
        flat[index],
        torch.div(index, vocab, rounding_mode="floor"),
        index % vocab,
    )
    new_met, _, new_position = progress.after(rows[hyp], tok)
    spelt = progress.spelt(new_met, new_position, rows[hyp]).tolist()
    total, ends = int(progress.lengths[s].sum()), (tok == EOS).tolist()
    order = sorted(range(len(index)), key=lambda i: -float(candidate_scores[i]))
    # The complete bank's best; an end that misses a constraint (only the length limit allows one)
    # ranks after them all.
    complete = (
        [i for i in order if spelt[i] >= total] + [i for i in order if ends[i] and spelt[i] < total]
    )[:beam]
    finished = [i for i in complete if ends[i]]
    banks: dict[int, list[int]] = {}
    for i in order:
        if not ends[i]:
            banks.setdefault(spelt[i], []).append(i)
    going_on = _round_robin([banks[b] for b in sorted(banks, reverse=True)], beam)
    chosen = torch.tensor(finished + going_on, dtype=torch.long, device=device)
    return candidate_scores[chosen], hyp[chosen], tok[chosen], tok[chosen] == EOS


def _round_robin(banks: list[list[int]], size: int) -> list[int]:
    """``size`` items taken one per bank in turn (banks in the order given, each in its own
    order)."""
    out, depth = [], 0
    while len(out) < size and any(depth < len(bank) for bank in banks):
        out += [bank[depth] for bank in banks if depth < len(bank)][: size - len(out)]
        depth += 1
    return out
