"""rope_cos_sin_cache and rotary_embedding: both layouts, partial rotary, GQA, T = 0, strided views,
and the HF ↔ consolidated weight-permutation identity (docs/design.md §6)."""

from __future__ import annotations

import math

import pytest
import torch

from mistral_kernels import reference as ref
from mistral_kernels.ops import rope_cos_sin_cache

from .conftest import Backend, assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_cos_sin_cache_values() -> None:
    cache = rope_cos_sin_cache(10, 8, 10000.0)
    assert cache.shape == (10, 8) and cache.dtype == torch.float32
    p, i = 7, 3
    angle = p * 10000.0 ** (-2 * i / 8)
    assert cache[p, i].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert cache[p, 4 + i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    with pytest.raises(ValueError, match="rot_dim"):
        rope_cos_sin_cache(10, 7, 10000.0)


@pytest.mark.parametrize(("args", "match"), [((2 * 10**8, 128), r"max_pos must be in \[0, 16777216\].*got 200000000"),
                                             ((-1, 8), r"max_pos must be in"),
                                             ((8, 1 << 20), r"rot_dim must be even and in \[0, 1024\]")])
def test_cos_sin_cache_bounds(args: tuple[int, int], match: str) -> None:
    """A table past the bounds is a ValueError naming the argument and the limit, not an allocator failure."""
    with pytest.raises(ValueError, match=match):
        rope_cos_sin_cache(*args, 10000.0)


def test_checkpoint_position_bound_is_the_tables() -> None:
    """A config's max_position is bounded (checkpoint/fields.py, which may not import ops) by the RoPE table's
    own limit: a checkpoint that parses can always build its table."""
    from mistral_kernels.checkpoint.fields import LIMITS
    from mistral_kernels.ops.rope import MAX_POSITIONS

    assert LIMITS["max_position"] == (1, MAX_POSITIONS)


def test_cos_sin_cache_chunks_agree_with_one_pass() -> None:
    """Rows built chunk by chunk (past 65536) equal the one-pass fp64 formula."""
    p = torch.tensor([0, 65535, 65536, 70000], dtype=torch.float64)
    inv = 1.0 / 1e4 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    ang = p[:, None] * inv[None]
    expected = torch.cat([ang.cos(), ang.sin()], -1).float()
    assert torch.equal(rope_cos_sin_cache(70001, 8, 1e4)[p.long()], expected)


def _complex_rope(x: torch.Tensor, pos: torch.Tensor, rot: int, theta: float) -> torch.Tensor:
    """Independent interleaved formulation: (x[2i] + i x[2i+1]) · exp(i · pos · θ_i), in fp64."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = pos.double()[:, None] * inv[None]
    xc = torch.view_as_complex(x[..., :rot].double().reshape(*x.shape[:-1], rot // 2, 2).contiguous())
    y = x.double().clone()
    y[..., :rot] = torch.view_as_real(xc * torch.polar(torch.ones_like(ang), ang)[:, None]).flatten(-2)
    return y


def _rotate_half_rope(x: torch.Tensor, pos: torch.Tensor, rot: int, theta: float) -> torch.Tensor:
    """Independent neox formulation (HF's rotate_half), in fp64."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.cat([pos.double()[:, None] * inv[None]] * 2, dim=-1)[:, None]
    xr = x[..., :rot].double()
    half = torch.cat([-xr[..., rot // 2 :], xr[..., : rot // 2]], dim=-1)
    y = x.double().clone()
    y[..., :rot] = xr * ang.cos() + half * ang.sin()
    return y


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,Hq,Hkv,D,rot", [(5, 4, 4, 64, 64), (9, 8, 2, 128, 128), (3, 6, 1, 80, 32), (1, 3, 3, 96, 96)])
def test_rotary_embedding(backend: Backend, is_neox: bool, dtype: torch.dtype, T: int, Hq: int, Hkv: int, D: int,
                          rot: int) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    g = torch.Generator().manual_seed(T * 100 + D)
    theta, max_pos = 10000.0, 4096
    cache = rope_cos_sin_cache(max_pos, rot, theta)
    pos = torch.randint(0, max_pos, (T,), generator=g)
    q = torch.randn(T, Hq, D, generator=g).to(dtype)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    q_ref, k_ref = q.clone(), k.clone()
    ref.rotary_embedding(pos, q_ref, k_ref, cache, is_neox)
    independent = _rotate_half_rope if is_neox else _complex_rope
    # reference.py itself against an fp64 independent formulation
    torch.testing.assert_close(q_ref.double(), independent(q, pos, rot, theta).to(dtype).double(),
                               atol=2e-2 if dtype != torch.float32 else 1e-4, rtol=1e-2)
    qd, kd = q.to(backend.device), k.to(backend.device)
    backend.ops.rotary_embedding(pos.to(backend.device), qd, kd, cache.to(backend.device), is_neox)
    assert_close(qd, q_ref)
    assert_close(kd, k_ref)
    if rot < D:  # partial rotary leaves the tail untouched
        assert torch.equal(qd[..., rot:].cpu(), q[..., rot:])


def test_rotary_embedding_fused_qkv_views(backend: Backend) -> None:
    """q and k as views of one fused QKV buffer [T, (Hq + 2 Hkv) · D]: token stride ≠ H · D."""
    T, Hq, Hkv, D = 6, 4, 2, 64
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g)
    cache = rope_cos_sin_cache(64, D, 10000.0)
    pos = torch.arange(T) + 3
    expect = qkv.clone()
    qe, ke = expect[:, : Hq * D].view(T, Hq, D), expect[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
    ref.rotary_embedding(pos, qe, ke, cache, True)
    got = qkv.to(backend.device)
    q, k = got[:, : Hq * D].view(T, Hq, D), got[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
    backend.ops.rotary_embedding(pos.to(backend.device), q, k, cache.to(backend.device), True)
    assert_close(got, expect)  # includes the untouched V part


def test_rotary_embedding_empty(backend_one_schedule: Backend) -> None:
    dev = backend_one_schedule.device
    q, k = torch.empty(0, 4, 64, device=dev), torch.empty(0, 2, 64, device=dev)
    result = backend_one_schedule.ops.rotary_embedding(torch.empty(0, dtype=torch.long, device=dev), q, k,
                                                       rope_cos_sin_cache(8, 64, 1e4, dev), True)
    assert result is None  # in place, nothing to do
    assert q.shape == (0, 4, 64) and k.shape == (0, 2, 64)
    # and a non-empty call right after still rotates (an empty launch left no bad state behind)
    q_ref, k_ref = torch.randn(1, 4, 64), torch.randn(1, 2, 64)
    q1, k1 = q_ref.to(dev), k_ref.to(dev)
    pos, cache = torch.tensor([3]), rope_cos_sin_cache(8, 64, 1e4)
    backend_one_schedule.ops.rotary_embedding(pos.to(dev), q1, k1, cache.to(dev), True)
    ref.rotary_embedding(pos, q_ref, k_ref, cache, True)
    assert_close(q1, q_ref)
    assert_close(k1, k_ref)


def test_rotary_embedding_bad_inputs(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    cache = rope_cos_sin_cache(16, 64, 1e4, dev)
    q, k = torch.randn(3, 4, 64, device=dev), torch.randn(3, 2, 64, device=dev)
    pos = torch.arange(3, device=dev)
    with pytest.raises(RuntimeError, match="positions must have dtype"):
        ops.rotary_embedding(pos.int(), q, k, cache, True)
    with pytest.raises((RuntimeError, ValueError), match=r"positions\[2\]=16 is out of range"):
        ops.rotary_embedding(torch.tensor([0, 1, 16], device=dev), q, k, cache, True)
    with pytest.raises((RuntimeError, ValueError), match=r"positions\[0\]=-1 is out of range"):
        ops.rotary_embedding(torch.tensor([-1, 1, 2], device=dev), q, k, cache, True)
    with pytest.raises(RuntimeError, match="k.shape\\[0\\]"):
        ops.rotary_embedding(pos, q, k[:2], cache, True)
    with pytest.raises(RuntimeError, match="rot_dim"):
        ops.rotary_embedding(pos, q, k, rope_cos_sin_cache(16, 128, 1e4, dev), True)
    with pytest.raises(RuntimeError, match="k has dtype"):
        ops.rotary_embedding(pos, q, k.double(), cache, True)
    with pytest.raises(RuntimeError, match="q must be contiguous in its last 2 dims"):
        ops.rotary_embedding(pos, q.transpose(1, 2).contiguous().transpose(1, 2), k, cache, True)
    with pytest.raises(RuntimeError, match="cos_sin_cache must have dtype"):
        ops.rotary_embedding(pos, q, k, cache.double(), True)


def test_layout_permutation_gives_equal_scores(backend: Backend) -> None:
    """Consolidated (interleaved RoPE) weights and their HF permutation (neox RoPE) give equal q·k."""
    g = torch.Generator().manual_seed(11)
    T, dim, nh, nkv, hd = 7, 96, 4, 2, 32
    x = torch.randn(T, dim, generator=g)
    wq, wk = torch.randn(nh * hd, dim, generator=g), torch.randn(nkv * hd, dim, generator=g)

    def to_hf(w: torch.Tensor, n: int) -> torch.Tensor:  # docs/design.md §6
        return w.view(n, hd // 2, 2, dim).transpose(1, 2).reshape(n * hd, dim)

    cache = rope_cos_sin_cache(64, hd, 10000.0)
    pos = torch.arange(T) * 5
    dev = backend.device

    def scores(wq_: torch.Tensor, wk_: torch.Tensor, neox: bool) -> torch.Tensor:
        q = (x @ wq_.T).view(T, nh, hd).to(dev)
        k = (x @ wk_.T).view(T, nkv, hd).to(dev)
        backend.ops.rotary_embedding(pos.to(dev), q, k, cache.to(dev), neox)
        k = k.repeat_interleave(nh // nkv, dim=1)
        return torch.einsum("thd,shd->hts", q.cpu(), k.cpu())

    s_cons = scores(wq, wk, False)
    s_hf = scores(to_hf(wq, nh), to_hf(wk, nkv), True)
    torch.testing.assert_close(s_hf, s_cons, atol=1e-3, rtol=1e-4)
    # …and the identity is not vacuous: the HF weights with the interleaved layout disagree.
    assert not torch.allclose(scores(to_hf(wq, nh), to_hf(wk, nkv), False), s_cons, atol=1e-1)
