"""The CUDA permute's parallel scan (csrc/kernels/moe_permute.cuh: rank → columns → offsets → scatter) under the
emulator's three schedules and on a GPU (``cuda``), exact against reference.moe_permute: both scan paths (E ≤ 32: columns and offsets in
one block; E > 32: a grid of column warps, then the offsets block), column scans longer than one 32-chunk warp
step, experts left empty, and E not a multiple of the warps or of the 256 threads of the offsets scan.

Shape letters: T tokens, H hidden, E experts, k top-k, n = T·k entries.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import Backend, _make_backend
from .helpers.moe import _check_permutation_properties, _random_ids


@pytest.fixture(params=["emu-forward", "emu-reverse", "emu-random", "cuda"])
def emu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return _make_backend(request.param, monkeypatch)


def _check(backend: Backend, ids: torch.Tensor, e: int, h: int = 8, dtype: torch.dtype = torch.float32) -> None:
    t = ids.shape[0]
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t + e)).to(dtype)
    permuted, offsets, inv = (r.cpu() for r in backend.ops.moe_permute(x.to(backend.device), ids.to(backend.device), e))
    p_ref, o_ref, i_ref = ref.moe_permute(x, ids, e)
    assert torch.equal(offsets, o_ref), (offsets, o_ref)
    assert torch.equal(inv, i_ref)
    assert torch.equal(permuted, p_ref)
    _check_permutation_properties(x, ids, e, permuted, offsets, inv)


# (T, E, k): decode, a few tokens, prefill with n = 600 (19 chunks) and n = 1800 (57 chunks: two warp steps)
@pytest.mark.parametrize("t", [1, 7, 300])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6)])
def test_permute_exact(emu: Backend, t: int, e: int, k: int) -> None:
    _check(emu, _random_ids(t, e, k, seed=t * e + k), e)


def test_permute_empty_experts(emu: Backend) -> None:
    """All entries on one expert (every other segment empty), in the fused (E = 8) and the grid (E = 64) path;
    and tokens that only use the upper half of the experts."""
    _check(emu, torch.full((70, 1), 5, dtype=torch.int32), 8)
    _check(emu, torch.full((40, 2), 63, dtype=torch.int32).sub_(torch.tensor([[0, 1]], dtype=torch.int32)), 64)
    _check(emu, _random_ids(50, 32, 3, seed=3) + 32, 64, dtype=torch.bfloat16)


@pytest.mark.parametrize("e", [33, 300])
def test_permute_odd_expert_counts(emu: Backend, e: int) -> None:
    """E = 33: the smallest grid path (5 column blocks, the last with one expert); E = 300: 2 totals per thread
    of the offsets scan, some threads with none."""
    _check(emu, _random_ids(45, e, 4, seed=e), e, h=4)


def test_permute_max_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    """E = 4096 (the limit): 16 totals per offsets thread; one schedule (512 column blocks)."""
    _check(_make_backend("emu-forward", monkeypatch), _random_ids(9, 4096, 8, seed=4), 4096, h=4)
