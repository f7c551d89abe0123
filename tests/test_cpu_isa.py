"""CPU ISA levels (csrc/cpu/isa_select.cpp): every level this CPU supports runs SmolLM2 like transformers, and
MK_CPU_ISA / set_cpu_isa reject unknown or unsupported levels with a clear error.

The op tests run under each level through scripts/isa_tests.sh (MK_CPU_ISA per process, CI); the SmolLM2
parity (prefill logits, 8 greedy tokens) is checked for every level in one process (set_cpu_isa), so the
transformers reference is computed once — also by that script (MK_ISA_TESTS=1): the default suite already
runs test_smollm2.py at the CPU's own level. Shape letters: T tokens, V vocab.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

import mistral_kernels as mk
from mistral_kernels.model import Model

from .helpers.default_model_files import default_model_or_skip
from .helpers.model_helpers import greedy_ours, greedy_transformers, logits_transformers
from .helpers.smollm2 import gguf_path, ours, prompt_ids, reference  # noqa: F401  (session fixtures)


@pytest.fixture
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.param
    if not mk.cpu_isa_supported(name):
        pytest.skip(f"this CPU cannot run the {name} level")
    mk.set_cpu_isa(name)
    try:
        yield name
    finally:
        mk.set_cpu_isa(None)


@pytest.fixture(scope="session")
def expected(reference: torch.nn.Module, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """transformers' logits [T, V] of the prompt and its 8 greedy tokens."""
    return logits_transformers(reference, prompt_ids), greedy_transformers(reference, prompt_ids, 8)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MK_ISA_TESTS") != "1", reason="per-level model parity: scripts/isa_tests.sh (CI)")
@pytest.mark.parametrize("level", mk.CPU_ISA_LEVELS, indirect=True)
def test_smollm2_matches_transformers_at_level(level: str, ours: Model, prompt_ids: torch.Tensor,
                                               expected: tuple[torch.Tensor, list[int]]) -> None:
    assert mk.cpu_isa() == level
    logits, tokens = expected
    torch.testing.assert_close(ours.logits(prompt_ids), logits, atol=1e-3, rtol=0)
    assert greedy_ours(ours, prompt_ids, 8, block_size=16) == tokens


def test_generic_level_always_supported() -> None:
    assert mk.cpu_isa_supported("generic")
    assert mk.cpu_isa() in mk.CPU_ISA_LEVELS
    with pytest.raises(ValueError, match="level must be one of"):
        mk.cpu_isa_supported("sse2")


def test_set_cpu_isa_rejects_unknown_level() -> None:
    before = mk.cpu_isa()
    with pytest.raises(ValueError, match="avx3 is not a CPU ISA level; expected one of: avx512bf16"):
        mk.set_cpu_isa("avx3")
    assert mk.cpu_isa() == before


def test_mk_cpu_isa_environment() -> None:
    """A forced level is used; an unknown one fails cpu_isa() and every CPU op with the same message."""
    script = (
        "import torch, mistral_kernels as mk\n"
        "try:\n    print('isa', mk.cpu_isa())\nexcept RuntimeError as e:\n    print('isa-error', e)\n"
        "try:\n    mk.ops.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6)\n    print('op ok')\n"
        "except RuntimeError as e:\n    print('op-error', str(e).splitlines()[0])\n")
    def run(value: str) -> str:
        env = {**os.environ, "MK_CPU_ISA": value}
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True,
                              timeout=120).stdout
    out = run("generic")
    assert "isa generic" in out and "op ok" in out, out
    out = run("pentium")
    msg = "MK_CPU_ISA=pentium is not a CPU ISA level; expected one of: avx512bf16, avx512, avx2, generic"
    assert f"isa-error {msg}" in out and f"op-error {msg}" in out, out


def test_info_prints_level(capsys: pytest.CaptureFixture[str]) -> None:
    from mistral_kernels.cli import main

    default_model_or_skip()  # `info` without --model reads it
    assert main(["info"]) == 0
    assert f"CPU ISA: {mk.cpu_isa()} (" in capsys.readouterr().out
