"""Public import path of :mod:`mistral_kernels.ops.reference` (plain-PyTorch references of every op)."""

from .ops.reference import *  # noqa: F403
from .ops.reference import __all__, __doc__  # noqa: F401
