import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

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
    return training_loss(TrainConfig(compile_loss=True), torch.device("cpu")).passes


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

    cpu = torch.device("cpu")
    assert training_loss(TrainConfig(), cpu).passes is EAGER
    asked = training_loss(TrainConfig(compile_loss=True), cpu).passes
    assert isinstance(asked.rows, _Compiled) and isinstance(asked.gradient, _Compiled)


def projection_case(vocab: int, tokens: int, d_model: int = 16, bias: bool = True, seed: int = 0):
    """A model-like head (tied matrix ``tgt_embed.weight`` and ``output_bias``), decoder states
    ``(2, tokens, d_model)`` and targets with some PAD."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(vocab, d_model, generator=g))
    head = SimpleNamespace(
        tgt_embed=SimpleNamespace(weight=weight),
        output_bias=torch.randn(vocab, generator=g) if bias else None,
    )
    head.project = lambda h: F.linear(h, weight, head.output_bias)
    states = torch.randn(2, tokens, d_model, generator=g).requires_grad_()
    target = torch.randint(1, vocab, (2, tokens), generator=g)
    target[1, tokens // 2 :] = 0  # PAD: contributes nothing
    return head, states, target


def loss_and_grads(loss_fn, head, states, target, autocast=None):
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        out = loss_fn(states, target, 0.1, head)
    grads = torch.autograd.grad(out.loss * 0.7, (states, head.tgt_embed.weight))
    return out, grads


@settings(max_examples=25, deadline=None)
@given(
    vocab=st.integers(3, 70),
    tokens=st.integers(1, 13),
    chunk=st.integers(1, 40),
    multiple=st.sampled_from([1, 8, 64]),
    bias=st.booleans(),
)
def test_the_chunked_projection_gives_the_whole_projections_values_and_gradients(
    vocab, tokens, chunk, multiple, bias
):
    """Any chunk size (one token, a ragged last chunk, more than all tokens) and any padding of
    the output matrix: the loss, the NLL and the gradients of the states and of the output matrix
    are those of projecting all tokens at once, to float32's rounding."""
    from nmt.core.loss import ProjectedLoss

    head, states, target = projection_case(vocab, tokens, bias=bias)
    whole, whole_grads = loss_and_grads(ProjectedLoss(), head, states, target)
    out, grads = loss_and_grads(ProjectedLoss(chunk, vocab_multiple=multiple), head, states, target)
    torch.testing.assert_close(out.loss, whole.loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.nll, whole.nll, rtol=1e-5, atol=1e-4)
    assert int(out.n_tokens) == int(whole.n_tokens) == int((target != 0).sum())
    for ours, reference in zip(grads, whole_grads):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # validation: no gradients formed, the same values
        scored = ProjectedLoss(chunk, vocab_multiple=multiple)(states, target, 0.1, head)
    torch.testing.assert_close(scored.loss, whole.loss, rtol=1e-5, atol=1e-4)


def test_the_chunked_projection_under_bf16_autocast_matches_the_whole_one():
    """Under autocast the chunks are projected in bfloat16 as the whole projection is; the output
    matrix's gradient is summed over chunks in float32, so it differs from the whole product's
    by bfloat16's rounding, no more."""
    from nmt.core.loss import ProjectedLoss

    head, states, target = projection_case(300, 40, d_model=32)
    whole, whole_grads = loss_and_grads(ProjectedLoss(), head, states, target, torch.bfloat16)
    out, grads = loss_and_grads(
        ProjectedLoss(16, vocab_multiple=64), head, states, target, torch.bfloat16
    )
    torch.testing.assert_close(out.loss, whole.loss, rtol=1e-4, atol=1e-3)
    assert grads[0].dtype == states.dtype and grads[1].dtype == torch.float32
    for ours, reference in zip(grads, whole_grads):
        torch.testing.assert_close(ours, reference, rtol=2e-2, atol=2e-2 * reference.abs().max())


