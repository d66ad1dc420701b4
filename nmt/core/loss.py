"""Label-smoothed cross entropy (Szegedy et al. 2016; Vaswani et al. 2017, §5.4)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .pieces import PAD


@dataclass
class LossOutput:
    """Sums over the non-pad target tokens of a batch (divide by ``n_tokens`` for means)."""

    loss: Tensor  # label-smoothed cross entropy, summed (nats)
    nll: Tensor  # negative log-likelihood of the references, summed (nats)
    n_tokens: Tensor  # non-pad target tokens (a 0-dim tensor: reading it would sync a GPU)


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL of ``(tokens, vocab)`` logits, with the
    gradient written directly: for a target distribution ``q`` that sums to 1, the
    gradient of ``-Σ q log softmax(z)`` is ``softmax(z) - q``. One pass over
    ``tokens × vocab`` instead of autograd's chain through log-softmax, gather, sum and
    where (each of which writes its own ``tokens × vocab`` buffer)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float, pad_id: int):
        lprobs = F.log_softmax(logits.float(), dim=-1)
        vocab = lprobs.size(-1)
        keep = target != pad_id
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        # Sum of -log p over the classes that receive smoothing mass (all but reference and PAD).
        others = -lprobs.sum(-1) - nll + lprobs[:, pad_id]
        loss = (1.0 - smoothing) * nll + smoothing / (vocab - 2) * others
        zero = torch.zeros((), device=logits.device)
        ctx.save_for_backward(lprobs, target, keep)
        ctx.smoothing, ctx.pad_id, ctx.dtype = smoothing, pad_id, logits.dtype
        nll = torch.where(keep, nll, zero)
        ctx.mark_non_differentiable(nll)
        return torch.where(keep, loss, zero), nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        lprobs, target, keep = ctx.saved_tensors
        eps, pad = ctx.smoothing, ctx.pad_id
        share = eps / (lprobs.size(-1) - 2)
        grad = lprobs.exp()  # softmax(z), then minus q:
        grad -= share  # every class ...
        grad[:, pad] += share  # ... but PAD, which gets no mass,
        # and the reference 1 - ε
        grad.scatter_add_(
            -1, target.unsqueeze(-1), torch.full_like(grad[:, :1], share - (1.0 - eps))
        )
        grad *= torch.where(keep, grad_loss, torch.zeros((), device=grad.device)).unsqueeze(-1)
        return grad.to(ctx.dtype), None, None, None


def label_smoothed_loss(
    logits: Tensor, target: Tensor, smoothing: float, pad_id: int = PAD
) -> LossOutput:
    """Cross entropy against a smoothed target distribution.

    The reference token gets probability ``1 - smoothing``; the remaining mass is spread
    uniformly over the ``vocab - 2`` classes that are neither the reference nor PAD. PAD
    gets none, since it can never be a correct output. Positions whose target is PAD
    contribute nothing. The log-softmax is computed in float32 whatever ``logits``' dtype,
    and the gradient is formed in one pass (``softmax - q``; see
    :class:`_LabelSmoothedCrossEntropy`).

    Args:
        logits: ``(batch, tgt_len, vocab)``.
        target: ``(batch, tgt_len)`` reference ids, PAD where there is no token.
        smoothing: ε in ``[0, 1)``; 0.1 in the paper.

    Returns:
        :class:`LossOutput` with sums; the training objective is ``loss / n_tokens``.
    """
    flat_target = target.reshape(-1)
    loss, nll = _LabelSmoothedCrossEntropy.apply(
        logits.reshape(-1, logits.size(-1)), flat_target, smoothing, pad_id
    )
    return LossOutput(loss.sum(), nll.sum(), (flat_target != pad_id).sum())
