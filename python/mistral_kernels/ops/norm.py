"""RMSNorm, fused residual-add + RMSNorm, SwiGLU gate. Kernels: csrc/kernels/{norm,activation}.cuh, csrc/cpu/norm.cpp.

Shape letters: H hidden, I intermediate; ``...`` any leading dims.
"""

from __future__ import annotations

import torch

from ._base import OpFamily, require_tensor


class NormOps(OpFamily):
    """Kernel wrappers of the norm family, bound to one ``torch.ops`` namespace (see ``ops/__init__.py``)."""

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """RMSNorm: ``y = x / sqrt(mean(x², -1) + eps) * weight`` with fp32 accumulation.

        Parameters
        ----------
        x : [..., H] contiguous, fp32 / bf16 (CPU) or fp32 / fp16 / bf16 (CUDA)
        weight : [H], same dtype and device as x
        eps : added to the mean square
        out : optional [..., H] output (may be x itself)

        Returns
        -------
        [..., H] tensor, ``out`` if given.
        """
        require_tensor("rms_norm", "x", x)
        if out is None:
            out = torch.empty_like(x)
        self._lib.rms_norm(out, x, weight, float(eps))
        return out

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
    ) -> None:
        """In place: ``residual += x; x = rms_norm(residual, weight, eps)``.

        Rounding: the sum is computed in fp32, rounded once to the dtype and stored in ``residual``;
        the norm is computed from that stored (rounded) value — exactly what the unfused
        ``residual = x + residual; x = rms_norm(residual)`` does in the same dtype.

        Parameters
        ----------
        x : [..., H] contiguous; overwritten with the normalised sum
        residual : [..., H] contiguous, same dtype; overwritten with x + residual
        weight : [H]
        """
        require_tensor("fused_add_rms_norm", "x", x)
        self._lib.fused_add_rms_norm(x, residual, weight, float(eps))

    def silu_and_mul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """SwiGLU gate: ``silu(x[..., :I]) * x[..., I:]`` (fp32 math).

        Parameters
        ----------
        x : [..., 2I] contiguous
        out : optional [..., I]

        Returns
        -------
        [..., I]
        """
        require_tensor("silu_and_mul", "x", x)
        if out is None:
            if x.dim() == 0 or x.shape[-1] % 2:
                raise ValueError(f"silu_and_mul: x must be [..., 2*I] with an even last dim, got {tuple(x.shape)}")
            out = x.new_empty(*x.shape[:-1], x.shape[-1] // 2)
        self._lib.silu_and_mul(out, x)
        return out
