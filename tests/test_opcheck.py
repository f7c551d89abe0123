"""torch.library.opcheck on every op (schema mutation annotations, fake impls, autograd registration),
and a torch.compile(fullgraph=True) smoke test through the public wrappers.

CASES holds one argument builder per op name; tests/test_op_list.py checks that every registered schema
has one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import mistral_kernels
from mistral_kernels import ops, reference as ref

from .helpers.opcheck import CASES

NAMESPACES = ["mistral_kernels", "mistral_kernels_emu"]


# Each case in each namespace that registers the op (CPU-only helpers such as skinny_linear exist only in
# mistral_kernels).
_PARAMS = [(ns, name, make) for ns in NAMESPACES for name, make in CASES if name in ops.op_names(ns)]


@pytest.mark.parametrize("ns,name,make_args", _PARAMS, ids=[f"{ns}::{name}" for ns, name, _ in _PARAMS])
def test_opcheck(ns: str, name: str, make_args: Callable[[], tuple]) -> None:
    if ns.endswith("_emu") and not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built")
    op = getattr(getattr(torch.ops, ns), name).default
    torch.library.opcheck(op, make_args())


def test_torch_compile_fullgraph() -> None:
    def block(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
        ops.fused_add_rms_norm(x, res, w)
        return ops.silu_and_mul(ops.rms_norm(x, w) @ w13.T)

    g = torch.Generator().manual_seed(0)
    x, res, w = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g), torch.randn(32, generator=g)
    w13 = torch.randn(48, 32, generator=g)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(x.clone(), res.clone(), w, w13)
    x_ref, r_ref = x.clone(), res.clone()
    ref.fused_add_rms_norm(x_ref, r_ref, w)
    expect = ref.silu_and_mul(ref.rms_norm(x_ref, w) @ w13.T)
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=1e-5)
