"""Top-k MoE ops (topk_softmax, moe_permute, moe_unpermute, fused_moe) against reference.py on every backend,
index-layout properties, and bad inputs. Parity with transformers' MixtralSparseMoeBlock: test_moe_transformers.py.

Shape letters: T tokens, H hidden, I intermediate, E experts, k top-k. Emulated backends run tiny shapes
(T ≤ 16, H, I ≤ 64); the native backends (cpu, cuda) also run T = 300 and E up to 256.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import Backend, _make_backend, assert_close

from .helpers.moe import _check_fused, _check_permutation_properties, _moe_weights, _random_ids

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROUTINGS = [(8, 2), (64, 6)]  # (E, k): Mixtral, and a many-expert router


@pytest.fixture(params=["cpu", "cuda"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """Backends that run the full-size shapes (the emulator runs the tiny ones)."""
    return _make_backend(request.param, monkeypatch)


def _skip_unsupported(backend: Backend, dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")


# ---- topk_softmax ----------------------------------------------------------------------------------------


def _check_topk(backend: Backend, t: int, e: int, k: int, dtype: torch.dtype, renormalize: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = (2 * torch.randn(t, e, generator=g)).to(dtype).to(backend.device)
    w, ids = backend.ops.topk_softmax(logits, k, renormalize)
    w_ref, ids_ref = ref.topk_softmax(logits.cpu(), k, renormalize)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (t, k)
    torch.testing.assert_close(ids.cpu(), ids_ref, atol=0, rtol=0)
    assert_close(w, w_ref, dtype=torch.float32)  # fp32 math on the same (rounded) logits


@pytest.mark.parametrize("t", [1, 5, 16])
@pytest.mark.parametrize("e,k", [(8, 2), (8, 8), (32, 4), (64, 6), (3, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_softmax(backend: Backend, t: int, e: int, k: int, dtype: torch.dtype) -> None:
    _skip_unsupported(backend, dtype)
    _check_topk(backend, t, e, k, dtype, True, seed=t * 100 + e)


@pytest.mark.parametrize("e,k", [(8, 2), (64, 6)])
def test_topk_softmax_no_renormalize(backend: Backend, e: int, k: int) -> None:
    _check_topk(backend, 9, e, k, torch.float32, False, seed=7)


@pytest.mark.parametrize("t", [1, 7, 300])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6), (256, 8), (33, 3)])
def test_topk_softmax_large(native: Backend, t: int, e: int, k: int) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        _check_topk(native, t, e, k, dtype, True, seed=t + e)


def test_topk_softmax_ties_pick_lower_id(backend: Backend) -> None:
    # Row 0: experts 1, 3, 5 tie for first; row 1: all equal (E = 40 > 32 exercises the general CUDA path).
    logits = torch.zeros(2, 40)
    logits[0, [1, 3, 5]] = 2.0
    w, ids = backend.ops.topk_softmax(logits.to(backend.device), 4)
    assert ids.cpu().tolist() == [[1, 3, 5, 0], [0, 1, 2, 3]]
    assert_close(w[1], torch.full((4,), 0.25))
    w8, ids8 = backend.ops.topk_softmax(logits[:, :8].contiguous().to(backend.device), 2)  # the one-warp path
    assert ids8.cpu().tolist() == [[1, 3], [0, 1]]
    assert_close(w8, torch.full((2, 2), 0.5))


def test_topk_softmax_equals_softmax_of_topk_logits(native: Backend) -> None:
    """Mixtral's routing (DESIGN §6): softmax → top-k → renormalise == top-k of the logits → softmax."""
    logits = torch.randn(50, 8, generator=torch.Generator().manual_seed(3)).to(native.device)
    w, ids = native.ops.topk_softmax(logits, 2)
    top = logits.cpu().topk(2, dim=-1)
    torch.testing.assert_close(ids.cpu().long(), top.indices)
    assert_close(w, torch.softmax(top.values, dim=-1))


# ---- moe_permute / moe_unpermute -----------------------------------------------------------------------------


def test_permute_worked_example(backend: Backend) -> None:
    """The docstring example of ops/moe.py."""
    ids = torch.tensor([[2, 0], [0, 3], [2, 0]], dtype=torch.int32, device=backend.device)
    x = torch.arange(3.0, device=backend.device)[:, None].repeat(1, 4)
    permuted, offsets, inv = backend.ops.moe_permute(x, ids, 4)
    assert offsets.cpu().tolist() == [0, 3, 3, 5, 6]
    assert inv.cpu().tolist() == [[3, 0], [1, 5], [4, 2]]
    assert permuted[:, 0].cpu().tolist() == [0.0, 1.0, 2.0, 0.0, 2.0, 1.0]


