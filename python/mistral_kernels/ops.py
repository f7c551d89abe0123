"""Public ops on CPU and CUDA tensors (DESIGN.md §3). Wrappers allocate outputs; the C++ ops validate.

Shape letters: T tokens, B sequences, Hq / Hkv heads, D head_dim, H hidden, I intermediate,
E experts, k top-k.
"""

from __future__ import annotations

import torch

from . import _fake  # noqa: F401  (registers fake impls)
from ._linear import linear
from ._opbase import device_index_checks
from ._opset import OpSet
from ._ops_rope import rope_cos_sin_cache

_OPS = OpSet(torch.ops.mistral_kernels)

rms_norm = _OPS.rms_norm
fused_add_rms_norm = _OPS.fused_add_rms_norm
silu_and_mul = _OPS.silu_and_mul
rotary_embedding = _OPS.rotary_embedding

# paged KV cache + attention (issue 4)
reshape_and_cache = _OPS.reshape_and_cache
paged_decode_attention = _OPS.paged_decode_attention
paged_prefill_attention = _OPS.paged_prefill_attention
# top-k MoE (issue 5)
topk_softmax = _OPS.topk_softmax
moe_permute = _OPS.moe_permute
moe_unpermute = _OPS.moe_unpermute
fused_moe = _OPS.fused_moe
moe_expert_ffn = _OPS.moe_expert_ffn

__all__ = [
    "paged_decode_attention",
    "paged_prefill_attention",
    "reshape_and_cache",
    "linear",
    "fused_moe",
    "moe_expert_ffn",
    "moe_permute",
    "moe_unpermute",
    "topk_softmax",
    "device_index_checks",
    "fused_add_rms_norm",
    "rms_norm",
    "rope_cos_sin_cache",
    "rotary_embedding",
    "silu_and_mul",
]
