"""Fake (meta) implementations so every op traces under torch.compile(fullgraph=True).

All ops write into caller-provided outputs and return nothing, so a fake impl only checks what can
be checked without data: every tensor argument is on one device. (This also makes a real call that
mixes a meta tensor with real ones raise instead of silently dispatching to the fake impl.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MUTATING_OPS = [
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
    # paged KV cache + attention
    "reshape_and_cache",
    "paged_decode_attention",
    "paged_prefill_attention",
    # top-k MoE
    "topk_softmax",
    "moe_permute",
    "moe_unpermute",
    "fused_moe",
]


def _make_fake(ns: str, name: str) -> Callable[..., None]:
    arg_names = [a.name for a in getattr(getattr(torch.ops, ns), name).default._schema.arguments]

    def fake(*args: object, **kwargs: object) -> None:
        tensors = [(n, a) for n, a in [*zip(arg_names, args), *kwargs.items()] if isinstance(a, torch.Tensor)]
        ref_name, ref = tensors[0]
        for n, t in tensors[1:]:
            if t.device != ref.device:
                raise RuntimeError(
                    f"{name}: {n} is on {t.device} but {ref_name} is on {ref.device}; move them to the same device"
                )

    return fake


def register(names: list[str]) -> None:
    for ns in ("mistral_kernels", "mistral_kernels_emu"):
        for name in names:
            torch.library.register_fake(f"{ns}::{name}")(_make_fake(ns, name))


register(MUTATING_OPS)
register(["moe_expert_ffn"])


# CPU-only helper ops (namespace mistral_kernels only).
torch.library.register_fake("mistral_kernels::skinny_linear")(_make_fake("mistral_kernels", "skinny_linear"))
