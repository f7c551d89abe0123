"""Public ops on CPU and CUDA tensors (docs/design.md §3). Wrappers allocate outputs; the C++ ops validate.

Shape letters: T tokens, B sequences, Hq / Hkv heads, D head_dim, H hidden, I intermediate,
E experts, k top-k.

Where an op lives
-----------------
The op list is the set of schemas in csrc/registration.cpp; nothing in Python repeats it. Each op family
has one module whose class holds the wrapper of every op of the family (validate, allocate outputs,
call ``torch.ops``): ``norm.py`` (rms_norm, fused_add_rms_norm, silu_and_mul), ``rope.py``
(rotary_embedding, plus the plain-torch ``rope_cos_sin_cache``), ``attention.py`` (reshape_and_cache,
paged_decode_attention, paged_prefill_attention), ``moe.py`` (topk_softmax, moe_permute, moe_unpermute,
fused_moe, moe_expert_ffn), ``quant.py`` (qlinear and moe_qgemm: linear layers and MoE experts on quantized
weights). This package binds
those classes to ``torch.ops.mistral_kernels``;
:mod:`mistral_kernels.emulated` binds the same classes to ``torch.ops.mistral_kernels_emu``. A call such as
``ops.paged_decode_attention(...)`` runs one Python function, ``AttentionOps.paged_decode_attention`` in
``attention.py``, before the C++ op.

``matmul.py`` holds :func:`linear` (the model's projections; the CPU-only ``skinny_linear`` kernel for
decode-sized inputs), ``decode.py`` :func:`decode_layers` (CPU only: a decode step's layers in one call, dense or packed weights), ``reference.py`` the plain-PyTorch references, ``_base.py`` the index checks of CUDA
tensors: every direct call with CUDA index tensors checks their range at the cost of a device sync,
unless :func:`device_index_checks` switches that off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _library  # noqa: F401  (loads the compiled module: the schemas below come from it)
from ._base import OpFamily, device_index_checks
from .attention import AttentionOps
from .decode import decode_layers
from .matmul import linear
from .moe import MoEOps
from .norm import NormOps
from .quant import QuantOps
from .rope import RopeOps, rope_cos_sin_cache

NAMESPACES = ("mistral_kernels", "mistral_kernels_emu")  # kernels on CPU / CUDA tensors; emulated CUDA kernels
FAMILIES: tuple[type[OpFamily], ...] = (NormOps, RopeOps, AttentionOps, MoEOps, QuantOps)


def op_names(ns: str) -> list[str]:
    """The op names registered in the ``torch.ops`` namespace ``ns`` (its schemas), sorted."""
    prefix = ns + "::"
    names = {n[len(prefix) :].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}
    return sorted(names)


def bind(ns: str) -> dict[str, Callable[..., Any]]:
    """The wrapper of every op registered in ``torch.ops.<ns>`` that has one, by op name.

    tests/test_op_list.py checks that every schema has a wrapper and every wrapper a schema.
    """
    lib = getattr(torch.ops, ns)
    registered = set(op_names(ns))
    bound: dict[str, Callable[..., Any]] = {}
    for family in FAMILIES:
        instance = family(lib)
        bound.update({name: getattr(instance, name) for name in family.wrapper_names() if name in registered})
    return dict(sorted(bound.items()))


def _make_fake(ns: str, name: str) -> Callable[..., None]:
    """The fake (meta) implementation of an op: ops write caller-allocated outputs and return nothing, so
    the fake only checks what needs no data — every tensor argument is on one device. (A real call that
    mixes a meta tensor with real ones therefore raises instead of silently running the fake.)"""
    arg_names = [a.name for a in getattr(getattr(torch.ops, ns), name).default._schema.arguments]

    def fake(*args: object, **kwargs: object) -> None:
        tensors: list[tuple[str, torch.Tensor]] = []
        for n, a in [*zip(arg_names, args), *kwargs.items()]:
            if isinstance(a, torch.Tensor):
                tensors.append((n, a))
            elif isinstance(a, (list, tuple)):  # Tensor[] / Tensor?[] arguments (decode_layers' layer lists)
                tensors += [(f"{n}[{i}]", t) for i, t in enumerate(a) if isinstance(t, torch.Tensor)]
        ref_name, ref = tensors[0]
        for n, t in tensors[1:]:
            if t.device != ref.device:
                raise RuntimeError(
                    f"{name}: {n} is on {t.device} but {ref_name} is on {ref.device}; move them to the same device"
                )

    return fake


def _register_fakes() -> None:
    """A fake implementation for every registered op of both namespaces, so all trace under
    ``torch.compile(fullgraph=True)``."""
    for ns in NAMESPACES:
        for name in op_names(ns):
            torch.library.register_fake(f"{ns}::{name}")(_make_fake(ns, name))


_register_fakes()
_WRAPPERS = bind("mistral_kernels")
globals().update(_WRAPPERS)
KERNEL_OPS: tuple[str, ...] = tuple(_WRAPPERS)  # the kernel wrappers exported here (and by emulated)

__all__ = [*KERNEL_OPS, "decode_layers", "device_index_checks", "linear", "rope_cos_sin_cache"]
