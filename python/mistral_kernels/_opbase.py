"""Shared plumbing of the public op wrappers.

The wrappers are methods of small per-concern mixin classes (``_ops_norm.NormOps``, ...), combined in
``_opset.OpSet``. ``ops.py`` binds an OpSet to ``torch.ops.mistral_kernels`` (CPU + CUDA kernels) and
``emulated.py`` binds one to ``torch.ops.mistral_kernels_emu`` (the CUDA kernels run by the SIMT
emulator on CPU tensors), so both expose identical functions and signatures.

Argument checks (dtype, device, shape, contiguity, index ranges of CPU tensors) live in the C++ ops
(csrc/checks/) and raise RuntimeError naming the argument. The wrappers add what C++ cannot do cheaply:
index-range checks of CUDA tensors (a device sync; switch off with :func:`device_index_checks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_DEVICE_INDEX_CHECKS = True


@contextlib.contextmanager
def device_index_checks(enabled: bool) -> Iterator[None]:
    """Enable / disable range checks of index tensors that live on a GPU (they cost a device sync).

    The engine's decode loop runs with them off; direct calls keep them on by default.
    """
    global _DEVICE_INDEX_CHECKS
    previous, _DEVICE_INDEX_CHECKS = _DEVICE_INDEX_CHECKS, enabled
    try:
        yield
    finally:
        _DEVICE_INDEX_CHECKS = previous


def check_index_range(op: str, arg: str, t: torch.Tensor, lo: int, hi: int, what: str) -> None:
    """Raise ValueError if a device index tensor has an element outside [lo, hi).

    CPU tensors are checked inside the C++ op (no sync needed); skipped under torch.compile tracing.
    """
    if t.device.type == "cpu" or not _DEVICE_INDEX_CHECKS or t.numel() == 0:
        return
    if torch.compiler.is_compiling():
        return
    bad = (t < lo) | (t >= hi)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise ValueError(f"{op}: {arg}[{i}]={int(t.flatten()[i])} is out of range [{lo}, {hi}) ({what})")


def require_tensor(op: str, arg: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    return t


class OpsBase:
    """Holds the ``torch.ops`` namespace the wrappers call (``torch.ops.mistral_kernels`` or ``..._emu``)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
