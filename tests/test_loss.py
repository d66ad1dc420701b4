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


def test_what_the_loss_keeps_for_its_backward_pass_is_the_logits_and_a_float_a_token():
    """Between the passes only the logits as they are (bfloat16 under autocast) and ``lse`` (one
    float32 per token) are kept: not a float32 copy of ``tokens × vocab`` (3.8 GB at 30,000
    tokens of a 32,000-piece vocabulary). Float32 logits keep their log-probabilities instead, of
    the same size, which saves the backward pass one pass over them."""
    logits = (torch.randn(6, 40, 1000) * 3).to(torch.bfloat16).requires_grad_()
    target = torch.randint(1, 1000, (6, 40))
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = label_smoothed_loss(logits, target, 0.1)
    tokens = 6 * 40
    assert sum(kept) == logits.numel() * 2 + tokens * (4 + 8)  # logits, lse, target
    out.loss.backward()
    assert logits.grad.dtype == torch.bfloat16
    kept.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        label_smoothed_loss(logits.detach().float().requires_grad_(), target, 0.1)
    assert sum(kept) == logits.numel() * 4 + tokens * 8  # log-probabilities, target


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gradients_equal_autograd_of_the_plain_formula(dtype):
    """With bfloat16 or float16 logits the backward pass works from the logits and lse: its
    gradient is autograd's of the plain formula on the same logits, to the dtype's rounding."""
    torch.manual_seed(4)
    logits = (torch.randn(4, 9, 60) * 5).to(dtype).requires_grad_()
    target = torch.randint(1, 60, (4, 9))
    target[3, 5:] = 0
    (label_smoothed_loss(logits, target, 0.1).loss * 0.3).backward()
    ours = logits.grad.float()
    logits.grad = None
    (autograd_reference(logits, target, 0.1) * 0.3).backward()
    torch.testing.assert_close(ours, logits.grad.float(), atol=2e-3, rtol=1e-2)


@pytest.fixture
def compiled(monkeypatch):
    """The loss of train.compile_loss, with the record of a failed compile cleared."""
    from nmt.config import TrainConfig
    from nmt.runtime.compiled import _Compiled, training_loss

    monkeypatch.setattr(_Compiled, "failed", {})
    return training_loss(TrainConfig(compile_loss=True))


def test_the_compiled_loss_gives_the_eager_values_and_gradients(compiled):
    torch.manual_seed(3)
    for tokens in (7, 12, 30):  # dynamic in the token count: one compile serves them all
        logits = (torch.randn(1, tokens, 50) * 4).requires_grad_()
        target = torch.randint(0, 50, (1, tokens))
        eager = label_smoothed_loss(logits, target, 0.1)
        (grad_eager,) = torch.autograd.grad(eager.loss * 0.7, logits)
        out = compiled(logits, target, 0.1)
        (grad,) = torch.autograd.grad(out.loss * 0.7, logits)
        torch.testing.assert_close(out.loss, eager.loss, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.nll, eager.nll, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad, grad_eager, rtol=1e-5, atol=1e-7)
    assert compiled.rows.failed == {}  # compiled indeed, not the eager fallback


def test_a_loss_that_cannot_compile_runs_eagerly_said_once(compiled, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("no compiler here\nmore detail")

    for passes in (compiled.rows, compiled.gradient):
        monkeypatch.setattr(passes, "compiled", broken)
    logits = torch.randn(2, 5, 20, requires_grad=True)
    target = torch.randint(1, 20, (2, 5))
    with caplog.at_level("WARNING", logger="nmt.runtime"):
        for _ in range(2):
            out = compiled(logits, target, 0.1)
            (grad,) = torch.autograd.grad(out.loss, logits)
    eager = label_smoothed_loss(logits, target, 0.1)
    assert out.loss.item() == eager.loss.item()
    torch.testing.assert_close(grad, torch.autograd.grad(eager.loss, logits)[0], rtol=0, atol=0)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "compiling the loss failed (no compiler here)" in warning


def test_the_loss_is_compiled_only_when_asked():
    from nmt.config import TrainConfig
    from nmt.core.loss import EAGER
    from nmt.runtime.compiled import _Compiled, training_loss

    assert training_loss(TrainConfig()) is EAGER
    asked = training_loss(TrainConfig(compile_loss=True))
    assert isinstance(asked.rows, _Compiled) and isinstance(asked.gradient, _Compiled)
