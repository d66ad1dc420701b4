import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nmt.config import TrainConfig
from nmt.core.schedule import build_scheduler, constant_lr, inverse_sqrt_lr, linear_lr, noam_lr


def test_noam_hand_values():
    # d_model 512, warmup 4000 (Vaswani et al. 2017, §5.3).
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.987712429686844e-04)
    assert noam_lr(16000, 512, 4000) == pytest.approx(6.987712429686844e-04 / 2)
    assert noam_lr(2000, 512, 4000) == pytest.approx(6.987712429686844e-04 / 2)


def test_inverse_sqrt_peak_and_decay():
    assert inverse_sqrt_lr(500, 1e-3, 1000) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(1000, 1e-3, 1000) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(4000, 1e-3, 1000) == pytest.approx(5e-4)


def test_constant_warms_up_then_holds_the_peak():
    assert constant_lr(1, 1e-4, 4) == pytest.approx(2.5e-5)
    assert constant_lr(3, 1e-4, 4) == pytest.approx(7.5e-5)
    assert [constant_lr(s, 1e-4, 4) for s in (4, 5, 10_000)] == [1e-4] * 3
    assert constant_lr(1, 1e-4, 1) == 1e-4  # warmup_steps 1: the peak from the first update


def test_linear_warms_up_then_decays_to_zero_at_max_steps():
    # warm-up 4, max_steps 10: peak at step 4, then 7 equal steps down: update 10 uses peak / 7, 11
    # on 0.
    assert [linear_lr(s, 7e-3, 4, 10) for s in (1, 2, 4)] == pytest.approx([1.75e-3, 3.5e-3, 7e-3])
    assert [linear_lr(s, 7e-3, 4, 10) for s in range(5, 12)] == pytest.approx(
        [6e-3, 5e-3, 4e-3, 3e-3, 2e-3, 1e-3, 0.0]
    )
    assert linear_lr(50, 7e-3, 4, 10) == 0.0
    # max_steps inside the warm-up: never reaches the peak
    assert [linear_lr(s, 1e-3, 10, 5) for s in (1, 5, 6)] == pytest.approx([1e-4, 5e-4, 0.0])


@given(warmup=st.integers(1, 50), max_steps=st.integers(1, 200), peak=st.floats(1e-6, 1.0))
def test_linear_rises_to_the_peak_falls_to_zero_and_never_leaves_the_range(warmup, max_steps, peak):
    rates = [linear_lr(s, peak, warmup, max_steps) for s in range(1, max_steps + 3)]
    assert all(0.0 <= r <= peak * (1 + 1e-12) for r in rates)
    assert all(r > 0 for r in rates[:max_steps])  # every update of the run moves the weights
    assert rates[max_steps:] == [0.0, 0.0]  # none after it
    top = min(warmup, max_steps) - 1
    assert all(a <= b for a, b in zip(rates[:top], rates[1 : top + 1]))  # warm-up: non-decreasing
    assert all(a >= b for a, b in zip(rates[top:], rates[top + 1 :]))  # then non-increasing
    if warmup <= max_steps:
        assert rates[warmup - 1] == pytest.approx(peak)


@pytest.mark.parametrize("schedule", ["noam", "inverse_sqrt", "constant", "linear"])
def test_scheduler_sets_the_rate_of_each_step(schedule):
    cfg = TrainConfig(schedule=schedule, warmup_steps=10, lr=1e-3, max_steps=25)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = build_scheduler(opt, cfg, d_model=64)
    fn = {
        "noam": lambda s: noam_lr(s, 64, 10),
        "inverse_sqrt": lambda s: inverse_sqrt_lr(s, 1e-3, 10),
        "constant": lambda s: constant_lr(s, 1e-3, 10),
        "linear": lambda s: linear_lr(s, 1e-3, 10, 25),
    }[schedule]
    for step in range(1, 30):
        # the rate used by update `step`
        assert opt.param_groups[0]["lr"] == pytest.approx(fn(step))
        opt.step()
        sched.step()