@pytest.mark.parametrize("t,e,k,h", [(1, 8, 2, 16), (7, 8, 2, 24), (16, 64, 6, 8), (5, 4, 4, 33), (13, 3, 1, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_permute(backend: Backend, t: int, e: int, k: int, h: int, dtype: torch.dtype) -> None:
    _skip_unsupported(backend, dtype)
    ids = _random_ids(t, e, k, seed=t * e).to(backend.device)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(1)).to(dtype).to(backend.device)
    permuted, offsets, inv = backend.ops.moe_permute(x, ids, e)
    p_ref, o_ref, i_ref = ref.moe_permute(x.cpu(), ids.cpu(), e)
    # The layout is unique: exact equality.
    assert offsets.dtype == torch.int64 and inv.dtype == torch.int32
    torch.testing.assert_close(offsets.cpu(), o_ref, atol=0, rtol=0)
    torch.testing.assert_close(inv.cpu(), i_ref, atol=0, rtol=0)
    torch.testing.assert_close(permuted.cpu(), p_ref, atol=0, rtol=0)
    _check_permutation_properties(x, ids, e, permuted, offsets, inv)


def test_moe_permute_skewed_and_large(native: Backend) -> None:
    """All tokens on one expert (the others empty), and a prefill-sized random routing."""
    for t, e, k, ids in [
        (33, 8, 1, torch.full((33, 1), 5, dtype=torch.int32)),
        (300, 8, 2, _random_ids(300, 8, 2, seed=1)),
        (300, 64, 6, _random_ids(300, 64, 6, seed=2)),
        (40, 256, 8, _random_ids(40, 256, 8, seed=3)),
    ]:
        x = torch.randn(t, 40, generator=torch.Generator().manual_seed(t)).to(native.device)
        permuted, offsets, inv = native.ops.moe_permute(x, ids.to(native.device), e)
        p_ref, o_ref, i_ref = ref.moe_permute(x.cpu(), ids, e)
        assert torch.equal(offsets.cpu(), o_ref) and torch.equal(inv.cpu(), i_ref)
        assert torch.equal(permuted.cpu(), p_ref)
        _check_permutation_properties(x, ids, e, permuted, offsets, inv)


@pytest.mark.parametrize("t,e,k,h", [(1, 8, 2, 16), (7, 8, 2, 24), (16, 64, 6, 8), (5, 4, 4, 33)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_unpermute(backend: Backend, t: int, e: int, k: int, h: int, dtype: torch.dtype) -> None:
    _skip_unsupported(backend, dtype)
    g = torch.Generator().manual_seed(t + h)
    ids = _random_ids(t, e, k, seed=t)
    _, _, inv = ref.moe_permute(torch.zeros(t, 1), ids, e)
    y = torch.randn(t * k, h, generator=g).to(dtype)
    w = torch.rand(t, k, generator=g)
    out = backend.ops.moe_unpermute(y.to(backend.device), w.to(backend.device), inv.to(backend.device))
    assert_close(out, ref.moe_unpermute(y, w, inv))
    given = torch.empty(t, h, dtype=dtype, device=backend.device)
    assert backend.ops.moe_unpermute(y.to(backend.device), w.to(backend.device), inv.to(backend.device),
                                     out=given) is given
    assert_close(given, ref.moe_unpermute(y, w, inv))


@pytest.mark.parametrize("t,e,k", [(7, 8, 2), (16, 64, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_unpermute_identity_times_k(backend: Backend, t: int, e: int, k: int, dtype: torch.dtype) -> None:
    """unpermute(permute(x), weights = 1) == k·x (one rounding at the end)."""
    x = torch.randn(t, 24, generator=torch.Generator().manual_seed(0)).to(dtype).to(backend.device)
    ids = _random_ids(t, e, k, seed=5).to(backend.device)
    permuted, _, inv = backend.ops.moe_permute(x, ids, e)
    ones = torch.ones(t, k, device=backend.device)
    out = backend.ops.moe_unpermute(permuted, ones, inv)
    assert_close(out, (k * x.cpu().float()).to(dtype), atol=0, rtol=1e-6)


# ---- fused_moe ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 7, 16])
@pytest.mark.parametrize("e,k", [(8, 2), (4, 4)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_moe(backend: Backend, t: int, e: int, k: int, dtype: torch.dtype) -> None:
    _skip_unsupported(backend, dtype)
    _check_fused(backend, t, 32, 48, e, k, dtype, seed=t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_tall_tiles_odd_sizes(backend: Backend, dtype: torch.dtype) -> None:
    """T = 20 > 16 selects the 64-row GEMM tiles on CUDA; H = 40, I = 24 leave partial N / K tiles and
    rows that are not a multiple of the 16-byte vector (scalar permute / unpermute paths)."""
    _check_fused(backend, 20, 40, 24, 4, 2, dtype, seed=5)


def test_fused_moe_no_tokens(backend: Backend) -> None:
    gate, w1, w2, w3 = _moe_weights(8, 16, 24, torch.float32, backend.device, 0)
    out = backend.ops.fused_moe(torch.empty(0, 16, device=backend.device), gate, w1, w2, w3, top_k=2)
    assert out.shape == (0, 16)


def test_fused_moe_many_experts_tiny(backend: Backend) -> None:
    _check_fused(backend, 5, 16, 16, 64, 6, torch.float32, seed=11)


@pytest.mark.parametrize("t", [1, 7, 300])
@pytest.mark.parametrize("e,k", ROUTINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_large(native: Backend, t: int, e: int, k: int, dtype: torch.dtype) -> None:
    _check_fused(native, t, 64, 96, e, k, dtype, seed=t + e)


def test_fused_moe_leading_dims_and_renormalize(native: Backend) -> None:
    gate, w1, w2, w3 = _moe_weights(8, 32, 40, torch.float32, native.device, 4)
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(9)).to(native.device)
    out = native.ops.fused_moe(x, gate, w1, w2, w3, top_k=2, renormalize=False)
    expect = ref.fused_moe(x.cpu(), gate.cpu(), w1.cpu(), w2.cpu(), w3.cpu(), top_k=2, renormalize=False)
    assert out.shape == (2, 3, 32)
    assert_close(out, expect, atol=1e-4, rtol=1e-4)


# ---- bad inputs -----------------------------------------------------------------------------------------------


def test_bad_inputs(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    x = torch.randn(4, 16, device=dev)
    ids = _random_ids(4, 8, 2, seed=0).to(dev)
    bad_ids = ids.clone()
    bad_ids[2, 1] = 8
    with pytest.raises((RuntimeError, ValueError), match=r"topk_ids\[5\]=8 is out of range \[0, 8\)"):
        ops.moe_permute(x, bad_ids, 8)
    with pytest.raises((RuntimeError, ValueError), match="topk_ids"):
        ops.moe_permute(x, -ids - 1, 8)
    with pytest.raises(ValueError, match="k must satisfy"):
        ops.topk_softmax(torch.randn(4, 8, device=dev), 9)
    with pytest.raises(ValueError, match="k must satisfy"):
        ops.topk_softmax(torch.randn(4, 8, device=dev), 0)
    with pytest.raises(RuntimeError, match="topk_ids.shape\\[0\\] must be 4"):
        ops.moe_permute(x, ids[:3], 8)
    with pytest.raises(RuntimeError, match="topk_ids must have dtype Int"):
        ops.moe_permute(x, ids.long(), 8)
    permuted, _, inv = ops.moe_permute(x, ids, 8)
    with pytest.raises(RuntimeError, match="topk_weights must have dtype Float"):
        ops.moe_unpermute(permuted, torch.ones(4, 2, dtype=torch.float64, device=dev), inv)
    with pytest.raises((RuntimeError, ValueError), match="inv_perm"):
        ops.moe_unpermute(permuted[:5], torch.ones(4, 2, device=dev), inv)  # rows 5..7 missing
    with pytest.raises(RuntimeError, match="inv_perm must have the shape of topk_weights"):
        ops.moe_unpermute(permuted, torch.ones(4, 3, device=dev), inv)

    gate, w1, w2, w3 = _moe_weights(8, 16, 24, torch.float32, dev, 0)
    with pytest.raises(RuntimeError, match="top-k must satisfy"):
        ops.fused_moe(x, gate, w1, w2, w3, top_k=9)
    with pytest.raises(RuntimeError, match="w2 must be"):
        ops.fused_moe(x, gate, w1, w2.transpose(1, 2).contiguous(), w3, top_k=2)
    with pytest.raises(RuntimeError, match="w3 must have the shape of w1"):
        ops.fused_moe(x, gate, w1, w2, w3[:, :20].contiguous(), top_k=2)
    with pytest.raises(RuntimeError, match="gate_weight.shape\\[1\\] must be 16"):
        ops.fused_moe(x, gate[:, :8].contiguous(), w1, w2, w3, top_k=2)
    with pytest.raises(RuntimeError, match="w1 has dtype"):
        ops.fused_moe(x, gate, w1.double(), w2, w3, top_k=2)
    with pytest.raises(RuntimeError, match="w1 must be contiguous"):
        ops.fused_moe(x, gate, w1.transpose(1, 2).contiguous().transpose(1, 2), w2, w3, top_k=2)
