"""Paged KV cache + attention: reshape_and_cache, paged_decode_attention, paged_prefill_attention against
reference.py (gather-then-softmax), on shuffled non-contiguous block tables with NaN in every unused
cache slot; split-K determinism; bad inputs. The sliding-window semantic is pinned against transformers
in test_attention_transformers.py.

Shape letters: T tokens, Tq packed queries, B sequences, Hq / Hkv heads, G = Hq / Hkv, D head_dim,
N num_blocks, S block_size, M max_blocks, W sliding window.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import Backend, assert_close

from .helpers.attention import _check_decode, _check_prefill, _to, _tol, make_paged


# ---- reshape_and_cache ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reshape_and_cache(backend: Backend, dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    g = torch.Generator().manual_seed(1)
    n_blocks, s, hkv, d, t = 6, 8, 2, 64, 11
    slots = torch.randperm(n_blocks * s, generator=g)[:t]
    slots[[2, 7]] = -1  # padding tokens
    # k, v as views of a fused QKV buffer: token stride != Hkv * D
    qkv = torch.randn(t, (4 + 2 * hkv) * d, generator=g).to(dtype)
    k = qkv[:, 4 * d : (4 + hkv) * d].view(t, hkv, d)
    v = qkv[:, (4 + hkv) * d :].view(t, hkv, d)
    kc = torch.randn(n_blocks, s, hkv, d, generator=g).to(dtype)
    vc = torch.randn(n_blocks, s, hkv, d, generator=g).to(dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref.reshape_and_cache(k, v, kc_ref, vc_ref, slots)
    dev = backend.device
    kc_d, vc_d = kc.to(dev), vc.to(dev)
    backend.ops.reshape_and_cache(k.to(dev) if dev == "cpu" else k.contiguous().to(dev), v.to(dev), kc_d, vc_d,
                                  slots.to(dev))
    assert torch.equal(kc_d.cpu(), kc_ref) and torch.equal(vc_d.cpu(), vc_ref)  # bit-exact, padding skipped
    assert torch.equal(kc_ref.view(-1, hkv, d)[slots[0]], k[0])  # the reference itself: slot = row of the cache


def test_reshape_and_cache_bad_inputs(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    k = torch.randn(3, 2, 64, device=dev)
    kc = torch.zeros(4, 8, 2, 64, device=dev)
    slots = torch.tensor([0, 5, 31], device=dev)
    with pytest.raises((RuntimeError, ValueError), match=r"slot_mapping\[2\]=32 is out of range \[-1, 32\)"):
        ops.reshape_and_cache(k, k, kc, kc.clone(), torch.tensor([0, 5, 32], device=dev))
    with pytest.raises((RuntimeError, ValueError), match=r"slot_mapping\[0\]=-2 is out of range"):
        ops.reshape_and_cache(k, k, kc, kc.clone(), torch.tensor([-2, 5, 3], device=dev))
    with pytest.raises(RuntimeError, match="slot_mapping must have dtype Long"):
        ops.reshape_and_cache(k, k, kc, kc.clone(), slots.int())
    with pytest.raises(RuntimeError, match=r"k.shape\[1\] must be 4"):
        ops.reshape_and_cache(k, k, torch.zeros(4, 8, 4, 64, device=dev), torch.zeros(4, 8, 4, 64, device=dev),
                              slots)
    with pytest.raises(RuntimeError, match="k_cache has dtype"):
        ops.reshape_and_cache(k, k, kc.double(), kc.double(), slots)
    with pytest.raises(RuntimeError, match="v_cache must have the shape of k_cache"):
        ops.reshape_and_cache(k, k, kc, kc[:3].clone(), slots)


# ---- decode --------------------------------------------------------------------------------------------


CPU_DECODE = [  # (seq_lens, Hq, Hkv, D, S)
    ([1, 600, 17, 256, 33, 8], 8, 8, 64, 16),  # MHA
    ([599, 2, 130, 64], 12, 4, 128, 8),  # GQA 3
    ([300, 1, 41], 16, 4, 80, 256),  # GQA 4, one block holds everything
    ([513, 9, 200], 8, 1, 96, 16),  # MQA (GQA 8)
    ([77, 5], 16, 2, 256, 8),  # GQA 8, D 256
    ([45, 3], 6, 3, 40, 16),  # CPU accepts any head_dim
]


@pytest.mark.parametrize("window", [None, 50])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CPU_DECODE, ids=[f"G{c[1] // c[2]}-D{c[3]}-S{c[4]}" for c in CPU_DECODE])
def test_decode_cpu(case: tuple, dtype: torch.dtype, window: int | None) -> None:
    from mistral_kernels import ops

    seq_lens, hq, hkv, d, s = case
    _check_decode(ops, "cpu", seq_lens, hq, hkv, d, s, dtype, window, seed=hq * d + s)


def test_decode_cpu_split_k_deterministic() -> None:
    """Forced small partitions: same bits run to run, and equal to other partition sizes within rounding."""
    from mistral_kernels import ops

    args = ([1000, 333, 1, 64], 8, 2, 128, 16, torch.float32, None, 7)
    a = _check_decode(ops, "cpu", *args, partition_size=64)
    b = _check_decode(ops, "cpu", *args, partition_size=64)
    c = _check_decode(ops, "cpu", *args, partition_size=0)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


DECODE_TINY = [  # emulator-sized: (seq_lens, Hq, Hkv, D, S, window)
    ([5, 40, 1], 2, 1, 64, 8, None),
    ([33, 20], 2, 2, 80, 16, 7),
    ([64, 3], 2, 1, 128, 8, None),
    ([9, 30], 6, 2, 96, 8, None),  # G = 3: a partly idle head slot
    ([17], 12, 1, 256, 16, 5),  # G = 12: two head groups per kv head
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", DECODE_TINY, ids=[f"G{c[1] // c[2]}-D{c[3]}-W{c[5]}" for c in DECODE_TINY])
def test_decode(backend: Backend, case: tuple, dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    seq_lens, hq, hkv, d, s, window = case
    _check_decode(backend.ops, backend.device, seq_lens, hq, hkv, d, s, dtype, window, seed=d + s)


def test_decode_split_k(backend: Backend) -> None:
    """300 keys in partitions of 64 (a second reduction pass), vs the reference and vs one partition."""
    args = ([300, 70], 2, 1, 64, 16, torch.float32, None, 3)
    split = _check_decode(backend.ops, backend.device, *args, partition_size=64)
    again = _check_decode(backend.ops, backend.device, *args, partition_size=64)
    whole = _check_decode(backend.ops, backend.device, *args, partition_size=512)
    assert torch.equal(split, again)  # deterministic
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=1e-5)


def test_decode_empty_sequence_is_zero(backend_one_schedule: Backend) -> None:
    out = _check_decode(backend_one_schedule.ops, backend_one_schedule.device, [0, 9], 2, 1, 64, 8,
                        torch.float32, None, seed=4)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


# ---- prefill -------------------------------------------------------------------------------------------


CPU_PREFILL = [  # (seq_lens, q_lens, Hq, Hkv, D, S): first prefill, chunked prefill, cached prefix, q_b = 0
    ([600, 37, 1, 250], [600, 37, 1, 13], 8, 2, 64, 16),
    ([130, 300, 9], [30, 300, 0], 12, 4, 128, 256),
    ([200, 64], [5, 64], 8, 1, 96, 8),
    ([50, 51], [50, 1], 6, 6, 80, 16),
    ([40], [40], 16, 2, 256, 8),
]


@pytest.mark.parametrize("window", [None, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CPU_PREFILL, ids=[f"G{c[2] // c[3]}-D{c[4]}-S{c[5]}" for c in CPU_PREFILL])
def test_prefill_cpu(case: tuple, dtype: torch.dtype, window: int | None) -> None:
    from mistral_kernels import ops

    seq_lens, q_lens, hq, hkv, d, s = case
    _check_prefill(ops, "cpu", seq_lens, q_lens, hq, hkv, d, s, dtype, window, seed=d * 3 + s)


# The CPU's fp32 prefill tiles of 8 … 32 query rows (tokens × G heads) run the rows-in-lanes scan
# (csrc/cpu/isa/attention_tiled.h, AVX-512 levels); fewer rows take the per-row scan. Tiny shapes around its
# edges: 8 and 9 rows (one vector of 16 lanes), 17 and 30 rows (two), a tile whose last rows fall short of 8,
# keys across block boundaries (S = 8) and after a cached prefix (a chunk boundary), sliding windows.
CPU_PREFILL_TILES = [  # (seq_lens, q_lens, Hq, Hkv, D, S, window)
    ([8, 9], [8, 9], 1, 1, 64, 8, None),  # MHA: 8 / 9 rows (+ a 1-row tail of the second: per-row scan)
    ([29, 17], [29, 17], 3, 3, 64, 8, None),  # MHA, S 8: 29 rows (two vectors), 17 rows
    ([45, 71], [12, 40], 6, 2, 64, 8, 5),  # G 3: 30-row tiles after a cached prefix, a window inside a group of 8 keys
    ([100], [64], 8, 2, 128, 16, 21),  # G 4: 32 rows, window across blocks and key groups
    ([33], [33], 4, 1, 36, 8, None),  # G 4, D 36 (the generic head-dim loop)
]


@pytest.mark.parametrize("case", CPU_PREFILL_TILES,
                         ids=[f"G{c[2] // c[3]}-D{c[4]}-W{c[6]}-Q{c[1]}" for c in CPU_PREFILL_TILES])
def test_prefill_cpu_tiles(case: tuple) -> None:
    from mistral_kernels import ops

    seq_lens, q_lens, hq, hkv, d, s, window = case
    _check_prefill(ops, "cpu", seq_lens, q_lens, hq, hkv, d, s, torch.float32, window, seed=d + s + hq)


def test_prefill_cpu_tile_nan_reaches_only_rows_that_see_it() -> None:
    """A NaN in the V row (then the K row) of key 5 of a 12-token prefill: rows of one 12-row tile see it from
    token 5 on. Tokens 0 … 4 of the same tile stay finite (the key is masked for them, never multiplied),
    later tokens are NaN where the reference is (V: every column; K: the whole row), as
    docs/design.md §3 states."""
    from mistral_kernels import ops

    g = torch.Generator().manual_seed(5)
    n, d, s = 12, 64, 8
    for which in ("v_cache", "k_cache"):
        p = make_paged([n], 1, d, s, torch.float32, g)
        slot = int(p.block_tables[0, 0]) * s + 5
        getattr(p, which).view(-1, 1, d)[slot, 0, 3] = float("nan")
        q = torch.randn(n, 1, d, generator=g)
        cu = torch.tensor([0, n], dtype=torch.int32)
        got = ops.paged_prefill_attention(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, d**-0.5, None)
        expect = ref.paged_prefill_attention(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, d**-0.5, None)
        assert torch.isfinite(got[:5]).all(), which
        assert torch.equal(got.isnan(), expect.isnan()) and got[5:].isnan().any(), which
        assert_close(got.nan_to_num(), expect.nan_to_num(), **_tol(torch.float32))


PREFILL_TINY = [  # emulator-sized: (seq_lens, q_lens, Hq, Hkv, D, S, window)
    ([20, 45], [20, 9], 2, 1, 64, 8, None),  # first prefill + a chunk after a cached prefix
    ([37, 5], [37, 5], 2, 2, 80, 16, 6),  # sliding window inside one K tile and across tiles
    ([70], [66], 1, 1, 128, 16, 40),  # more than one query tile and several K tiles
    ([25, 10], [25, 4], 6, 2, 96, 8, 9),  # G = 3: a 64-row tile boundary falls inside a token's group
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", PREFILL_TINY, ids=[f"G{c[2] // c[3]}-D{c[4]}-W{c[6]}" for c in PREFILL_TINY])
def test_prefill(backend: Backend, case: tuple, dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    seq_lens, q_lens, hq, hkv, d, s, window = case
    _check_prefill(backend.ops, backend.device, seq_lens, q_lens, hq, hkv, d, s, dtype, window, seed=d + s)


def test_prefill_then_decode_matches_full_prefill() -> None:
    """Incremental use of the ops (prefill a prefix, decode the rest) reproduces one full prefill."""
    from mistral_kernels import ops

    g = torch.Generator().manual_seed(9)
    n, hq, hkv, d, s, w = 23, 4, 2, 64, 8, 9
    p = make_paged([n], hkv, d, s, torch.float32, g)
    q = torch.randn(n, hq, d, generator=g)
    cu = torch.tensor([0, n], dtype=torch.int32)
    full = ops.paged_prefill_attention(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, 0.125, w)
    for t in range(n):
        dec = ops.paged_decode_attention(q[t : t + 1], p.k_cache, p.v_cache, p.block_tables,
                                         torch.tensor([t + 1], dtype=torch.int32), 0.125, w)
        torch.testing.assert_close(dec[0], full[t], atol=1e-5, rtol=1e-5)


# ---- bad inputs ----------------------------------------------------------------------------------------

def test_attention_bad_inputs(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    g = torch.Generator().manual_seed(2)
    p = _to(make_paged([20, 9], 1, 64, 8, torch.float32, g), dev)  # M = 4 → capacity 32, N = 3 + 2 + 3 = 8
    q = torch.randn(2, 2, 64, device=dev)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=dev)
    qp = torch.randn(3, 2, 64, device=dev)

    def dec(**kw: object) -> None:
        a = dict(q=q, k_cache=p.k_cache, v_cache=p.v_cache, block_tables=p.block_tables, seq_lens=p.seq_lens,
                 scale=0.1)
        a.update(kw)
        ops.paged_decode_attention(**a)

    def pre(**kw: object) -> None:
        a = dict(q=qp, k_cache=p.k_cache, v_cache=p.v_cache, block_tables=p.block_tables, cu_seqlens_q=cu,
                 seq_lens=p.seq_lens, scale=0.1)
        a.update(kw)
        ops.paged_prefill_attention(**a)

    lens = lambda *x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    with pytest.raises((RuntimeError, ValueError), match=r"seq_lens\[1\]=33 exceeds block_tables capacity 32"):
        dec(seq_lens=lens(20, 33))
    with pytest.raises((RuntimeError, ValueError), match=r"seq_lens\[0\]=40 exceeds block_tables capacity 32"):
        pre(seq_lens=lens(40, 9))
    bad_tables = p.block_tables.clone()
    bad_tables[1, 1] = 8  # sequence 1 (9 tokens) reads logical block 1
    with pytest.raises((RuntimeError, ValueError), match=r"block_tables\[1, 1\]=8 is out of range \[0, 8\)"):
        dec(block_tables=bad_tables)
    with pytest.raises((RuntimeError, ValueError), match=r"block_tables\[1, 1\]=8 is out of range"):
        pre(block_tables=bad_tables)
    # …but a garbage id in a block the window excludes is never read, so it is accepted
    windowed = p.block_tables.clone()
    windowed[0, 0] = -5
    dec(block_tables=windowed, sliding_window=8)
    with pytest.raises(RuntimeError, match="q has 2 heads, which is not a multiple of the 3 kv heads"):
        dec(k_cache=torch.zeros(8, 8, 3, 64, device=dev), v_cache=torch.zeros(8, 8, 3, 64, device=dev))
    with pytest.raises(RuntimeError, match="head_dim D = q.shape"):
        dec(q=torch.randn(2, 2, 32, device=dev))
    with pytest.raises(RuntimeError, match="k_cache has dtype"):
        dec(k_cache=p.k_cache.double(), v_cache=p.v_cache.double())
    with pytest.raises(RuntimeError, match="seq_lens must have dtype Int"):
        dec(seq_lens=p.seq_lens.long())
    with pytest.raises(RuntimeError, match="block_tables must have dtype Int"):
        dec(block_tables=p.block_tables.long())
    with pytest.raises(RuntimeError, match=r"block_tables.shape\[0\] must be 2"):
        dec(block_tables=p.block_tables[:1])
    with pytest.raises(RuntimeError, match="v_cache must have the shape of k_cache"):
        dec(v_cache=p.v_cache[:, :4].contiguous())
    with pytest.raises(RuntimeError, match="k_cache must be contiguous"):
        dec(k_cache=p.k_cache.transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="sliding_window must be a positive"):
        dec(sliding_window=0)
    with pytest.raises((RuntimeError, ValueError), match=r"sequence 1 has 10 query tokens"):
        pre(q=torch.randn(12, 2, 64, device=dev), cu_seqlens_q=lens(0, 2, 12))
    with pytest.raises((RuntimeError, ValueError), match="cu_seqlens_q"):
        pre(cu_seqlens_q=lens(0, 2, 4))
    with pytest.raises((RuntimeError, ValueError), match="non-decreasing|q_b"):
        pre(cu_seqlens_q=lens(0, 4, 3))
    with pytest.raises(RuntimeError, match=r"cu_seqlens_q.shape\[0\] must be 3"):
        pre(cu_seqlens_q=lens(0, 3))


@pytest.mark.parametrize("backend_one_schedule", ["emu-forward", "cuda"], indirect=True)  # the CPU: any head_dim
def test_head_dim_restricted_on_cuda_kernels(backend_one_schedule: Backend) -> None:
    dev = backend_one_schedule.device
    p = _to(make_paged([5], 1, 48, 8, torch.float32, torch.Generator().manual_seed(0)), dev)
    with pytest.raises(RuntimeError, match="head_dim 48 is not supported by the CUDA kernels"):
        backend_one_schedule.ops.paged_decode_attention(torch.randn(1, 1, 48, device=dev), p.k_cache, p.v_cache,
                                                        p.block_tables, p.seq_lens, 0.1)


def test_torch_compile_fullgraph() -> None:
    """The wrappers trace under torch.compile(fullgraph=True) (fake impls, no data-dependent Python)."""
    from mistral_kernels import ops

    g = torch.Generator().manual_seed(8)
    p = make_paged([13, 30], 2, 64, 8, torch.float32, g)
    q, k, v = torch.randn(2, 4, 64, generator=g), torch.randn(2, 2, 64, generator=g), torch.randn(2, 2, 64, generator=g)
    lens = p.seq_lens + 1  # append one token to each sequence, then decode it
    j = lens.long() - 1
    slots = p.block_tables.long()[torch.arange(2), j // 8] * 8 + j % 8

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
        ops.reshape_and_cache(k, v, kc, vc, slots)
        return ops.paged_decode_attention(q, kc, vc, p.block_tables, lens, 0.125, 16)

    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, kc, vc)
    kr, vr = p.k_cache.clone(), p.v_cache.clone()
    ref.reshape_and_cache(k, v, kr, vr, slots)
    assert torch.equal(kc.nan_to_num(), kr.nan_to_num())
    assert_close(got, ref.paged_decode_attention(q, kr, vr, p.block_tables, lens, 0.125, 16), **_tol(torch.float32))


def test_device_index_checks_of_the_wrapper() -> None:
    """The wrapper-side checks used for CUDA tensors (no GPU here: run their tensor logic on CPU tensors)."""
    from mistral_kernels.ops import attention as oa

    kc = torch.zeros(8, 8, 1, 64)
    tables = torch.tensor([[0, 1, 2, -7], [3, 4, -7, -7]], dtype=torch.int32)
    lens = torch.tensor([20, 9], dtype=torch.int32)
    oa._check_paged_indices_device("op", kc, tables, lens, lens.long() - 1, 0)  # valid
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=33 exceeds block_tables capacity 32"):
        oa._check_paged_indices_device("op", kc, tables, torch.tensor([20, 33], dtype=torch.int32),
                                       torch.tensor([19, 32]), 0)
    bad = tables.clone()
    bad[1, 1] = 8
    with pytest.raises(ValueError, match=r"block_tables\[1, 1\]=8 is out of range \[0, 8\)"):
        oa._check_paged_indices_device("op", kc, bad, lens, lens.long() - 1, 0)
    windowed = tables.clone()
    windowed[0, 0] = -5  # excluded by a window of 8 at position 19: never read, accepted
    oa._check_paged_indices_device("op", kc, windowed, lens, lens.long() - 1, 8)
    with pytest.raises(ValueError, match=r"block_tables\[0, 0\]=-5"):
        oa._check_paged_indices_device("op", kc, windowed, lens, lens.long() - 1, 0)
    oa._check_cu_seqlens_device("op", torch.tensor([0, 2, 3], dtype=torch.int32), lens, 3)
    with pytest.raises(ValueError, match="sequence 1 has 10 query tokens"):
        oa._check_cu_seqlens_device("op", torch.tensor([0, 2, 12], dtype=torch.int32), lens, 12)
    with pytest.raises(ValueError, match="must start at 0 and end at q.shape"):
        oa._check_cu_seqlens_device("op", torch.tensor([0, 2, 3], dtype=torch.int32), lens, 4)
