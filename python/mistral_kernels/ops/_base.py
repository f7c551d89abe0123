"""What every op family shares: the ``torch.ops`` namespace a wrapper calls, and the index checks of GPU tensors.

Argument checks (dtype, device, shape, contiguity, and the index ranges of CPU tensors) live in the C++ ops
(csrc/checks/) and raise RuntimeError naming the argument. The wrappers add what C++ cannot do without a
device sync: range checks of the index tensors of CUDA calls. They do cost a sync, so every direct call
with CUDA index tensors pays one unless the caller switches them off with :func:`device_index_checks`.
They are skipped (nothing is read back) under ``torch.compile`` tracing and while a CUDA stream is
capturing a graph. The engine switches them off around ``model.forward``: it validates each step's
indices once on the host (:meth:`mistral_kernels.batch.AttentionBatch.build`), so a step has no sync but
the read of the sampled ids (:mod:`mistral_kernels.runner`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_DEVICE_INDEX_CHECKS = True


@contextlib.contextmanager
def device_index_checks(enabled: bool) -> Iterator[None]:
    """Enable / disable the range checks of index tensors that live on a GPU inside the ``with`` block.

    They are on by default and cost one device sync per checked call; a hot loop that builds its
    index tensors itself can switch them off::

        with ops.device_index_checks(False):
            out = ops.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)

    The engine's model runner does exactly that around ``model.forward`` (the step's indices are validated on
    the host when its :class:`~mistral_kernels.batch.AttentionBatch` is built); direct op calls keep them on.
    Index tensors on the CPU are always checked (in C++, without a sync).
    """
    global _DEVICE_INDEX_CHECKS
    previous, _DEVICE_INDEX_CHECKS = _DEVICE_INDEX_CHECKS, enabled
    try:
        yield
    finally:
        _DEVICE_INDEX_CHECKS = previous


def device_index_checks_enabled() -> bool:
    """Whether :func:`device_index_checks` is on (the switch alone; see :func:`device_checks_apply`)."""
    return _DEVICE_INDEX_CHECKS


def device_checks_apply(device: torch.device) -> bool:
    """Whether the wrapper reads back index tensors on ``device`` to check their range.

    Only CUDA tensors (CPU ones are checked in C++), only while :func:`device_index_checks` is on, and
    never while tracing (``torch.compile``) or capturing a CUDA graph — a read-back is impossible there.
    """
    return (
        device.type == "cuda"
        and _DEVICE_INDEX_CHECKS
        and not torch.compiler.is_compiling()
        and not torch.cuda.is_current_stream_capturing()
    )


def check_index_range(op: str, arg: str, t: torch.Tensor, lo: int, hi: int, what: str) -> None:
    """Raise ValueError if an element of the CUDA index tensor ``t`` lies outside [lo, hi) (a device sync)."""
    if t.numel() == 0 or not device_checks_apply(t.device):
        return
    bad = (t < lo) | (t >= hi)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise ValueError(f"{op}: {arg}[{i}]={int(t.flatten()[i])} is out of range [{lo}, {hi}) ({what})")


def require_tensor(op: str, arg: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    return t


class OpFamily:
    """Base of the wrapper classes of one op family: ``self._lib`` is the ``torch.ops`` namespace to call.

    Each public method is the wrapper of the schema of the same name (csrc/registration.cpp).
    """

    def __init__(self, lib: Any) -> None:
        self._lib = lib

    @classmethod
    def wrapper_names(cls) -> list[str]:
        """The op names this family wraps: its public methods."""
        return [n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)]
