"""The processes of a ``torchrun`` job, the decisions they take together, and stop signals.

Every decision that changes what the processes do next (validate, save, stop) must be
taken identically by all of them, or one process leaves the loop while another waits in
a collective operation for ever. :meth:`Distributed.agree` turns each process's local
view (a signal, its own clock) into one value all processes share; rank-0-only work
(data preparation, validation, writing checkpoints) ends in :meth:`Distributed.share`,
whose wait has no short timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from nmt.errors import NmtError

log = logging.getLogger("nmt.train")

# How long ranks wait for rank 0's preparation or validation: tokenizer training and
# encoding on a WMT-sized corpus take far longer than a collective's default timeout
# (10 minutes with NCCL). A crashed rank 0 still ends the wait at once: Gloo notices the
# closed connection, and torchrun stops the other processes.
RANK0_WORK_TIMEOUT = datetime.timedelta(hours=24)


#: What Gloo and NCCL say when another process of the job died or left: its connection broke, or a
#: collective waited for it in vain. Matched in an error's text: the backends raise RuntimeError or
#: torch.distributed.DistError with these words, not a type of their own.
PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Socket Timeout",
    "DistNetworkError",
    "communicator was aborted",
)


class PeerLost(NmtError, RuntimeError):
    """Another process of the job stopped, so this one cannot go on (one line, exit 2)."""


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective operation failing because another process of the job is
    gone."""
    return isinstance(exc, (RuntimeError, dist.DistError)) and any(
        words in str(exc) for words in PEER_LOST
    )


class Distributed:
    """This process's place in a ``torchrun`` job (rank 0 of 1 without one).

    ``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; the process group uses
    NCCL on GPUs and Gloo on CPUs, plus a Gloo group with a long timeout for waiting on
    rank 0. Only rank 0 writes files.
    """

    def __init__(self, device: torch.device):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = device
        self.owns_group = False
        self.waits = None
        if self.world_size > 1:
            if self.device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
                self.owns_group = True
            self.waits = dist.new_group(backend="gloo", timeout=RANK0_WORK_TIMEOUT)

    @property
    def enabled(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the process that logs and writes files."""
        return self.rank == 0

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) on every rank, waiting as long as rank 0
        needs."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.waits)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.waits)
        return out

    def agree(self, **flags: bool) -> dict[str, bool]:
        """Each flag true on every rank if it is true on any rank (one small all-reduce).

        The flags are host values, so they travel over the CPU (Gloo) group: on GPUs an NCCL
        all-reduce here would make every training step wait for the device to drain.
        """
        if not self.enabled:
            return flags
        values = torch.tensor([int(v) for v in flags.values()])
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.waits)
        return dict(zip(flags, (bool(v) for v in values.tolist())))

    def on_main(self, work: Callable[[], Any]) -> Any:
        """``work()`` on rank 0 (None elsewhere); its error is raised on every rank, so none waits
        for ever."""
        result = error = None
        if self.main:
            try:
                result = work()
            except Exception as exc:
                if not self.enabled:
                    raise
                error = exc
        error = self.share(error)
        if error is not None:
            raise error
        return result

    def close(self) -> None:
        """Destroy the process group if this object created it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


class Interrupted(Exception):
    """A stop signal arrived inside :meth:`StopSignal.interruptible` work (validation)."""


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps, so the run saves
    ``last.pt`` and exits cleanly instead of dying mid-step (or mid-write).

    Inside :meth:`interruptible` (validation, which may take minutes) the first signal
    also raises :class:`Interrupted` at once. A second signal raises ``KeyboardInterrupt``
    wherever the process is: files are replaced atomically, so nothing already written is
    corrupted, and ``--resume`` continues from the newest checkpoint. A signal within
    :attr:`SAME_REQUEST_S` of the first counts as the same request: on Ctrl-C, ``torchrun``
    forwards the terminal's SIGINT to processes that already got it.
    """

    SAME_REQUEST_S = 1.0

    def __init__(self):
        self.received: int | None = None
        self.received_at = 0.0
        self.previous: dict[int, Any] = {}
        self._interruptible = False

    def __enter__(self) -> "StopSignal":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            if time.monotonic() - self.received_at < self.SAME_REQUEST_S:
                return
            raise KeyboardInterrupt
        self.received, self.received_at = signum, time.monotonic()
        log.warning(
            "warning: %s received: stopping after saving last.pt (send it again to stop at once)",
            signal.Signals(signum).name,
        )
        if self._interruptible:
            raise Interrupted

    @contextlib.contextmanager
    def interruptible(self):
        """Work in this block is abandoned (:class:`Interrupted`) by the first signal."""
        self._interruptible = True
        try:
            if self.received is not None:
                raise Interrupted
            yield
        finally:
            self._interruptible = False

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
