"""Benchmark helpers: the command-line parser and dtype names every script shares, the command line for a
result file's header, median wall time after warm-up (CUDA events on a GPU; optionally with the L2 cache
flushed before every timed call), the copy bandwidth of the device (host memory or HBM, measured in the same
run), the dense bf16 tensor-core peak of known GPUs, markdown tables.

Timings are ratios measured in one process run (ours vs reference / transformers / the device's copy
bandwidth); never asserted in tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


# The dtype names of every script's --dtype flag.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def dtypes(*names: str) -> dict[str, torch.dtype]:
    """The part of :data:`DTYPES` a script offers, in the given order: ``dtypes("fp32", "bf16")``."""
    return {n: DTYPES[n] for n in names}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bf16"``."""
    return next(n for n, d in DTYPES.items() if d == dtype)


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser every benchmark script starts from: its module docstring as the description, layout kept."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def results_dir(out: Path | None, smoke: bool, results: Path) -> Path:
    """Where a GPU benchmark writes its table: ``--out`` if given; else ``results`` (benchmarks/results) for a
    real run, and a fresh temporary directory for a ``--smoke`` run — a smoke run's meaningless figures never
    overwrite a measured table."""
    if out is not None:
        return out
    if smoke:
        import tempfile

        return Path(tempfile.mkdtemp(prefix="smoke_"))
    return results


def gpu_device(ap: argparse.ArgumentParser, device: str, smoke: bool, cpu_instead: str) -> bool:
    """Whether ``device`` is a CUDA device, after refusing what cannot run: a CUDA device that is not
    reachable, and a CPU run without ``--smoke`` (``cpu_instead`` names the CPU benchmark to use)."""
    gpu = torch.device(device).type == "cuda"
    if gpu and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is reachable (use --device cpu --smoke to check the script)")
    if not gpu and not smoke:
        ap.error(f"--device cpu needs --smoke (on the CPU: {cpu_instead})")
    return gpu


def command_line(script: str) -> str:
    """The result-file line naming the running command: ``Command: `python benchmarks/bench_ops.py ...```."""
    rel = Path(script).resolve().relative_to(Path(__file__).resolve().parents[1])
    args = " ".join(sys.argv[1:])
    return f"Command: `python {rel.as_posix()}{' ' + args if args else ''}`"


def median_time(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 15, min_time: float = 0.2) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` runs (more if the total is under ``min_time``;
    fewer — at least 3 — for calls slower than a second, e.g. the eager references at prefill sizes)."""
    t0 = time.perf_counter()
    fn()
    if time.perf_counter() - t0 > 1.0:
        warmup, repeats = 0, 3
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_time and len(times) < 10 * repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cuda_time(fn: Callable[[], object], *, warmup: int = 5, repeats: int = 30) -> float:
    """Median seconds per call of ``fn`` on the current CUDA stream, each call timed by a pair of CUDA events."""
    for _ in range(warmup):
        fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


def flushed_cuda_time(fn: Callable[[], object], flush: torch.Tensor, *, warmup: int = 3, repeats: int = 20) -> float:
    """:func:`cuda_time` with ``flush`` (a device buffer larger than the L2 cache: :func:`l2_flush_buffer`)
    overwritten before each timed call, outside its event pair: every call starts with nothing of its own data
    in L2, so bytes / time is an HBM bandwidth even for a working set that fits in L2."""
    for _ in range(warmup):
        fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in pairs:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


def l2_bytes(device: str) -> int:
    """The L2 cache size of a CUDA device (H100 50 MB, H200 60 MB); 0 elsewhere."""
    if torch.device(device).type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)


def l2_flush_buffer(device: str) -> torch.Tensor:
    """A device buffer of 4 × the L2 size (at least 256 MiB) to overwrite between timed calls."""
    return torch.empty(max(4 * l2_bytes(device), 256 << 20), dtype=torch.uint8, device=device)


# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendor data sheets; matched by device name,
# the longest key first (the "H100 PCIe" before the "H100" of the SXM module).
DENSE_BF16_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200": 989.0, "H800": 989.0,
                          "A100": 312.0}


def dense_bf16_peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``name`` (torch.cuda.get_device_name), None if unknown."""
    for key in sorted(DENSE_BF16_PEAK_TFLOPS, key=len, reverse=True):
        if key in name:
            return DENSE_BF16_PEAK_TFLOPS[key]
    return None


def device_time(fn: Callable[[], object], device: str, **kw: int) -> float:
    """:func:`cuda_time` on a CUDA device, :func:`median_time` elsewhere."""
    return cuda_time(fn, **kw) if torch.device(device).type == "cuda" else median_time(fn, **kw)


def copy_bandwidth_gbs(nbytes: int = 256 << 20, device: str = "cpu") -> float:
    """Measured memory bandwidth (GB/s) of a large tensor copy on ``device``: reads + writes / time (on a GPU
    1 GiB, well beyond the L2 cache: the HBM bandwidth a kernel can reach)."""
    if torch.device(device).type == "cuda":
        nbytes = max(nbytes, 1 << 30)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = device_time(lambda: dst.copy_(src), device, warmup=2, repeats=7)
    return 2 * nbytes / t / 1e9


def device_name(device: str) -> str:
    """The GPU's name (torch.cuda.get_device_name) or "CPU, N threads"."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU, {torch.get_num_threads()} threads"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def load_average() -> str:
    """The 1 / 5 / 15-minute load averages, as the reports state them: "0.65 / 0.96 / 1.22"."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
