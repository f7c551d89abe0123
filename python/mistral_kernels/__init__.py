"""mistral-kernels: hand-written CPU/CUDA kernels and Mistral / Mixtral / Llama decoders for PyTorch.

Ops live in :mod:`mistral_kernels.ops` (CPU and CUDA tensors), their SIMT-emulated CUDA twins in
:mod:`mistral_kernels.emulated` (CPU tensors), plain-PyTorch references in :mod:`mistral_kernels.reference`.
"""

from __future__ import annotations

from ._library import (CPU_ISA_LEVELS, cpu_isa, cpu_isa_supported, cuda_compiled, emulator_compiled,
                       library_path, set_cpu_isa)

__version__ = "0.1.0"

from . import ops, reference  # noqa: E402  (ops needs the library loaded above)
from .config import ModelConfig  # noqa: E402
from .checkpoint import Checkpoint  # noqa: E402
from .model import Model  # noqa: E402
from .loading import load_model  # noqa: E402
from .tokenization import Tokenizer, load_tokenizer  # noqa: E402
from .llm import LLM  # noqa: E402
from .engine_args import EngineArgs  # noqa: E402
from .sampling_params import SamplingParams  # noqa: E402

__all__ = [
    "CPU_ISA_LEVELS",
    "Checkpoint",
    "EngineArgs",
    "LLM",
    "Model",
    "ModelConfig",
    "__version__",
    "cpu_isa",
    "cpu_isa_supported",
    "cuda_compiled",
    "emulator_compiled",
    "library_path",
    "load_model",
    "load_tokenizer",
    "Tokenizer",
    "ops",
    "reference",
    "SamplingParams",
    "set_cpu_isa",
]
