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


def rows_pass(logits: Tensor, target: Tensor, smoothing: float, pad_id: int):
    """The forward pass over ``(tokens, vocab)`` logits: per token the label-smoothed loss and the
    NLL (0 where the target is PAD), ``(tokens,)`` in float32, and what the backward pass needs
    besides the logits: for float32 logits their log-probabilities ``(tokens, vocab)`` (kept in
    the logits' place, no larger), for bfloat16 or float16 ones ``lse`` ``(tokens,)``, the log of
    the softmax's normaliser, so that no float32 ``tokens × vocab`` outlives the pass."""
    z = logits.float()
    lprobs = F.log_softmax(z, dim=-1)
    vocab = lprobs.size(-1)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    # Sum of -log p over the classes that receive smoothing mass (all but reference and PAD).
    others = -lprobs.sum(-1) - nll + lprobs[:, pad_id]
    loss = (1.0 - smoothing) * nll + smoothing / (vocab - 2) * others
    zero = torch.zeros((), device=logits.device)
    kept = lprobs
    if logits.dtype != torch.float32:
        # read where z is largest, where log p is smallest in size: lse to float32's rounding
        top = z.max(-1)
        kept = top.values - lprobs.gather(-1, top.indices.unsqueeze(-1)).squeeze(-1)
    return torch.where(keep, loss, zero), torch.where(keep, nll, zero), kept


def gradient_pass(
    logits: Tensor | None,
    kept: Tensor,
    target: Tensor,
    grad_loss: Tensor,
    smoothing: float,
    pad_id: int,
    dtype: torch.dtype,
) -> Tensor:
    """The backward pass: ``(softmax(z) - q) · grad_loss`` per token in ``dtype`` (the logits'),
    for the smoothed target distribution ``q`` (see :func:`label_smoothed_loss`); ``kept`` from
    :func:`rows_pass` (with ``lse``, the ``logits``; with log-probabilities, None), ``grad_loss``
    ``(tokens,)`` the upstream gradient."""
    if kept.dim() == 2:  # softmax(z) in float32, then minus q:
        grad = kept.exp()
    else:
        grad = torch.sub(logits, kept.unsqueeze(-1)).exp_()
    share = smoothing / (grad.size(-1) - 2)
    grad -= share  # every class ...
    grad[:, pad_id] += share  # ... but PAD, which gets no mass,
    # and the reference 1 - ε
    grad.scatter_add_(
        -1, target.unsqueeze(-1), torch.full_like(grad[:, :1], share - (1.0 - smoothing))
    )
    keep = target != pad_id
    grad *= torch.where(keep, grad_loss, torch.zeros((), device=grad.device)).unsqueeze(-1)
    return grad.to(dtype)


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL of ``(tokens, vocab)`` logits, with the
    gradient written directly: for a target distribution ``q`` that sums to 1, the
    gradient of ``-Σ q log softmax(z)`` is ``softmax(z) - q``. One pass over
    ``tokens × vocab`` each way instead of autograd's chain through log-softmax, gather, sum
    and where (each of which writes its own ``tokens × vocab`` buffer); what is kept between
    them is at most as large as the logits (see :func:`rows_pass`)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float, pad_id: int, passes):
        loss, nll, kept = passes.rows(logits, target, smoothing, pad_id)
        ctx.save_for_backward(kept, target, logits if kept.dim() == 1 else None)
        ctx.smoothing, ctx.pad_id, ctx.passes, ctx.dtype = smoothing, pad_id, passes, logits.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        kept, target, logits = ctx.saved_tensors
        grad = ctx.passes.gradient(
            logits, kept, target, grad_loss, ctx.smoothing, ctx.pad_id, ctx.dtype
        )
        return grad, None, None, None, None


class LossPasses:
    """The two passes over ``tokens × vocab`` that :func:`label_smoothed_loss` runs: eager by
    default; :func:`nmt.runtime.compiled.training_loss` gives them compiled
    (``train.compile_loss``)."""

    def __init__(self, rows=rows_pass, gradient=gradient_pass):
        self.rows, self.gradient = rows, gradient

    def __call__(
        self, logits: Tensor, target: Tensor, smoothing: float, pad_id: int = PAD
    ) -> LossOutput:
        """:func:`label_smoothed_loss` with these passes."""
        return label_smoothed_loss(logits, target, smoothing, pad_id, passes=self)


EAGER = LossPasses()


