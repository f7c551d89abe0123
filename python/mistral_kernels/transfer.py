"""Host → device copies of a step's metadata that never make the host wait for the device.

``torch.tensor(data, device="cuda")`` copies from pageable memory, which synchronises the stream (flagged
by ``torch.cuda.set_sync_debug_mode``). The engine builds its small index tensors on the host each step,
so they go through :func:`to_device` instead: a pinned host tensor copied with ``non_blocking=True`` (the
pinned block is kept until the copy has run: torch's caching host allocator records the stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["copy_into", "to_device"]


def to_device(data: Sequence[Any], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype)`` placed on ``device`` without a host sync (pinned + non_blocking on CUDA)."""
    host = torch.tensor(data, dtype=dtype)
    device = torch.device(device)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, host: torch.Tensor) -> None:
    """``dst.copy_(host)`` for a host tensor, without a host sync when ``dst`` is on CUDA (pinned + non_blocking)."""
    if dst.device.type == "cuda":
        host = host.pin_memory()
    dst.copy_(host, non_blocking=dst.device.type != "cpu")
