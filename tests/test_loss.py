import math

import pytest
import torch
import torch.nn.functional as F

from nmt.loss import label_smoothed_loss


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
