"""rms_norm, fused_add_rms_norm, silu_and_mul against reference.py on every backend."""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import Backend, assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype).to(device)
    return x, w


# Odd hidden sizes exercise the scalar (non-vectorised) path; 4096/5120 the 16-byte path.
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 769), (5, 5125), (4, 4096), (2, 3, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(backend: Backend, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    x, w = _inputs(shape, dtype, backend.device)
    assert_close(backend.ops.rms_norm(x, w, 1e-6), ref.rms_norm(x.cpu(), w.cpu(), 1e-6))
    out = torch.empty_like(x)
    assert backend.ops.rms_norm(x, w, 1e-6, out=out) is out
    assert_close(out, ref.rms_norm(x.cpu(), w.cpu(), 1e-6))


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 769), (5, 5125), (4, 4096)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(backend: Backend, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    x, w = _inputs(shape, dtype, backend.device, seed=1)
    residual, _ = _inputs(shape, dtype, backend.device, seed=2)
    x_ref, r_ref = x.cpu().clone(), residual.cpu().clone()
    ref.fused_add_rms_norm(x_ref, r_ref, w.cpu(), 1e-5)
    backend.ops.fused_add_rms_norm(x, residual, w, 1e-5)
    # The stored residual is the sum rounded once: it must match bit for bit.
    torch.testing.assert_close(residual.cpu(), r_ref, atol=0, rtol=0)
    assert_close(x, x_ref)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32])  # drift: the low-precision dtypes
def test_fused_add_rms_norm_drift_32_layers(backend: Backend, dtype: torch.dtype) -> None:
    """Stacking 32 fused add+norm layers in low precision stays close to an fp32 residual stream."""
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    g = torch.Generator().manual_seed(3)
    H, layers = 256, 32
    updates = [torch.randn(4, H, generator=g) for _ in range(layers)]
    weights = [1 + 0.1 * torch.randn(H, generator=g) for _ in range(layers)]
    res32 = torch.randn(4, H, generator=g)
    res = res32.to(dtype).to(backend.device)
    for upd, w in zip(updates, weights):
        x = upd.to(dtype).to(backend.device)
        backend.ops.fused_add_rms_norm(x, res, w.to(dtype).to(backend.device), 1e-5)
        x32 = upd.clone()
        ref.fused_add_rms_norm(x32, res32, w, 1e-5)
        assert_close(x, x32, dtype=dtype, atol=5e-2, rtol=5e-2)
    # One rounding per layer: the relative drift of the residual stream stays at a few bf16 ulps.
    rel = ((res.cpu().float() - res32).norm() / res32.norm()).item()
    assert rel < (1e-2 if dtype == torch.bfloat16 else 2e-3), rel


@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 1538), (5, 2 * 5125), (4, 2 * 4096), (2, 3, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(backend: Backend, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    x, _ = _inputs(shape, dtype, backend.device)
    assert_close(backend.ops.silu_and_mul(x), ref.silu_and_mul(x.cpu()))


def test_empty_inputs(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    x = torch.empty(0, 64, device=dev)
    w = torch.ones(64, device=dev)
    assert ops.rms_norm(x, w).shape == (0, 64)
    ops.fused_add_rms_norm(x, x.clone(), w)
    assert ops.silu_and_mul(torch.empty(0, 10, device=dev)).shape == (0, 5)


def test_bad_inputs_raise(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    x = torch.randn(4, 64, device=dev)
    w = torch.ones(64, device=dev)
    with pytest.raises(RuntimeError, match="weight.*shape"):
        ops.rms_norm(x, torch.ones(63, device=dev))
    with pytest.raises(RuntimeError, match="weight.*dtype"):
        ops.rms_norm(x, w.double())
    with pytest.raises(RuntimeError, match="x has dtype"):
        ops.rms_norm(x.double(), w.double())
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        ops.rms_norm(torch.randn(64, 4, device=dev).t(), w)
    with pytest.raises(RuntimeError, match="residual"):
        ops.fused_add_rms_norm(x, torch.randn(4, 32, device=dev), w)
    with pytest.raises(RuntimeError, match="out"):
        ops.rms_norm(x, w, out=torch.empty(3, 64, device=dev))
    with pytest.raises(ValueError, match="even last dim"):
        ops.silu_and_mul(torch.randn(4, 7, device=dev))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ops.rms_norm([1.0, 2.0], w)
    if dev == "cpu":
        meta = torch.randn(4, 64, device="meta")
        with pytest.raises((RuntimeError, NotImplementedError)):
            ops.rms_norm(x, meta)

