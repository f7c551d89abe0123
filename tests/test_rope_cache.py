"""rotary_embedding_and_cache: the fused rope + KV-cache write equals rotary_embedding followed by
reshape_and_cache — bit for bit against the same backend's two ops, and within the rope tolerance against
mistral_kernels.reference — for both layouts, every dtype, partial rotary, skipped slots (-1), views of a fused
QKV buffer, the scalar (unaligned) copy path and T = 0; bad arguments raise before anything is written.

Shape letters: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions, N num_blocks, S block_size.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref
from mistral_kernels.ops import rope_cos_sin_cache

from .conftest import Backend, assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
N, S = 5, 4  # cache blocks, block size


def _inputs(T: int, Hq: int, Hkv: int, D: int, dtype: torch.dtype, seed: int, misalign: bool = False):
    """q, k, v as token-strided views of one QKV buffer [T, (Hq + 2 Hkv)·D] (misalign: shifted one element),
    caches [N, S, Hkv, D] of random bits, positions [T], slot_mapping [T] with a -1."""
    g = torch.Generator().manual_seed(seed)
    width = (Hq + 2 * Hkv) * D
    flat = torch.randn(T * width + 1, generator=g).to(dtype)
    qkv = (flat[1:] if misalign else flat[:-1]).view(T, width)
    kc = torch.randn(N, S, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(N, S, Hkv, D, generator=g).to(dtype)
    pos = torch.randint(0, 64, (T,), generator=g)
    slots = torch.randperm(N * S, generator=g)[:T]
    if T > 1:
        slots[1] = -1
    return qkv, kc, vc, pos, slots


def _split(qkv: torch.Tensor, Hq: int, Hkv: int, D: int):
    T = qkv.shape[0]
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
    v = qkv[:, (Hq + Hkv) * D :].view(T, Hkv, D)
    return q, k, v


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,Hq,Hkv,D,rot,misalign", [(4, 4, 2, 64, 64, False), (3, 3, 1, 80, 32, False),
                                                      (2, 2, 2, 64, 64, True), (0, 4, 2, 64, 64, False)])
def test_fused_equals_rope_then_cache(backend: Backend, is_neox: bool, dtype: torch.dtype, T: int, Hq: int, Hkv: int,
                                      D: int, rot: int, misalign: bool) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    qkv, kc, vc, pos, slots = _inputs(T, Hq, Hkv, D, dtype, seed=T * 31 + D, misalign=misalign)
    cos_sin = rope_cos_sin_cache(64, rot, 1e4)
    dev = backend.device
    # the same backend's two ops
    two = [x.clone().to(dev) for x in (qkv, kc, vc)]
    q2, k2, v2 = _split(two[0], Hq, Hkv, D)
    backend.ops.rotary_embedding(pos.to(dev), q2, k2, cos_sin.to(dev), is_neox)
    backend.ops.reshape_and_cache(k2, v2, two[1], two[2], slots.to(dev))
    # the fused op
    one = [x.clone().to(dev) for x in (qkv, kc, vc)]
    q1, k1, v1 = _split(one[0], Hq, Hkv, D)
    backend.ops.rotary_embedding_and_cache(pos.to(dev), q1, k1, v1, cos_sin.to(dev), is_neox, one[1], one[2],
                                           slots.to(dev))
    for name, a, b in zip(("qkv", "k_cache", "v_cache"), one, two):
        assert torch.equal(a.cpu(), b.cpu()), f"{name}: fused result differs from rotary_embedding + reshape_and_cache"
    # the reference
    expect = [qkv.clone(), kc.clone(), vc.clone()]
    qe, ke, ve = _split(expect[0], Hq, Hkv, D)
    ref.rotary_embedding_and_cache(pos, qe, ke, ve, cos_sin, is_neox, expect[1], expect[2], slots)
    for a, b in zip(one, expect):
        assert_close(a, b)
    if T > 1:  # slot -1 skipped: the caches keep their other rows exactly
        untouched = torch.ones(N * S, dtype=torch.bool)
        untouched[slots[slots >= 0]] = False
        assert torch.equal(one[1].cpu().view(N * S, Hkv, D)[untouched], kc.view(N * S, Hkv, D)[untouched])


def test_bad_inputs_write_nothing(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    T, Hq, Hkv, D = 3, 4, 2, 64
    qkv, kc, vc, pos, slots = _inputs(T, Hq, Hkv, D, torch.float32, seed=7)
    qkv, kc, vc, pos, slots = qkv.to(dev), kc.to(dev), vc.to(dev), pos.to(dev), slots.to(dev)
    q, k, v = _split(qkv, Hq, Hkv, D)
    cos_sin = rope_cos_sin_cache(64, D, 1e4, dev)
    before = qkv.clone()
    with pytest.raises((RuntimeError, ValueError), match=r"slot_mapping\[0\]=20 is out of range"):
        ops.rotary_embedding_and_cache(pos, q, k, v, cos_sin, True, kc, vc, torch.tensor([20, 0, 1], device=dev))
    with pytest.raises((RuntimeError, ValueError), match=r"positions\[2\]=64 is out of range"):
        ops.rotary_embedding_and_cache(torch.tensor([0, 1, 64], device=dev), q, k, v, cos_sin, True, kc, vc, slots)
    with pytest.raises(RuntimeError, match="v must have the shape of k"):
        ops.rotary_embedding_and_cache(pos, q, k, v[:, :1], cos_sin, True, kc, vc, slots)
    with pytest.raises(RuntimeError, match="rotary_embedding_and_cache: q .* shares memory with k_cache"):
        ops.rotary_embedding_and_cache(pos, kc.view(-1)[: T * Hq * D].view(T, Hq, D), k, v, cos_sin, True, kc, vc,
                                       slots)
    with pytest.raises(RuntimeError, match="rotary_embedding_and_cache: k .* shares memory with v"):
        ops.rotary_embedding_and_cache(pos, q, v, v, cos_sin, True, kc, vc, slots)
    assert torch.equal(qkv, before), "a rejected call must not rotate q or k"
