"""Label-smoothed cross entropy (Szegedy et al. 2016; Vaswani et al. 2017, §5.4)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .tokenizer import PAD


@dataclass
class LossOutput:
    """Sums over the non-pad target tokens of a batch (divide by ``n_tokens`` for means)."""

    loss: Tensor  # label-smoothed cross entropy, summed (nats)
    nll: Tensor  # negative log-likelihood of the references, summed (nats)
    n_tokens: Tensor  # non-pad target tokens (a 0-dim tensor: reading it would sync a GPU)


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float, pad_id: int = PAD) -> LossOutput:
    """Cross entropy against a smoothed target distribution.

    The reference token gets probability ``1 - smoothing``; the remaining mass is spread
    uniformly over the ``vocab - 2`` classes that are neither the reference nor PAD. PAD
    gets none, since it can never be a correct output. Positions whose target is PAD
    contribute nothing. The log-softmax is computed in float32 whatever ``logits``' dtype.

    Args:
        logits: ``(batch, tgt_len, vocab)``.
        target: ``(batch, tgt_len)`` reference ids, PAD where there is no token.
        smoothing: ε in ``[0, 1)``; 0.1 in the paper.

    Returns:
        :class:`LossOutput` with sums; the training objective is ``loss / n_tokens``.
    """
    vocab = logits.size(-1)
    lprobs = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    # Sum of -log p over the classes that receive smoothing mass (all but reference and PAD).
    others = -lprobs.sum(-1) - nll + lprobs[..., pad_id]
    loss = (1.0 - smoothing) * nll + smoothing / (vocab - 2) * others
    zero = torch.zeros((), device=logits.device)
    return LossOutput(torch.where(keep, loss, zero).sum(), torch.where(keep, nll, zero).sum(), keep.sum())
