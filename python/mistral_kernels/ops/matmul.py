"""``linear``: the model's projection matmul. Kernel: csrc/cpu/linear.cpp (CPU only).

Shape letters: M rows (tokens), K in features, N out features.

Decode-sized inputs on the CPU (M ≤ 16, fp32 / bf16) go to our ``skinny_linear`` kernel
(csrc/cpu/linear.cpp), which streams the weight once at memory bandwidth; everything else (prefill,
CUDA tensors) goes to torch's GEMM (oneDNN / cuBLAS), which is compute-bound and already good there.
"""

from __future__ import annotations

import torch

SKINNY_MAX_M = 16  # must match kMaxM in csrc/cpu/linear.cpp
_SKINNY_DTYPES = (torch.float32, torch.bfloat16)
_skinny_linear = torch.ops.mistral_kernels.skinny_linear.default


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T`` without bias.

    Parameters
    ----------
    x : [..., K]
    weight : [N, K], same dtype and device as x
    out : optional [..., N] contiguous output

    Returns
    -------
    [..., N]
    """
    # Decode hot path (called ~4× per layer per step): as few Python-level checks as possible.
    if (
        x.is_cpu
        and x.dtype in _SKINNY_DTYPES
        and x.numel() <= SKINNY_MAX_M * x.shape[-1]
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
    if out is None:
        return torch.nn.functional.linear(x, weight)
    return torch.matmul(x, weight.T, out=out)