def label_smoothed_loss(
    logits: Tensor, target: Tensor, smoothing: float, pad_id: int = PAD, passes: LossPasses = EAGER
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
        passes: how the passes over ``tokens × vocab`` run (:class:`LossPasses`).

    Returns:
        :class:`LossOutput` with sums; the training objective is ``loss / n_tokens``.
    """
    flat_target = target.reshape(-1)
    loss, nll = _LabelSmoothedCrossEntropy.apply(
        logits.reshape(-1, logits.size(-1)), flat_target, smoothing, pad_id, passes
    )
    return LossOutput(loss.sum(), nll.sum(), (flat_target != pad_id).sum())


def _chunked(
    states: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    smoothing: float,
    pad_id: int,
    chunk_tokens: int,
    vocab_multiple: int,
    passes: LossPasses,
    gradients: bool,
):
    """Summed loss and NLL of ``states`` ``(tokens, d_model)`` projected by ``weight`` ``(vocab,
    d_model)`` (and ``bias``), ``chunk_tokens`` rows at a time, in the autocast dtype where autocast
    is on (as :func:`torch.nn.functional.linear` would compute the logits), else ``states``'.
    With ``gradients`` also those of the summed loss with respect to ``states`` (their dtype) and
    ``weight`` (float32, accumulated over the chunks), else None for both."""
    device = states.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else states.dtype
    vocab = weight.size(0)
    pad = -vocab % vocab_multiple  # rows of zeros for the products, cut before the softmax
    with torch.autocast(device, enabled=False):
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        if pad:  # (F.pad copies even when it adds nothing: only where there is padding)
            w, b = F.pad(w, (0, 0, 0, pad)), None if b is None else F.pad(b, (0, pad))
        h = states.to(dtype)
        loss = torch.zeros((), device=states.device)
        nll = torch.zeros((), device=states.device)
        grad_states = torch.empty_like(states) if gradients else None
        grad_weight = torch.zeros_like(w, dtype=torch.float32) if gradients else None
        for start in range(0, h.size(0), chunk_tokens):
            h_c, t_c = h[start : start + chunk_tokens], target[start : start + chunk_tokens]
            z = F.linear(h_c, w, b)[:, :vocab]  # the padded columns are cut before the softmax
            loss_c, nll_c, kept = passes.rows(z, t_c, smoothing, pad_id)
            loss += loss_c.sum()
            nll += nll_c.sum()
            if gradients:
                ones = torch.ones_like(loss_c)
                g = passes.gradient(
                    z if kept.dim() == 1 else None, kept, t_c, ones, smoothing, pad_id, dtype
                )
                if pad:
                    g = F.pad(g, (0, pad))
                grad_states[start : start + chunk_tokens] = g @ w
                # summed over a chunk's tokens before any loss scale applies: float16's range
                # would overflow (or flush small entries) where a scaled whole product would not
                wide = dtype == torch.float16
                grad_weight += g.t().float() @ h_c.float() if wide else g.t() @ h_c
    return loss, nll, grad_states, None if grad_weight is None else grad_weight[:vocab]


class _ChunkedProjectionLoss(torch.autograd.Function):
    """The output projection and the label-smoothed loss together (:class:`ProjectedLoss`): the
    gradients are formed chunk by chunk in the forward pass, when each chunk's logits are at
    hand, and the backward pass only scales them by the upstream gradient of the summed loss
    (as Liger-Kernel's fused linear cross entropy does)."""

    @staticmethod
    def forward(ctx, states, weight, bias, target, smoothing, pad_id, chunk, multiple, passes):
        loss, nll, grad_states, grad_weight = _chunked(
            states, weight, bias, target, smoothing, pad_id, chunk, multiple, passes, True
        )
        ctx.save_for_backward(grad_states, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        grad_states, grad_weight = ctx.saved_tensors
        return (
            grad_states * grad_loss.to(grad_states.dtype),
            (grad_weight * grad_loss).to(ctx.weight_dtype),
            *(None,) * 7,
        )


class ProjectedLoss:
    """The output projection and :func:`label_smoothed_loss` of a
    :class:`~nmt.core.model.Transformer` from its decoder states: what
    :class:`~nmt.core.update.Updater` and validation score with.

    ``chunk_tokens`` 0 projects all tokens at once (``tokens × vocab`` logits, then
    :func:`label_smoothed_loss`). A positive ``chunk_tokens`` never holds more than ``chunk_tokens
    × vocab`` logits (and the same in float32 for the softmax): each chunk is projected, scored and,
    when gradients are needed, turned into its gradients with respect to the states and the
    output matrix at once (:class:`_ChunkedProjectionLoss`). The values are those of the whole
    projection up to float rounding (the output matrix's gradient is summed over chunks in
    float32). ``vocab_multiple`` pads the output matrix with rows of zeros to a multiple of it for
    the products (64: a GPU's tensor-core tiles); the padded columns are cut from the logits
    before the softmax, so they get no probability, no smoothing mass and no gradient, and the
    model's vocabulary, and so what it can generate, is unchanged. ``passes``: how each chunk's
    passes run (:class:`LossPasses`).

    Raises:
        ValueError: ``chunk_tokens`` below 0 or ``vocab_multiple`` below 1.
    """

    def __init__(self, chunk_tokens: int = 0, passes: LossPasses = EAGER, vocab_multiple: int = 1):
        if chunk_tokens < 0 or vocab_multiple < 1:
            raise ValueError(
                f"chunk_tokens must be at least 0 and vocab_multiple at least 1, got "
                f"{chunk_tokens} and {vocab_multiple}"
            )
        self.chunk_tokens, self.passes, self.vocab_multiple = chunk_tokens, passes, vocab_multiple

    def __call__(
        self, states: Tensor, target: Tensor, smoothing: float, model, pad_id: int = PAD
    ) -> LossOutput:
        """Sums over the non-pad targets of ``target`` ``(batch, tgt_len)`` for decoder states
        ``states`` ``(batch, tgt_len, d_model)`` of ``model`` (its tied output matrix
        ``tgt_embed.weight`` and ``output_bias``)."""
        if self.chunk_tokens == 0:
            logits = model.project(states)  # in the autocast dtype, where autocast is on
            with torch.autocast(states.device.type, enabled=False):
                return label_smoothed_loss(logits, target, smoothing, pad_id, self.passes)
        flat_states = states.reshape(-1, states.size(-1))
        flat_target = target.reshape(-1)
        weight, bias = model.tgt_embed.weight, model.output_bias
        args = (smoothing, pad_id, self.chunk_tokens, self.vocab_multiple, self.passes)
        if torch.is_grad_enabled() and (states.requires_grad or weight.requires_grad):
            loss, nll = _ChunkedProjectionLoss.apply(flat_states, weight, bias, flat_target, *args)
        else:
            loss, nll, _, _ = _chunked(flat_states, weight, bias, flat_target, *args, False)
        return LossOutput(loss, nll, (flat_target != pad_id).sum())
