"""Fake (meta) implementations so every op traces under torch.compile(fullgraph=True).

All ops write into caller-provided outputs and return nothing, so their fake impls only need to
exist; shapes are produced by the Python wrappers that allocate the outputs.
"""

from __future__ import annotations

import torch

_MUTATING_OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
)


def _returns_nothing(*args: object, **kwargs: object) -> None:
    return None


for _ns in ("mistral_kernels", "mistral_kernels_emu"):
    for _name in _MUTATING_OPS:
        torch.library.register_fake(f"{_ns}::{_name}")(_returns_nothing)
