"""Mixtral's sparse MoE block on packed (quantized) experts: router → permute → grouped quantized expert GEMMs
(``moe_qgemm``) → weighted unpermute.

The experts' weights are :class:`~mistral_kernels.quant_weight.QuantizedWeight` stacks [E, I, H] / [E, H, I]
(GGUF ``ffn_*_exps`` blocks, or INT8_ROWWISE from ``quantize="int8"``), which run their own grouped GEMMs
(``expert_linear`` / ``expert_swiglu``); this module knows them only by those methods. ``moe_qgemm`` runs every expert in one
call, its blocks (CUDA) or tasks (CPU) mapped to the expert segments from the offsets where they live: no
per-expert Python loop and no host sync, so such a model decodes with CUDA graphs like a dense one. w1 | w3 is
one call with the SwiGLU fused when both are in the same format (a GGUF's ``ffn_gate_exps`` and
``ffn_up_exps`` normally are), else two calls and ``silu_and_mul``; w2 one more call.

Same math and rounding points as :meth:`mistral_kernels.ops.moe.MoEOps.fused_moe`: router logits, the
gate / up projections, the activation and the expert outputs in x's dtype; softmax and the weighted sum in fp32.

Shape letters: T tokens, H hidden, I intermediate (per expert), E experts, k top-k, M = T·k permuted rows.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

__all__ = ["PackedExperts", "packed_moe"]


class PackedExperts(Protocol):
    """What the block asks of a packed expert stack (:class:`~mistral_kernels.quant_weight.QuantizedWeight`)."""

    def expert_linear(self, x: torch.Tensor, offsets: torch.Tensor, kernels: Any) -> torch.Tensor: ...

    def expert_swiglu(self, up: Any, x: torch.Tensor, offsets: torch.Tensor, kernels: Any) -> torch.Tensor: ...


def packed_moe(kernels: Any, x: torch.Tensor, gate: torch.Tensor, w1: PackedExperts, w2: PackedExperts,
               w3: PackedExperts, top_k: int, renormalize: bool = True) -> torch.Tensor:
    """x [T, H] → [T, H]: ``Σ_j w[t, j] · w2[e]·(silu(w1[e]·x[t]) * w3[e]·x[t])`` over the top-k experts e.

    gate : dense router weight [E, H]; w1, w3 : packed [E, I, H]; w2 : packed [E, H, I].
    ``kernels`` is the op namespace of every call here (ops, emulated or reference), the router's matmul included.
    """
    num_experts = gate.shape[0]
    logits = kernels.linear(x, gate)                                              # [T, E]
    topk_weights, topk_ids = kernels.topk_softmax(logits, top_k, renormalize)      # [T, k]
    permuted, offsets, inv_perm = kernels.moe_permute(x, topk_ids, num_experts)    # [M, H], [E+1], [T, k]
    act = w1.expert_swiglu(w3, permuted, offsets, kernels)                         # [M, I]
    expert_out = w2.expert_linear(act, offsets, kernels)                           # [M, H]
    return kernels.moe_unpermute(expert_out, topk_weights, inv_perm)
