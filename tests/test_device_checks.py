"""When the wrappers read back CUDA index tensors to range-check them (a device sync): on by default, off
inside ``ops.device_index_checks(False)``, while tracing and while a CUDA stream captures a graph; never for
CPU tensors (checked in C++). The predicate is tested on devices, no GPU needed; the capture itself on a GPU."""

from __future__ import annotations

import pytest
import torch

import mistral_kernels
from mistral_kernels import ops
from mistral_kernels.ops import _base

CUDA = torch.device("cuda")


@pytest.fixture
def not_capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def test_checks_apply_to_cuda_tensors_by_default(not_capturing: None) -> None:
    assert _base.device_checks_apply(CUDA)
    assert not _base.device_checks_apply(torch.device("cpu"))


def test_device_index_checks_switch(not_capturing: None) -> None:
    with ops.device_index_checks(False):
        assert not _base.device_checks_apply(CUDA)
        with ops.device_index_checks(True):
            assert _base.device_checks_apply(CUDA)
        assert not _base.device_checks_apply(CUDA)
    assert _base.device_checks_apply(CUDA)


def test_no_checks_while_capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not _base.device_checks_apply(CUDA)


def test_no_checks_while_compiling(monkeypatch: pytest.MonkeyPatch, not_capturing: None) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not _base.device_checks_apply(CUDA)


def test_checks_raise_on_cuda_and_stay_out_of_graph_capture() -> None:
    if not (torch.cuda.is_available() and mistral_kernels.cuda_compiled()):
        pytest.skip("needs a GPU and the CUDA kernels (the predicate tests above run everywhere)")
    positions = torch.tensor([0, 3, 7, 15], device="cuda")
    q, k = torch.randn(4, 4, 64, device="cuda"), torch.randn(4, 2, 64, device="cuda")
    cache = ops.rope_cos_sin_cache(16, 64, 1e4, device="cuda")
    with pytest.raises(ValueError, match=r"positions\[3\]=16 is out of range \[0, 16\)"):
        ops.rotary_embedding(positions + 1, q, k, cache, True)
    ops.rotary_embedding(positions, q, k, cache, True)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a read-back here would fail: "operation not permitted when capturing"
        ops.rotary_embedding(positions, q, k, cache, True)
    graph.replay()
    torch.cuda.synchronize()
