"""The CUDA kernels (csrc/kernels/*.cuh) run on CPU tensors by the SIMT emulator (csrc/simt/emu.h).

Same functions and signatures as :mod:`mistral_kernels.ops`; all tensors must be on the CPU. Slow:
for testing the CUDA code on machines without a GPU. The thread schedule of every launch is chosen
by the environment variable ``MK_SIMT_SCHEDULE`` = ``forward`` (default) | ``reverse`` |
``random[:seed]``.
"""

from __future__ import annotations

import torch

from . import _fake  # noqa: F401  (registers fake impls)
from ._library import emulator_compiled
from ._opset import OpSet
from ._ops_rope import rope_cos_sin_cache

if not emulator_compiled():
    raise ImportError("mistral_kernels.emulated: the emulated kernels were not built (CMake option MK_EMU=OFF)")

_OPS = OpSet(torch.ops.mistral_kernels_emu)

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
    "fused_moe",
    "moe_expert_ffn",
    "moe_permute",
    "moe_unpermute",
    "topk_softmax",
    "fused_add_rms_norm",
    "rms_norm",
    "rope_cos_sin_cache",
    "rotary_embedding",
    "silu_and_mul",
]