def test_the_chunked_projection_never_holds_tokens_times_vocab():
    """No tensor written while scoring 60 tokens 8 at a time, forward and backward, is larger
    than a chunk's logits (8 × the padded vocabulary) or the output matrix: the whole logits
    (60 × 100) never exist, in any dtype. The whole projection writes them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from nmt.core.loss import ProjectedLoss

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    head, states, target = projection_case(100, 30, d_model=8)  # 60 tokens
    for loss_fn, bound in ((ProjectedLoss(8, vocab_multiple=64), 8 * 128), (ProjectedLoss(), None)):
        with Largest() as seen:
            loss_and_grads(loss_fn, head, states, target)
        if bound:
            assert seen.numel == bound
        else:
            assert seen.numel >= 60 * 100


def test_the_padded_columns_of_the_output_matrix_are_never_scored():
    """Padding the output matrix to a multiple of 64 leaves the vocabulary as it was: each token's
    loss is that of the unpadded 37 classes (ε spread over 35 of them), whatever the padded
    columns would have scored, and they get no gradient."""
    from nmt.core.loss import ProjectedLoss

    head, states, target = projection_case(37, 5, d_model=4, bias=False)
    plain = ProjectedLoss(3)(states, target, 0.1, head)
    padded, (_, grad_weight) = loss_and_grads(
        ProjectedLoss(3, vocab_multiple=64), head, states, target
    )
    assert grad_weight.shape == (37, 4)
    torch.testing.assert_close(padded.loss, plain.loss, rtol=1e-6, atol=1e-5)


def test_a_chunk_size_below_zero_is_refused():
    from nmt.core.loss import ProjectedLoss

    with pytest.raises(ValueError, match="chunk_tokens must be at least 0"):
        ProjectedLoss(-1)


@settings(max_examples=25, deadline=None)
@given(
    vocab=st.integers(3, 60),
    smoothing=st.sampled_from([0.0, 0.1, 0.3]),
    bias=st.booleans(),
    seed=st.integers(0, 5),
)
def test_a_cross_entropy_smoothed_over_all_classes_gives_nmts_loss_with_one_logit_gap(
    vocab, smoothing, bias, seed, monkeypatch
):
    """The benchmark's Liger-Kernel engine: PyTorch's (and Liger's) smoothing spreads ε over all
    ``V`` classes, nmt's over the ``V − 2`` that are neither the reference nor PAD. With ε' = εV/(V
    − 2) and ε/(V − 2) · (z_PAD − z_ref) added per token the two are equal, value and gradients
    (checked here with PyTorch's cross entropy, the kernel's CPU twin)."""
    from pathlib import Path

    from nmt.core.loss import ProjectedLoss

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_train import torch_cross_entropy, uniform_smoothing_loss

    head, states, target = projection_case(vocab, 7, bias=bias, seed=seed)

    def twin(states, target, smoothing, model):
        return uniform_smoothing_loss(states, target, smoothing, model, torch_cross_entropy)

    with torch.autocast("cpu", enabled=False):
        ours = ProjectedLoss()(states, target, smoothing, head)
        theirs = twin(states, target, smoothing, head)
    torch.testing.assert_close(theirs.loss, ours.loss, rtol=1e-5, atol=1e-4)
    grads = torch.autograd.grad(ours.loss, (states, head.tgt_embed.weight))
    twin_grads = torch.autograd.grad(theirs.loss, (states, head.tgt_embed.weight))
    for a, b in zip(twin_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_float16_chunks_sum_the_output_matrix_gradient_without_overflow():
    """Under float16 autocast a chunk's gradients are formed before the loss scale applies, so
    the output matrix's gradient, a sum over the chunk's tokens, is taken in float32: here 12,000
    tokens whose states share a component of 8 give about 95,000 in one entry, past float16's
    65,504. It is finite and equals float32's."""
    from nmt.core.loss import ProjectedLoss

    head, states, target = projection_case(10, 8000, d_model=4, bias=False)
    with torch.no_grad():
        states[..., 0] = 8.0
        head.tgt_embed.weight[5, 0] = 3.0  # piece 5 is predicted everywhere, mostly wrongly
    target[target == 5] = 6
    reference, (_, grad_reference) = loss_and_grads(ProjectedLoss(), head, states, target)
    out, (_, grad) = loss_and_grads(ProjectedLoss(16384), head, states, target, torch.float16)
    assert abs(float(grad_reference[5, 0])) / 0.7 > 65504  # an entry float16 cannot hold
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, grad_reference, rtol=1e-2, atol=1e-2 * 65504)
    torch.testing.assert_close(out.loss, reference.loss, rtol=1e-2, atol=1.0)


def test_chunks_that_fail_on_an_untested_device_give_way_to_the_whole_logits_said_once(
    monkeypatch, caplog
):
    """On a device the tests do not run (a GPU) a failure of the chunks is said once, in one
    line, and the loss scores the whole logits from then on: the values the path that ran
    before gives. On a CPU chunks are what the tests check, so none of this is in the way."""
    from nmt.config import TrainConfig
    from nmt.core import loss as loss_module
    from nmt.core.loss import ProjectedLoss
    from nmt.runtime.compiled import _ChunksOrWhole, training_loss

    tc = TrainConfig(loss_chunk_tokens=4)
    assert type(training_loss(tc, torch.device("cpu"))) is ProjectedLoss
    on_gpu = training_loss(tc, torch.device("cuda"))
    assert isinstance(on_gpu, _ChunksOrWhole) and on_gpu.vocab_multiple == 64
    assert type(training_loss(TrainConfig(), torch.device("cuda"))) is ProjectedLoss

    def broken(*args):
        raise RuntimeError("no kernel image for this device\nmore")

    monkeypatch.setattr(loss_module._ChunkedProjectionLoss, "apply", broken)
    monkeypatch.setattr(_ChunksOrWhole, "failed", None)  # (once a process: restored after)
    falling = _ChunksOrWhole(4)
    head, states, target = projection_case(20, 9)
    whole, whole_grads = loss_and_grads(ProjectedLoss(), head, states, target)
    with caplog.at_level("WARNING", logger="nmt.runtime"):
        for _ in range(2):
            out, grads = loss_and_grads(falling, head, states, target)
        # another one (validation's): the whole logits at once, nothing said again
        again, _ = loss_and_grads(_ChunksOrWhole(8), head, states, target)
    assert out.loss.item() == whole.loss.item() == again.loss.item()
    for ours, reference in zip(grads, whole_grads):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("warning: train.loss_chunk_tokens: scoring in chunks failed on cpu")
    assert "(no kernel image for this device)" in warning
