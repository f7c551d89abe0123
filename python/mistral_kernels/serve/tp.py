"""``serve --tp N`` under torchrun: rank 0 serves HTTP, ranks > 0 mirror its engine calls.

Design: rank 0's engine loop, before each step, broadcasts the engine operations it applied since the last
step (add a request with its prompt ids, sampling params and request id; abort a request; shut down) with
``torch.distributed.broadcast_object_list`` over a gloo process group, and every rank > 0 runs
:func:`follow`, which receives that list, applies the same operations to its own engine in the same order
and then steps, so that all ranks run the same collectives (the all-reduces of the sharded layers, the
broadcast of rank 0's sampled ids) in the same order.

Idle: rank 0's loop waits for work (no broadcast, no spinning) and the followers wait inside the broadcast;
every :data:`HEARTBEAT_S` seconds of idleness rank 0 sends an empty list, so that a follower's wait never
reaches the process group's timeout (gloo: 30 min by default). With NCCL (``--device cuda``) the control
messages still go over a separate gloo group: a follower waiting in an NCCL broadcast would keep a kernel
spinning on its GPU and would be killed by NCCL's watchdog timeout (10 min by default) on an idle server.

Shutdown: torchrun forwards SIGINT / SIGTERM to every rank. Rank 0 shuts down gracefully (uvicorn) and its
engine loop sends the shutdown operation last; followers ignore the signals (exiting early would leave
rank 0 blocked in a collective) and return when they receive shutdown, so every rank exits 0. If rank 0's
engine loop fails, the process exits 1 at once (torchrun then stops the other ranks) rather than leave the
followers waiting in a collective that will never complete.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..engine import CheckedRequest, Engine

__all__ = ["HEARTBEAT_S", "AddOp", "AbortOp", "EngineMirror", "Sync", "control_group", "follow"]

HEARTBEAT_S = 60.0


@dataclass(frozen=True)
class AddOp:
    rid: int  # the id rank 0's engine gave the request; a follower's engine must give the same
    request: CheckedRequest  # as rank 0's engine admitted it


@dataclass(frozen=True)
class AbortOp:
    rid: int


@dataclass(frozen=True)
class Sync:
    """One broadcast: operations to apply in order, then one :meth:`Engine.step` if ``step``;
    ``shutdown`` ends the followers (after the operations)."""

    ops: list[AddOp | AbortOp]
    step: bool
    shutdown: bool = False


def control_group(backend: str) -> Any:
    """The process group for the control messages: the default group when it is gloo, else a new gloo group
    (every rank must call this, in the same order)."""
    import torch.distributed as dist

    return None if backend == "gloo" else dist.new_group(backend="gloo")


def _broadcast(message: Sync | None, group: Any) -> Sync:
    import torch.distributed as dist

    box: list[Any] = [message]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


@dataclass
class EngineMirror:
    """Rank 0's side: records the operations its engine loop applies and broadcasts them before each step."""

    group: Any
    pending: list[AddOp | AbortOp] = field(default_factory=list)
    last_sent: float = field(default_factory=time.monotonic)

    def added(self, rid: int, request: CheckedRequest) -> None:
        self.pending.append(AddOp(rid, request))

    def aborted(self, rid: int) -> None:
        self.pending.append(AbortOp(rid))

    def before_step(self) -> None:
        self._send(Sync(self.pending, step=True))

    def idle(self) -> None:
        """Called when the loop found no work: send the pending operations as a heartbeat if it is due."""
        if time.monotonic() - self.last_sent >= HEARTBEAT_S:
            self._send(Sync(self.pending, step=False))

    def shutdown(self) -> None:
        self._send(Sync(self.pending, step=False, shutdown=True))

    def fail(self, error: BaseException) -> None:
        print(f"mistral-kernels serve[rank 0]: the engine loop failed, stopping every rank: {error!r}",
              file=sys.stderr, flush=True)
        os._exit(1)

    def _send(self, message: Sync) -> None:
        _broadcast(message, self.group)
        self.pending = []
        self.last_sent = time.monotonic()


def follow(engine: Engine, group: Any, rank: int) -> None:
    """A rank > 0: apply rank 0's operations and step in lockstep until it sends shutdown.

    SIGINT / SIGTERM are ignored from here on (rank 0 decides when every rank stops)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        message = _broadcast(None, group)
        for op in message.ops:
            if isinstance(op, AbortOp):
                engine.abort(op.rid)
                continue
            rid = engine.add_checked(op.request)
            if rid != op.rid:
                raise RuntimeError(f"rank {rank}: request id {rid} differs from rank 0's {op.rid}; the ranks' "
                                   "engines are out of step")
        if message.shutdown:
            return
        if message.step != engine.has_unfinished():
            raise RuntimeError(f"rank {rank}: rank 0 {'steps' if message.step else 'does not step'} but this "
                               "rank's engine disagrees about unfinished requests; the ranks are out of step")
        if message.step:
            engine.step()  # the outputs are rank 0's to publish; a finished request is gone from the engine
