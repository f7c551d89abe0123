"""Mixtral's sparse MoE block on packed (quantized) experts: router → permute → one qlinear per expert
segment → weighted unpermute.

The experts' weights are :class:`~mistral_kernels.quant_weight.QuantizedWeight` stacks [E, I, H] / [E, H, I]
(GGUF ``ffn_*_exps`` blocks, or INT8_ROWWISE from ``quantize="int8"``). There is no grouped quantized kernel:
the segments of the experts that received tokens run one by one through ``ops.qlinear`` (three per
expert). The segment bounds come to the host once per layer and step: free on the CPU; on CUDA this is one
device sync per MoE layer, so such a model decodes without CUDA graphs (:func:`has_packed_experts`; the
dense ``fused_moe`` has no sync).

Same math and rounding points as :meth:`mistral_kernels.ops.moe.MoEOps.fused_moe`: router logits, the
gate / up projections, the activation and the expert outputs in x's dtype; softmax and the weighted sum in fp32.

Shape letters: T tokens, H hidden, I intermediate (per expert), E experts, k top-k, M = T·k permuted rows.
"""

from __future__ import annotations

from types import ModuleType

import torch

from . import ops
from .quant_weight import QuantizedWeight

__all__ = ["has_packed_experts", "packed_moe"]


def has_packed_experts(model: object) -> bool:
    """Whether some layer of ``model`` runs :func:`packed_moe` (then decode steps cannot be CUDA graphs)."""
    return any(isinstance(getattr(layer, "w1", None), QuantizedWeight) for layer in getattr(model, "layers", ()))


def packed_moe(kernels: ModuleType, x: torch.Tensor, gate: torch.Tensor, w1: QuantizedWeight, w2: QuantizedWeight,
               w3: QuantizedWeight, top_k: int, renormalize: bool = True) -> torch.Tensor:
    """x [T, H] → [T, H]: ``Σ_j w[t, j] · w2[e]·(silu(w1[e]·x[t]) * w3[e]·x[t])`` over the top-k experts e.

    gate : dense router weight [E, H]; w1, w3 : packed [E, I, H]; w2 : packed [E, H, I].
    ``kernels`` is the op namespace of the router / permute / activation ops (ops or emulated).
    """
    num_experts = gate.shape[0]
    logits = ops.linear(x, gate)                                                  # [T, E]
    topk_weights, topk_ids = kernels.topk_softmax(logits, top_k, renormalize)      # [T, k]
    permuted, offsets, inv_perm = kernels.moe_permute(x, topk_ids, num_experts)    # [M, H], [E+1], [T, k]
    expert_out = torch.empty_like(permuted)                                       # every row is some expert's
    bounds = offsets.tolist()
    for e in range(num_experts):
        a, b = bounds[e], bounds[e + 1]
        if a == b:
            continue
        rows = permuted[a:b]                                                      # [m, H]
        gate_up = torch.cat([ops.linear(rows, w1[e]), ops.linear(rows, w3[e])], dim=-1)  # [m, 2I]
        ops.linear(kernels.silu_and_mul(gate_up), w2[e], out=expert_out[a:b])           # [m, H]
    return kernels.moe_unpermute(expert_out, topk_weights, inv_perm)
