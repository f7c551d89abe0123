"""Public import path of :mod:`mistral_kernels.ops.emulated` (the CUDA kernels under the SIMT emulator)."""

from .ops.emulated import *  # noqa: F403
from .ops.emulated import __all__, __doc__  # noqa: F401
from .ops.simt_stats import LaunchStats, SiteStats, simt_stats  # noqa: F401  (MK_SIMT_STATS counters)
