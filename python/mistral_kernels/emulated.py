"""Public import path of :mod:`mistral_kernels.ops.emulated` (the CUDA kernels under the SIMT emulator)."""

from .ops.emulated import *  # noqa: F403
from .ops.emulated import __all__, __doc__  # noqa: F401
