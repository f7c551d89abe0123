"""Benchmark helpers: median wall time after warm-up, the machine's copy bandwidth, markdown tables.

Timings are ratios measured in one process run (ours vs reference / transformers); never asserted in tests.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


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


def copy_bandwidth_gbs(nbytes: int = 256 << 20) -> float:
    """Measured memory bandwidth (GB/s) of a large tensor copy: reads + writes / time."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), warmup=2, repeats=7)
    return 2 * nbytes / t / 1e9


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
