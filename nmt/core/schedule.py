"""Learning-rate schedules, as functions of the optimizer step (1-based)."""

from __future__ import annotations

import torch


def noam_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """``scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)`` (Vaswani et al. 2017,
    §5.3).

    Rises linearly for ``warmup_steps`` steps to its peak ``scale · (d_model · warmup_steps)^-0.5``,
    then decays with the inverse square root of the step.
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def inverse_sqrt_lr(step: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak_lr`` over ``warmup_steps`` steps, then ``peak_lr · sqrt(warmup_steps
    / step)`` (fairseq's inverse_sqrt)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup_steps, (warmup_steps / step) ** 0.5)


def constant_lr(step: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak_lr`` over ``warmup_steps`` steps, then ``peak_lr`` (fine-tuning;
    ``warmup_steps`` 1: no warm-up)."""
    return peak_lr * min(max(step, 1) / warmup_steps, 1.0)


def linear_lr(step: int, peak_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warm-up to ``peak_lr`` over ``warmup_steps`` steps, then a linear decay that reaches 0
    after step ``max_steps``: update ``max_steps`` uses ``peak_lr / (max_steps - warmup_steps +
    1)``, every later one 0 (Hugging Face's ``get_linear_schedule_with_warmup``; fairseq's
    ``polynomial_decay`` with power 1 and an end rate of 0). A run stopped by ``max_epochs`` or
    ``max_time_s`` before ``max_steps`` ends above 0.
    """
    step = max(step, 1)
    decay = (max_steps - step + 1) / (max(max_steps - warmup_steps, 0) + 1)
    return peak_lr * max(0.0, min(step / warmup_steps, decay))


def build_scheduler(
    optimizer: torch.optim.Optimizer, train_cfg, d_model: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` whose factor is the absolute learning rate (param groups start at lr 1.0).

    After ``k`` calls of ``scheduler.step()`` the optimizer uses the rate of step ``k + 1``.
    """
    for group in optimizer.param_groups:
        group["lr"] = 1.0
        group["initial_lr"] = 1.0
    if train_cfg.schedule == "noam":
        fn = lambda k: noam_lr(k + 1, d_model, train_cfg.warmup_steps, train_cfg.lr_scale)  # noqa: E731
    elif train_cfg.schedule == "linear":
        fn = lambda k: linear_lr(k + 1, train_cfg.lr, train_cfg.warmup_steps, train_cfg.max_steps)  # noqa: E731
    elif train_cfg.schedule == "constant":
        fn = lambda k: constant_lr(k + 1, train_cfg.lr, train_cfg.warmup_steps)  # noqa: E731
    else:
        fn = lambda k: inverse_sqrt_lr(k + 1, train_cfg.lr, train_cfg.warmup_steps)  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
