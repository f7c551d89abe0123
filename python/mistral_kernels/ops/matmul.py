"""``linear``: the model's projection matmul, and ``fused_moe`` on a model's expert weights. Kernel:
csrc/cpu/linear.cpp (CPU only).

Shape letters: M rows (tokens), K in features, N out features.

Decode-sized inputs on the CPU (M ≤ 16, fp32 / bf16 / fp16) go to our ``skinny_linear`` kernel
(csrc/cpu/linear.cpp), which streams the weight once at memory bandwidth; everything else (prefill,
CUDA tensors) goes to torch's GEMM (oneDNN / cuBLAS), which is compute-bound and already good there.

Any other weight is a packed one (:mod:`mistral_kernels.quant_weight`: GGUF blocks, int8 rows) and owns its
matmul: ``weight.linear(x, kernels, out)`` with this namespace's quantized ops (``qlinear``), on every device
and for every M. :func:`make_linear` builds the same function for another namespace (the emulated kernels),
:func:`make_fused_moe` the MoE block that hands packed expert stacks their own (``w1.fused_moe(kernels, ...)``).
Nothing here knows the packed types: a weight is a dense tensor or an object with those methods.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .quant import QuantOps

SKINNY_MAX_M = 16  # must match kMaxM in csrc/cpu/linear.cpp (its GEMV; fp32 above it: its tile GEMM)
_SKINNY_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_skinny_linear = torch.ops.mistral_kernels.skinny_linear.default


def make_linear(quant: Any) -> Callable[..., torch.Tensor]:
    """``linear`` whose packed weights run on ``quant`` (an object with ``qlinear``: a :class:`QuantOps`)."""

    def linear(x: torch.Tensor, weight: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T`` without bias.

        Parameters
        ----------
        x : [..., K]
        weight : [N, K], same dtype and device as x; or a packed weight [N, K] on x's device (its own
            ``weight.linear(x, kernels, out)``: ``qlinear``)
        out : optional [..., N] contiguous output

        Returns
        -------
        [..., N]
        """
        # Decode hot path (called ~4× per layer per step): as few Python-level checks as possible — the types
        # here, the rest in C++ (csrc/cpu/linear.cpp) or in _check_gemm_args for the torch GEMM path.
        if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)
                and (out is None or isinstance(out, torch.Tensor))):
            return _own_linear(x, weight, out, quant)
        if (
            x.is_cpu
            and x.dtype in _SKINNY_DTYPES
            and x.dim() >= 1
            and weight.dim() == 2
            and (x.numel() <= SKINNY_MAX_M * x.shape[-1] or x.dtype == torch.float32)
            and (out is None or (out.shape == x.shape[:-1] + weight.shape[:1] and out.is_contiguous()))
            and x.is_contiguous()
            and weight.is_contiguous()
            and not torch.compiler.is_compiling()
        ):
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if out is None:
                out = x.new_empty(x.shape[:-1] + weight.shape[:1])
            x2 = x if x.dim() == 2 else x.view(rows, x.shape[-1])
            o2 = out if out.dim() == 2 else out.view(rows, weight.shape[0])
            _skinny_linear(o2, x2, weight)
            return out
        _check_gemm_args(x, weight, out)
        if out is None:
            return torch.nn.functional.linear(x, weight)
        return torch.matmul(x, weight.T, out=out)

    return linear


linear = make_linear(QuantOps(torch.ops.mistral_kernels))


def make_fused_moe(dense: Callable[..., torch.Tensor], kernels: Any) -> Callable[..., torch.Tensor]:
    """``fused_moe`` over dense expert stacks (``dense``: the kernel's wrapper) or packed ones, which run their
    own block with the ops of ``kernels`` (the whole namespace: router, permute, grouped GEMMs, unpermute)."""

    @functools.wraps(dense)  # the kernel wrapper's docstring; ``__wrapped__`` is the wrapper
    def fused_moe(x: torch.Tensor, gate_weight: torch.Tensor, w1: Any, w2: Any, w3: Any, top_k: int = 2,
                  renormalize: bool = True) -> torch.Tensor:
        if isinstance(w1, torch.Tensor):
            return dense(x, gate_weight, w1, w2, w3, top_k, renormalize)
        if not hasattr(w1, "fused_moe"):
            raise TypeError(f"fused_moe: w1 must be a torch.Tensor or a packed expert stack, got {type(w1).__name__}")
        return w1.fused_moe(kernels, x, gate_weight, w2, w3, top_k, renormalize)

    fused_moe.__doc__ = (dense.__doc__ or "") + (
        "\n        Packed expert stacks (GGUF blocks, int8 rows) run their own block: ``w1.fused_moe(kernels, ...)``\n"
        "        (:func:`mistral_kernels.packed_moe.packed_moe`: router → permute → ``moe_qgemm`` → unpermute).\n")
    return fused_moe  # type: ignore[return-value]


def _own_linear(x: object, weight: Any, out: object, quant: Any) -> torch.Tensor:
    """``linear`` on a weight that is no dense tensor: the weight's own matmul."""
    if isinstance(x, torch.Tensor) and (out is None or isinstance(out, torch.Tensor)) and hasattr(weight, "linear"):
        if out is not None:
            _check_out(x, weight.shape[0], out)
        return weight.linear(x, quant, out)
    _raise_types(x, weight, out)
    raise AssertionError("unreachable")


def _raise_types(x: object, weight: object, out: object) -> None:  # raises
    for name, v in (("x", x), ("weight", weight), ("out", out)):
        if not isinstance(v, torch.Tensor) and not (name == "out" and v is None):
            also = " or a packed weight (QuantizedWeight / FusedWeight)" if name == "weight" else ""
            raise TypeError(f"linear: {name} must be a torch.Tensor{also}, got {type(v).__name__}")


def _check_gemm_args(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> None:
    """The checks skinny_linear makes in C++, for the torch GEMM path: ValueError naming the argument."""
    if not x.dtype.is_floating_point:
        raise ValueError(f"linear: x must have a floating-point dtype, got {x.dtype}")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"linear: weight ({weight.dtype}, {weight.device}) must match x ({x.dtype}, {x.device})")
    if x.dim() < 1 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"linear: need x [..., K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if out is not None:
        _check_out(x, weight.shape[0], out, weight)


def _check_out(x: torch.Tensor, n: int, out: torch.Tensor, weight: torch.Tensor | None = None) -> None:
    """``out`` of ``linear`` (dense or packed weight): x's dtype and device, [..., N], contiguous — so it owns
    each of its elements (no stride-0 or overlapping rows) — and no memory shared with x or the weight."""
    shape = (*x.shape[:-1], n)
    if out.dtype != x.dtype or out.device != x.device or tuple(out.shape) != shape:
        raise ValueError(f"linear: out must be {x.dtype} {list(shape)} on {x.device}, got {out.dtype} "
                         f"{list(out.shape)} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"linear: out must be contiguous (each element its own memory), got strides "
                         f"{list(out.stride())}; pass torch.empty({list(shape)}) or .contiguous()")
    for name, t in (("x", x), ("weight", weight)):
        if t is not None and out.numel() and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            raise ValueError(f"linear: out shares memory with {name}; pass a separate output tensor")
