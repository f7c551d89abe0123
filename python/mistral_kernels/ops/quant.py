"""Linear layers on quantized weights: ``qlinear`` (one matrix) and ``moe_qgemm`` (MoE expert stacks over
rows grouped by expert). Formats: csrc/kernels/quant_blocks.h (codes, block layouts), in Python
:mod:`mistral_kernels.quant_formats` (``QFORMATS``).

Shape letters: M rows (tokens), K in features, N out features, QK elements per block, R = K / QK · bytes
per block (a packed row), G experts; ``...`` any leading dims.
"""

from __future__ import annotations

import torch

from ._base import OpFamily, check_index_range, device_checks_apply, require_tensor


class QuantOps(OpFamily):
    """Kernel wrappers of the quantized-linear family, bound to one ``torch.ops`` namespace."""

    def qlinear(
        self,
        x: torch.Tensor,
        qweight: torch.Tensor,
        qtype: int,
        scales: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ W.T`` with W [N, K] quantized; fp32 accumulation, result in x's dtype.

        Parameters
        ----------
        x : [..., K] contiguous, float
        qweight : GGUF block format: uint8 [N, R] (row n = K / QK blocks, GGUF's layout);
            INT8_ROWWISE: int8 [N, K]
        qtype : format code (``quant_formats.QFORMATS[name].qtype``)
        scales : INT8_ROWWISE only: fp32 [N], W[n, k] = qweight[n, k] · scales[n]
        out : optional [..., N] contiguous output

        Returns
        -------
        [..., N] tensor, ``out`` if given.
        """
        require_tensor("qlinear", "x", x)
        require_tensor("qlinear", "qweight", qweight)
        if x.dim() < 1:
            raise ValueError("qlinear: x must be [..., K], got a scalar")
        k = x.shape[-1]
        n = qweight.shape[0] if qweight.dim() >= 1 else 0
        lead = x.shape[:-1]
        if out is None:
            out = x.new_empty((*lead, n))
        else:
            require_tensor("qlinear", "out", out)
            if tuple(out.shape) != (*lead, n):
                raise ValueError(f"qlinear: out must be {[*lead, n]}, got {list(out.shape)}")
            if not out.is_contiguous():
                raise ValueError(f"qlinear: out must be contiguous (each element its own memory), got strides "
                                 f"{list(out.stride())}")
        rows = x.numel() // k if k else 0
        x2 = x.reshape(rows, k) if x.dim() != 2 else x
        o2 = out.view(rows, n) if out.dim() != 2 else out
        self._lib.qlinear(o2, x2, qweight, scales, int(qtype))
        return out

    def moe_qgemm(
        self,
        x: torch.Tensor,
        expert_offsets: torch.Tensor,
        qweight: torch.Tensor,
        qtype: int,
        scales: torch.Tensor | None = None,
        up_qweight: torch.Tensor | None = None,
        up_scales: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The expert projections of a MoE layer on packed expert stacks, all experts in one call.

        For the rows r of segment g = ``[expert_offsets[g], expert_offsets[g+1])``, g < G:
        ``out[r] = x[r] @ W[g].T`` (plain), or with ``up_qweight`` (W3, same format)
        ``out[r] = silu(x[r] @ W[g].T) * (x[r] @ W3[g].T)``, gate and up rounded to x's dtype first (the
        unfused ``qlinear`` + ``silu_and_mul`` rounding); every other row is 0. fp32 accumulation. The offsets
        stay on the device: no host sync on CUDA, so the call can be captured in a CUDA graph.

        Example: offsets ``[0, 2, 2, 5]``, G = 3, M = 5: rows 0-1 use expert 0, expert 1 has none, rows 2-4
        use expert 2.

        Parameters
        ----------
        x : [M, K] contiguous, float; rows grouped by expert (e.g. ``moe_permute``'s permuted_x)
        expert_offsets : int64 [≥ G+1], non-decreasing, within [0, M]
        qweight : GGUF block format: uint8 [G, N, R]; INT8_ROWWISE: int8 [G, N, K]
        qtype : format code (``quant_formats.QFORMATS[name].qtype``) of qweight and up_qweight
        scales : INT8_ROWWISE only: fp32 [G, N]
        up_qweight, up_scales : the up projection W3 (same shapes and format); None: plain
        out : optional [M, N] contiguous output

        Returns
        -------
        [M, N] tensor, ``out`` if given.
        """
        op = "moe_qgemm"
        require_tensor(op, "x", x)
        require_tensor(op, "expert_offsets", expert_offsets)
        require_tensor(op, "qweight", qweight)
        if x.dim() != 2 or qweight.dim() != 3:
            raise ValueError(f"{op}: x must be [M, K] and qweight [G, N, ·], got {list(x.shape)} and "
                             f"{list(qweight.shape)}")
        g, n = qweight.shape[0], qweight.shape[1]
        if expert_offsets.dim() == 1 and expert_offsets.shape[0] > g and device_checks_apply(expert_offsets.device):
            bounds = expert_offsets[: g + 1]  # CUDA (a sync; CPU offsets are checked in C++)
            check_index_range(op, "expert_offsets", bounds, 0, x.shape[0] + 1, "row bounds within [0, M]")
            if g > 0:
                check_index_range(op, "expert_offsets (steps)", bounds[1:] - bounds[:-1], 0, x.shape[0] + 1,
                                  "non-decreasing")
        if out is None:
            out = x.new_empty((x.shape[0], n))
        self._lib.moe_qgemm(out, x, expert_offsets, qweight, scales, int(qtype), up_qweight, up_scales)
        return out
