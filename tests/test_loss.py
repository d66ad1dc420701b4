import math

import pytest
import torch
import torch.nn.functional as F

from nmt.core.loss import label_smoothed_loss


def test_hand_computed_value():
    # vocab 4 (PAD = 0), one target position with reference 2, ε = 0.1.
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0]]])
    z = math.log(sum(math.exp(v) for v in (0.0, 1.0, 2.0, 3.0)))
    lp = [v - z for v in (0.0, 1.0, 2.0, 3.0)]
    # Reference gets 0.9; classes 1 and 3 get 0.1 / (4 - 2) = 0.05 each; PAD gets nothing.
    expected = -(0.9 * lp[2] + 0.05 * lp[1] + 0.05 * lp[3])
    out = label_smoothed_loss(logits, torch.tensor([[2]]), 0.1)
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.nll.item() == pytest.approx(-lp[2], abs=1e-6)
    assert out.n_tokens == 1


def test_padding_contributes_nothing():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 10)
    target = torch.tensor([[4, 5, 6], [7, 8, 9]])
    base = label_smoothed_loss(logits, target, 0.1)
    padded_logits = torch.cat([logits, torch.randn(2, 4, 10) * 50], 1)
    padded_target = torch.cat([target, torch.zeros(2, 4, dtype=torch.long)], 1)
    padded = label_smoothed_loss(padded_logits, padded_target, 0.1)
    assert padded.n_tokens == base.n_tokens == 6
    torch.testing.assert_close(padded.loss, base.loss)
    torch.testing.assert_close(padded.nll, base.nll)


def test_no_smoothing_is_cross_entropy():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 12)
    target = torch.randint(1, 12, (3, 5))
    target[0, 3:] = 0
    out = label_smoothed_loss(logits, target, 0.0)
    ref = F.cross_entropy(logits.view(-1, 12), target.view(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(out.nll, ref)


def test_low_precision_logits_are_scored_in_float32():
    logits = torch.randn(2, 4, 50000).to(torch.bfloat16) * 30
    target = torch.randint(4, 50000, (2, 4))
    out = label_smoothed_loss(logits, target, 0.1)
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def autograd_reference(logits, target, smoothing, pad_id=0):
    """The same loss written plainly, differentiated by autograd."""
    lprobs = F.log_softmax(logits.float(), dim=-1)
    vocab = lprobs.size(-1)
    q = torch.full_like(lprobs, smoothing / (vocab - 2))
    q[..., pad_id] = 0.0
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - smoothing)
    per_token = -(q * lprobs).sum(-1)
    return (per_token * (target != pad_id)).sum()


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_gradient_equals_autograd_of_the_plain_formula(smoothing):
    torch.manual_seed(2)
    logits = torch.randn(3, 7, 30, requires_grad=True)
    target = torch.randint(1, 30, (3, 7))
    target[1, 4:] = 0
    target[2, 0] = 3
    weight = torch.rand(())  # a non-unit upstream gradient
    (weight * label_smoothed_loss(logits, target, smoothing).loss).backward()
    ours = logits.grad.clone()
    logits.grad = None
    reference = autograd_reference(logits, target, smoothing)
    (weight * reference).backward()
    torch.testing.assert_close(ours, logits.grad, atol=1e-6, rtol=1e-5)
    assert ours[1, 4:].abs().max() == 0  # padded positions get no gradient
    torch.testing.assert_close(label_smoothed_loss(logits, target, smoothing).loss, reference)


def test_bf16_logits_get_a_bf16_gradient():
    logits = (torch.randn(2, 3, 40) * 5).to(torch.bfloat16).requires_grad_()
    target = torch.randint(1, 40, (2, 3))
    label_smoothed_loss(logits, target, 0.1).loss.backward()
    assert logits.grad.dtype == torch.bfloat16
    reference = logits.detach().float().requires_grad_()
    autograd_reference(reference, target, 0.1).backward()
    torch.testing.assert_close(logits.grad.float(), reference.grad, atol=1e-2, rtol=1e-2)
