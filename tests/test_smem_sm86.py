"""The attention and MoE kernels under the emulator at the 99 KiB (101,376 B) dynamic shared-memory limit of
sm_86 / sm_89 (MK_SIMT_MAX_DYN_SMEM=sm_86), where our sm_80 cubins also run: each kernel instance with the
largest shared-memory request, once, against reference.py. The tensor-core prefill at D = 256 needs exactly
101,376 B and must run; the fp32 SIMT prefill at D = 256 (139,264 B) must either fail with a clear error that
names the shared-memory limit, or give correct results if its launcher fits it.

Shape letters as in test_attention.py.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import Backend, _make_backend
from .helpers.attention import _check_decode, _check_prefill
from .helpers.moe import _check_fused

SM86 = 101_376


@pytest.fixture
def emu86(monkeypatch: pytest.MonkeyPatch) -> Backend:
    backend = _make_backend("emu-forward", monkeypatch)
    monkeypatch.setenv("MK_SIMT_MAX_DYN_SMEM", "sm_86")
    return backend


@pytest.mark.parametrize("dtype,d", [(torch.float16, 256), (torch.bfloat16, 128), (torch.float32, 128)])
def test_prefill_fits_sm86(emu86: Backend, dtype: torch.dtype, d: int) -> None:
    _check_prefill(emu86.ops, emu86.device, [40, 9], [24, 9], 2, 1, d, 16, dtype, None, seed=d)


def test_fp32_prefill_d256_fails_clearly_or_fits_sm86(emu86: Backend) -> None:
    try:
        _check_prefill(emu86.ops, emu86.device, [40], [24], 2, 1, 256, 16, torch.float32, None, seed=3)
    except RuntimeError as e:  # the launcher asks for more than sm_86 offers: the error must say so
        msg = str(e)
        assert "paged_prefill" in msg and "shared memory" in msg, msg
        assert any(limit in msg for limit in (str(SM86), f"{SM86:,}", "99 KiB")), msg  # names the limit


@pytest.mark.parametrize("dtype,d", [(torch.float32, 256), (torch.bfloat16, 128)])
def test_decode_fits_sm86(emu86: Backend, dtype: torch.dtype, d: int) -> None:
    _check_decode(emu86.ops, emu86.device, [70, 5], 4, 2, d, 16, dtype, None, seed=d)


def test_fused_moe_fits_sm86(emu86: Backend) -> None:
    _check_fused(emu86, 5, 16, 16, 64, 6, torch.float32, seed=11)  # 64 experts: the router's smem path
