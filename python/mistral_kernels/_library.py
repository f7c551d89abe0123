"""Loads the compiled module ``_C`` (op schemas + CPU / CUDA / emulated kernels) into ``torch.ops``."""

from __future__ import annotations

import os
from pathlib import Path

import torch

_ENV_LIBRARY = "MISTRAL_KERNELS_LIBRARY"  # development: path of a _C.so built outside the package


def _find_library() -> Path:
    override = os.environ.get(_ENV_LIBRARY)
    if override:
        path = Path(override)
        if not path.is_file():
            raise ImportError(f"{_ENV_LIBRARY}={override} does not name a file; unset it or point it at a built _C.so")
        return path
    here = Path(__file__).resolve().parent
    candidates = sorted(here.glob("_C*.so"))
    if not candidates:
        raise ImportError(
            f"mistral_kernels: compiled module _C*.so not found in {here}. Build and install the package with "
            "`pip install --no-build-isolation .` (see README), or set "
            f"{_ENV_LIBRARY} to a _C.so built with CMake."
        )
    return candidates[0]


_PATH = _find_library()
torch.ops.load_library(str(_PATH))


def library_path() -> Path:
    """Path of the loaded compiled module."""
    return _PATH


def cuda_compiled() -> bool:
    """True when the CUDA kernels were built (registered for the CUDA dispatch key)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("mistral_kernels::rms_norm", "CUDA")


def emulator_compiled() -> bool:
    """True when the SIMT-emulated CUDA kernels (namespace ``mistral_kernels_emu``) were built."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("mistral_kernels_emu::rms_norm", "CPU")
