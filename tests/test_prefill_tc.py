"""Tensor-core paged prefill (csrc/kernels/paged_prefill_tc.cuh), which paged_prefill_attention runs for fp16 /
bf16 on the CUDA and emulated backends: its mma / ldmatrix fragment arithmetic and the whole kernel in a
standalone emulator program, and the public op under the emulator (all three schedule orders) against
reference.py on the issue's shapes — two sequences of 70 and 33 new tokens after a 40-token cached prefix,
GQA 4:1, head_dim 64 / 128 (+ 256), window on / off — including poisoned blocks outside every query's window
that must never be loaded.

Shape letters: Tq packed queries, B sequences, Hq / Hkv heads, D head_dim, S block_size, W sliding window.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import Backend, assert_close
from .helpers.attention import _to, make_paged
from .helpers.emulator import GXX, _run_program, build  # noqa: F401  (build: the session fixture)


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_fragment_mapping_and_kernel_program(build) -> None:  # noqa: F811
    """Q·Kᵀ (ldmatrix.x4 A and B) and P·V (accumulators re-packed as A, ldmatrix.x4.trans V) vs naive products,
    the kernel via launch_paged_prefill_tc vs naive attention, and the support rule (fp32 → fallback)."""
    r = _run_program(build("test_prefill_tc_fragments"))
    assert r.stdout.count("max |err|") == 12  # 3 schedules × 2 dtypes × window on/off ran the kernel


TC_CASES = [  # (seq_lens, q_lens, Hq, Hkv, D, S)
    ([110, 73], [70, 33], 4, 1, 64, 16),  # the shape: 40-token cached prefix, GQA 4:1
    ([110, 73], [70, 33], 4, 1, 128, 16),
    ([60], [20], 2, 1, 256, 8),  # D 256: Q fragments re-read from shared memory
]


@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", TC_CASES, ids=[f"G{c[2] // c[3]}-D{c[4]}" for c in TC_CASES])
def test_prefill_tensor_core(backend: Backend, case: tuple, dtype: torch.dtype, window: int | None) -> None:
    if not backend.name.startswith("emu") and backend.name != "cuda":
        pytest.skip("the tensor-core kernel runs on the CUDA and emulated backends")
    seq_lens, q_lens, hq, hkv, d, s = case
    g = torch.Generator().manual_seed(d + (window or 0))
    p = make_paged(seq_lens, hkv, d, s, dtype, g)
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=g).to(dtype)
    scale = d**-0.5
    expect = ref.paged_prefill_attention(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, scale, window)

    tables = p.block_tables
    if window is not None:
        # Blocks wholly before every query's window (first query at position seq_len - q_len sees keys
        # ≥ pos - W + 1) are re-pointed at a NaN-filled spare block: a loaded one would poison P·V (0·NaN).
        used = set(p.block_tables[p.block_tables >= 0].tolist())
        spare = next(i for i in range(p.k_cache.shape[0]) if i not in used)
        tables = p.block_tables.clone()
        for b, (n, qn) in enumerate(zip(seq_lens, q_lens)):
            first_key = max(0, n - qn - window + 1)
            tables[b, : first_key // s] = spare
        assert (tables != p.block_tables).any(), "the window must exclude whole blocks for this check to bite"
    pd = _to(p, backend.device)
    got = backend.ops.paged_prefill_attention(q.to(backend.device), pd.k_cache, pd.v_cache,
                                              tables.to(backend.device), cu.to(backend.device), pd.seq_lens,
                                              scale, window)
    assert got.shape == q.shape and got.dtype == dtype
    assert torch.isfinite(got.cpu().float()).all(), "a tile outside the mask (or an unused slot) was read"
    assert_close(got, expect)
