"""``load_model``: a checkpoint (or its path) → a :class:`~mistral_kernels.model.Model`, in one process or as
one tensor-parallel rank (:class:`~mistral_kernels.parallel.ShardedModel`).

This module composes the loader (:mod:`.checkpoint`), the decoder (:mod:`.model`) and parallelism
(:mod:`.parallel`), so that none of those imports another's layer above it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import Checkpoint, opened
from .model import Model
from .parallel import ParallelContext, ShardedModel
from .quant_weight import has_packed_matrices, quantize_x_for, with_quantized_activations

_NO_PACKED_INT8 = ("activations='int8' (--activations int8) quantizes the activations of packed (quantized) matrices, "
                   "and this model has none; use activations='auto'")

__all__ = ["load_model"]


def load_model(checkpoint: Checkpoint | str | Path, *, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, progress: bool = False, parallel: ParallelContext | None = None,
               quantized: bool = True, quantize: str | None = None, check_tensors: bool = False,
               activations: str = "auto") -> Model:
    """Load an HF directory, a Mistral consolidated directory or a ``.gguf`` file (:mod:`.checkpoint`): an
    open :class:`~mistral_kernels.checkpoint.Checkpoint` (left open) or a path (opened once, closed after).

    The format and the architecture come from the checkpoint's content (config.json, params.json or GGUF
    metadata); RoPE layout follows the format; weights are not permuted. ``dtype=None`` keeps the
    checkpoint's own dtype (:meth:`mistral_kernels.checkpoint.Checkpoint.default_dtype`: like transformers'
    ``dtype="auto"``; fp16 → bf16 on the CPU). ``progress`` shows a bar over the bytes read. With
    ``parallel`` each rank reads only its shard of every tensor (:func:`mistral_kernels.parallel.shard_index`)
    and gets a :class:`~mistral_kernels.parallel.ShardedModel`.

    ``quantized`` (default True): a GGUF's matrices stay in their stored formats (packed, computed natively;
    ``dtype`` sets activations, norms, embedding and KV cache); False dequantizes them all. ``quantize="int8"``:
    every matrix becomes int8 weight-only (per output row scales). See :mod:`mistral_kernels.checkpoint.packing`.
    With ``parallel`` the weights are dense (a GGUF is dequantized; ``quantize`` is refused).
    ``check_tensors``: also scan every dense weight for inf / NaN (:meth:`Checkpoint.load`).
    ``activations``: how fp32 activations enter the packed matrices' products
    (:func:`~mistral_kernels.quant_weight.quantize_x_for`: ``auto`` = int8 per block, as llama.cpp; ``exact``).
    """
    if parallel is not None and quantize is not None:
        raise ValueError("quantize (--quantize) is not supported with tensor parallelism (--tp)")
    if parallel is not None and activations == "int8":
        raise ValueError(_NO_PACKED_INT8 + " (with tensor parallelism (--tp) a GGUF loads dequantized)")
    with opened(checkpoint) as ckpt:
        quantize_x = quantize_x_for(activations, dtype if dtype is not None else ckpt.default_dtype(device))
        if parallel is None:
            weights = ckpt.load(device, dtype, progress=progress, quantized=quantized, quantize=quantize,
                                check_tensors=check_tensors)
            if activations == "int8" and not has_packed_matrices(weights):
                raise ValueError(_NO_PACKED_INT8 + " (a dense checkpoint, or a GGUF loaded with quantized=False / "
                                 "--dequantize; quantize='int8' / --quantize int8 packs one)")
            return Model(ckpt.config, with_quantized_activations(weights) if quantize_x else weights)
        weights = ckpt.load(device, dtype, progress=progress, shard=parallel.shard, check_tensors=check_tensors)
        return ShardedModel(ckpt.config, weights, parallel)
