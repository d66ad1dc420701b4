"""One optimizer update, and the training statistics between log lines."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .batching import Batch
from .loss import LossOutput, ProjectedLoss
from .model import Transformer
from .schedule import build_scheduler

log = logging.getLogger("nmt.train")


class Updater:
    """One optimizer update: forward and backward over ``update_freq`` micro-batches, then
    clipping, the Adam step and the schedule (Vaswani et al. 2017, §5.3-5.4).

    :class:`nmt.training.train.Trainer` and ``scripts/bench_train.py`` both run it. The loss of an
    update is normalised by the non-pad target tokens of all its micro-batches on all processes
    (not averaged per micro-batch), so ``update_freq`` k on one process and k processes
    compute the same gradient. Nothing here reads a device value on the host.
    """

    def __init__(
        self,
        model: Transformer,
        tc,
        device: torch.device,
        world_size: int = 1,
        loss_fn=None,
        context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        compile_step: Callable[[torch.nn.Module], Callable] = lambda module: module,
    ):
        """``tc``: the :class:`~nmt.config.TrainConfig`; ``world_size``: processes training together
        (more than 1: the model is wrapped in ``DistributedDataParallel``, whose process group must
        exist); ``loss_fn(states, target, smoothing, model) -> LossOutput`` (sums) of what the
        module returns for ``(src, tgt_in, project=False)``: a :class:`~nmt.core.loss.ProjectedLoss`
        (the default, whole logits), or what a benchmark swaps in;
        ``context``: entered around each forward pass, for what the device needs
        (:func:`nmt.runtime.device.attention_backends`); ``compile_step``: given the module a step
        runs (the model, or DDP's wrapper of it), what runs it instead, with its ``train()``: the
        module itself, or it compiled (``train.compile``: :func:`nmt.runtime.compiled.compiling`,
        which gives both ``loss_fn`` and this). ``model.cfg.d_model`` sets the noam scale."""
        self.model, self.tc, self.device, self.loss_fn, self.context = (
            model,
            tc,
            device,
            loss_fn or ProjectedLoss(),
            context,
        )
        # fused: one kernel for all parameters instead of a Python loop over them (17% of a CPU
        # step).
        self.optimizer = torch.optim.Adam(
            model.parameters(),
            lr=1.0,
            betas=tc.adam_betas,
            eps=tc.adam_eps,
            weight_decay=tc.weight_decay,
            fused=True,
        )
        self.scheduler = build_scheduler(self.optimizer, tc, model.cfg.d_model)
        self.scaler = torch.amp.GradScaler(device.type, enabled=tc.precision == "fp16")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tc.precision)
        distributed = world_size > 1
        # Buffers (the position table) are deterministic: no need to broadcast them every step.
        trained = DistributedDataParallel(model, broadcast_buffers=False) if distributed else model
        self.trained = compile_step(trained)
        self.ddp_model = trained if distributed else None
        self.world_size = world_size
        self.last_tokens = 0  # non-pad target tokens of the last update on this process
        self.last_lr = 0.0  # the learning rate the last update used
        # the last update was skipped (fp16 overflow, or a non-finite gradient)
        self.skipped = False
        self.nonfinite = False  # the last update's gradients were NaN or infinite

    def apply_settings(self) -> None:
        """Make the optimizer use this config's Adam settings and this schedule's rate for the next
        update: after ``load_state_dict`` (``--resume``) they hold the values the checkpoint was
        written with, and a changed ``adam_betas``, ``adam_eps``, ``weight_decay`` or schedule
        (``warmup_steps``, ``lr``, ...) would otherwise be ignored, or apply one step late."""
        tc, scheduler = self.tc, self.scheduler
        for group, base, rate in zip(
            self.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas
        ):
            group.update(
                betas=tuple(tc.adam_betas),
                eps=tc.adam_eps,
                weight_decay=tc.weight_decay,
                lr=base * rate(scheduler.last_epoch),
            )

    def step(self, group: list[Batch]) -> list[LossOutput]:
        """Train on ``group`` (host tensors, up to ``update_freq`` batches) and update once.

        Afterwards ``last_lr`` is the rate this update used and ``skipped`` says whether it was
        skipped (then the schedule did not advance either): by fp16 gradient scaling, or because
        the gradients were NaN or infinite (``nonfinite``; the weights are then untouched).
        """
        self.last_tokens = sum(b.n_tgt_tokens for b in group)  # counted on the host: no device sync
        n_update = float(self.last_tokens)
        if self.ddp_model is not None:  # DDP averages gradients over processes, hence world_size
            total = torch.tensor(n_update, device=self.device)
            dist.all_reduce(total)
            scale = self.world_size / total
        else:
            scale = 1.0 / n_update
        self.trained.train()
        outs = []
        for k, batch in enumerate(group):
            batch = batch.to(self.device)
            last = self.ddp_model is None or k == len(group) - 1
            with contextlib.nullcontext() if last else self.ddp_model.no_sync():
                with (
                    torch.autocast(
                        self.device.type,
                        dtype=self.autocast_dtype or torch.float32,
                        enabled=self.autocast_dtype is not None,
                    ),
                    self.context(),  # the backward pass runs the kernels the forward pass chose
                ):
                    states = self.trained(batch.src, batch.tgt_in, project=False)
                    out = self.loss(states, batch)
                self.scaler.scale(out.loss * scale).backward()
            outs.append(out)
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        self.nonfinite = not self._gradients_finite()
        if self.nonfinite:  # fp32/bf16: no update; fp16's scaler handles overflow itself, below
            self.skipped = True
            self.optimizer.zero_grad(set_to_none=True)
            return outs
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # The scaler skips an update whose gradients overflowed, and lowers its scale.
        self.skipped = self.scaler.is_enabled() and self.scaler.get_scale() < scale
        if self.skipped:
            log.info(
                "fp16: gradients overflowed at loss scale %g; update skipped, the schedule does "
                "not move",
                scale,
            )
        else:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return outs

    def trial(self, batch: Batch) -> None:
        """The forward and backward pass of ``batch`` (host tensors) as a step runs them, with
        nothing kept: the gradients are dropped, the weights, optimizer and schedule untouched (what
        :func:`nmt.runtime.device.check_fits` runs to see whether a batch fits in memory). Random
        draws (dropout) are consumed: a caller that needs them unchanged saves the generators'
        states."""
        batch = batch.to(self.device)
        self.model.train()
        with (
            torch.autocast(
                self.device.type,
                dtype=self.autocast_dtype or torch.float32,
                enabled=self.autocast_dtype is not None,
            ),
            self.context(),
        ):
            # the model itself: DDP's wrapper would wait for the other processes
            out = self.loss(self.model(batch.src, batch.tgt_in, project=False), batch)
        out.loss.backward()
        self.optimizer.zero_grad(set_to_none=True)

    def loss(self, states, batch: Batch) -> LossOutput:
        """``loss_fn`` of the module's output ``states`` for ``batch`` (on the device)."""
        return self.loss_fn(states, batch.tgt_out, self.tc.label_smoothing, self.model)

    def _gradients_finite(self) -> bool:
        """Clip the gradients (``clip_norm``) and say whether their norm is finite. The norm is the
        same on every process (gradients are all-reduced), so all of them decide alike. With fp16
        the gradient scaler judges overflow instead (True here)."""
        if self.scaler.is_enabled():
            if self.tc.clip_norm > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm)
            return True
        gradients = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.tc.clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm(gradients)
        return bool(torch.isfinite(norm))  # one host read a step (free on a CPU)


class Window:
    """Training statistics since the last log line, kept on the device until read."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Start an empty window: zero loss, NLL and token count."""
        self.loss = torch.zeros((), device=self.device)
        self.nll = torch.zeros((), device=self.device)
        self.tokens = 0
        self.time = time.perf_counter()

    def add(self, out) -> None:
        """Add one micro-batch's summed loss and NLL (detached: the window never holds the
        graph)."""
        self.loss += out.loss.detach()
        self.nll += out.nll.detach()

    def flush(self, progress, lr: float) -> dict:
        """Per-token means over the window (the one host sync per log interval); ``lr`` as given."""
        tokens = max(1, self.tokens)
        values = {
            "step": progress.step,
            "epoch": progress.epoch,
            "loss": float(self.loss) / tokens,
            "nll": float(self.nll) / tokens,
            "lr": lr,
        }
        values["ppl"] = math.exp(min(values["nll"], 50.0))
        values["tgt_tokens_per_s"] = self.tokens / (time.perf_counter() - self.time)
        self.reset()
        return values
