"""Loads the compiled module ``_C`` (op schemas + CPU / CUDA / emulated kernels) into ``torch.ops``."""

from __future__ import annotations

import ctypes
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


# ---- CPU ISA level (csrc/cpu/isa_select.cpp) ------------------------------------------------------------
CPU_ISA_LEVELS = ("avx512bf16", "avx512", "avx2", "generic")  # best first; MK_CPU_ISA forces one
_ENV_CPU_ISA = "MK_CPU_ISA"


def _native() -> ctypes.CDLL:
    return ctypes.CDLL(str(_PATH))  # the handle of the library loaded above


def cpu_isa() -> str:
    """The ISA level the CPU kernels run: the best one this CPU supports, or the one ``MK_CPU_ISA`` forces.

    Raises RuntimeError when ``MK_CPU_ISA`` names an unknown level or one this CPU does not support (the
    CPU ops raise the same error).
    """
    buf = ctypes.create_string_buffer(512)
    if _native().mk_cpu_isa(buf, ctypes.c_size_t(len(buf))) != 0:
        raise RuntimeError(buf.value.decode())
    return buf.value.decode()


def set_cpu_isa(level: str | None) -> None:
    """Run the CPU kernels at ``level`` from now on (None: back to ``MK_CPU_ISA`` or the CPUID choice).

    For tests and benchmarks that compare levels in one process. ValueError for an unknown level or one
    this CPU does not support.
    """
    err = ctypes.create_string_buffer(512)
    if _native().mk_cpu_isa_set(None if level is None else level.encode(), err, ctypes.c_size_t(len(err))) != 0:
        raise ValueError(f"set_cpu_isa: {err.value.decode()}")


def cpu_isa_supported(level: str) -> bool:
    """Whether this CPU (and this build: other architectures have ``generic`` only) can run ``level``."""
    if level not in CPU_ISA_LEVELS:
        raise ValueError(f"cpu_isa_supported: level must be one of {', '.join(CPU_ISA_LEVELS)}, got {level!r}")
    return _native().mk_cpu_isa_supported(level.encode()) == 1
