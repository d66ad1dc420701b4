import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.runtime.dropout import Dropout, dropout, dropout_mask

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)
rates = st.one_of(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2**-33, 1 - 2**-33]), st.floats(0.0, 1.0))


def applied(p: float) -> tuple[float, float]:
    """The drop rate the mask applies and the scale of what it keeps (module docstring)."""
    drop = round(p * 2**32) / 2**32
    return drop, (0.0 if drop == 1.0 else 1.0 / (1.0 - drop))


@settings(max_examples=200, deadline=None)
@given(
    shape=shapes,
    p=rates,
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_mask_is_zero_or_the_scale_and_the_same_for_a_seed(shape, p, seed, dtype):
    torch.manual_seed(seed)
    mask = dropout_mask(shape, p, dtype)
    torch.manual_seed(seed)
    again = dropout_mask(shape, p, dtype)
    assert mask.shape == shape and mask.dtype == dtype
    assert torch.equal(mask, again)
    drop, scale = applied(p)
    values = set(mask.unique().tolist())
    assert values <= {0.0, torch.tensor(scale, dtype=dtype).item()}
    if drop == 0.0:
        assert values <= {1.0}


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_every_element_is_dropped_at_the_rate_independently_of_its_neighbour(p):
    # One 64-bit draw serves two elements: each half must be uniform (a draw without the sign bit
    # would never drop the elements that take its high half) and the two halves independent.
    n = 400_000
    torch.manual_seed(7)
    kept = dropout_mask((n,), p) > 0
    dropped = ~kept
    sigma = math.sqrt(p * (1 - p) / (n / 2))
    for half in (dropped[0::2], dropped[1::2]):
        assert abs(half.double().mean().item() - p) < 6 * sigma
    both = (dropped[0::2] & dropped[1::2]).double().mean().item()
    assert abs(both - p * p) < 6 * math.sqrt(p * p * (1 - p * p) / (n / 2))


def test_output_is_input_times_mask_and_its_gradient_the_mask():
    x = torch.randn(5, 7, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25)
    torch.manual_seed(3)
    mask = dropout_mask((5, 7), 0.25)
    torch.testing.assert_close(y, x.detach() * mask, rtol=0, atol=0)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, mask, rtol=0, atol=0)
    assert 0 < int((mask == 0).sum()) < 35  # not all dropped, not none: this seed drops some


def test_expectation_is_the_input():
    torch.manual_seed(0)
    x = torch.full((1000, 1000), 2.0)
    # sd of the mean: 2 · sqrt(0.3 / 0.7) / 1000 ≈ 0.0013
    assert abs(dropout(x, 0.3).mean().item() - 2.0) < 0.01


def test_module_is_identity_in_eval_and_at_rate_zero():
    x = torch.randn(4, 3)
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    assert "p=0.5" in repr(module)


@pytest.mark.parametrize("p", [-0.1, 1.5, math.nan])
def test_rates_outside_zero_one_are_refused(p):
    with pytest.raises(ValueError, match="dropout rate must be in"):
        Dropout(p)
    with pytest.raises(ValueError, match="dropout rate must be in"):
        dropout_mask((3,), p)


def test_other_dtypes_use_torch_dropout():
    x = torch.randn(64, 64).bfloat16()
    torch.manual_seed(5)
    y = dropout(x, 0.2)
    torch.manual_seed(5)
    torch.testing.assert_close(y, F.dropout(x, 0.2, training=True), rtol=0, atol=0)


@pytest.mark.parametrize("p", [torch.tensor(0.25), torch.tensor(1.0)])
def test_a_tensor_rate_is_taken_as_torch_dropout_takes_it(p):
    x = torch.ones(64, 64)
    torch.manual_seed(2)
    y = Dropout(p).train()(x)
    torch.manual_seed(2)
    torch.testing.assert_close(y, x * dropout_mask(x.shape, float(p)), rtol=0, atol=0)


def test_the_rate_is_checked_in_eval_too():
    with pytest.raises(ValueError, match="dropout rate must be in"):
        dropout(torch.ones(3), math.nan, training=False)


def test_inside_torch_compile_it_is_torch_dropout(monkeypatch):
    # Dynamo cannot trace random_: inside a compiled function the mask is PyTorch's own.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(32, 32)
    torch.manual_seed(4)
    y = dropout(x, 0.3)
    torch.manual_seed(4)
    torch.testing.assert_close(y, F.dropout(x, 0.3, training=True), rtol=0, atol=0)


@pytest.mark.slow
def test_a_compiled_model_with_dropout_is_one_graph():
    from conftest import random_sources, tiny_config

    from nmt.core.model import Transformer

    model = Transformer(tiny_config(dropout=0.1)).train()
    explained = torch._dynamo.explain(model)(random_sources([6, 4]), random_sources([5, 3]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
