"""The CUDA kernels (csrc/kernels/*.cuh) run on CPU tensors by the SIMT emulator (csrc/simt/emu.h).

Same functions and signatures as :mod:`mistral_kernels.ops` — the same wrapper classes, bound to
``torch.ops.mistral_kernels_emu``. ``linear`` has no CUDA kernel: dense weights take ``ops.linear``'s path,
packed ones their own matmul on the emulated ``qlinear``; ``fused_moe`` hands packed expert stacks the
emulated ops. All tensors must be on the CPU. Slow: for testing the CUDA code on machines without a GPU. The thread schedule of every launch is
chosen by the environment variable ``MK_SIMT_SCHEDULE`` = ``forward`` (default) | ``reverse`` |
``random[:seed]``; ``MK_SIMT_STATS=1`` records per-launch counters read by :func:`simt_stats`. Public import
path: ``mistral_kernels.emulated``.
"""

from __future__ import annotations

import sys

import torch

from .._library import emulator_compiled
from . import bind
from .matmul import make_fused_moe, make_linear
from .quant import QuantOps
from .rope import rope_cos_sin_cache
from .simt_stats import LaunchStats, SiteStats, simt_stats  # noqa: F401  (not ops: no twin in `ops`)

if not emulator_compiled():
    raise ImportError("mistral_kernels.emulated: the emulated kernels were not built (CMake option MK_EMU=OFF)")

_WRAPPERS = bind("mistral_kernels_emu")
globals().update(_WRAPPERS)
linear = make_linear(QuantOps(torch.ops.mistral_kernels_emu))
fused_moe = make_fused_moe(_WRAPPERS["fused_moe"], sys.modules[__name__])

__all__ = [*_WRAPPERS, "linear", "rope_cos_sin_cache"]
