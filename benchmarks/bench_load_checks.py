"""What the load-time finiteness checks cost (``checkpoint/finite.py``): interleaved rounds, medians.

Writes a random checkpoint of Mistral-7B's layer shape (``--layers`` layers, vocab ``--vocab``), keeps it in
the page cache, then in one process loads it repeatedly, alternating the variants of each pair:

- ``check_tensors``: the full scan (``LLM(..., check_tensors=True)`` / ``--check-tensors``) on a bf16 HF
  checkpoint loaded as stored (memory-mapped: nothing else touches the values) — its cost in s per GB;
- conversion: the same file loaded as fp32 (every value converted through the scratch) with the per-chunk
  check as shipped vs the check replaced by a no-op;
- dequantization: a GGUF Q8_0 file loaded with ``quantized=False`` (block scales scanned, decoded values
  checked) vs both checks replaced by no-ops.

The machine is shared: state ``uptime``'s load next to the figures (printed). Never part of the test suite::

    python benchmarks/bench_load_checks.py --rounds 5
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mistral_kernels.checkpoint.tensor_io as tensor_io  # noqa: E402
from mistral_kernels.checkpoint import load_checkpoint  # noqa: E402
from mistral_kernels.config import ModelConfig  # noqa: E402
from tests.helpers.random_checkpoints import write_random_checkpoint  # noqa: E402

from common import bench_parser  # noqa: E402


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    del out
    return dt


def _without_checks(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with tensor_io's checks replaced by no-ops (the code before the checks, for the A/B)."""
    def run() -> object:
        saved = tensor_io.require_finite, tensor_io.check_block_scales
        tensor_io.require_finite = tensor_io.check_block_scales = lambda *a, **k: None  # type: ignore[assignment]
        try:
            return fn()
        finally:
            tensor_io.require_finite, tensor_io.check_block_scales = saved
    return run


def _pair(name: str, a: Callable[[], object], b: Callable[[], object], rounds: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_timed(a))
        tb.append(_timed(b))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{name}: {ma:.3f} s vs {mb:.3f} s (medians of {rounds}; all: {[round(x, 3) for x in ta]} / "
          f"{[round(x, 3) for x in tb]})", flush=True)
    return ma, mb


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    config = ModelConfig(dim=4096, n_layers=args.layers, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
                         vocab_size=args.vocab, max_position=4096)
    print(f"uptime: {os.getloadavg()} on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        hf, gg = Path(tmp) / "hf", Path(tmp) / "q8.gguf"
        gb = write_random_checkpoint(config, hf, "hf", torch.bfloat16, seed=None) / 1e9
        ggb = write_random_checkpoint(config, gg, "gguf", gguf_type="Q8_0", seed=None) / 1e9
        for f in [*hf.iterdir(), gg]:
            f.read_bytes()  # page cache
        plain, scan = _pair(f"bf16 HF {gb:.2f} GB, mapped: check_tensors=False vs True",
                            lambda: load_checkpoint(hf), lambda: load_checkpoint(hf, check_tensors=True),
                            args.rounds)
        print(f"  scan: {(scan - plain) / gb:.3f} s per GB of weights")
        checked, bare = _pair(f"bf16 → fp32 conversion ({gb:.2f} GB read): checks vs none",
                              lambda: load_checkpoint(hf, dtype=torch.float32),
                              _without_checks(lambda: load_checkpoint(hf, dtype=torch.float32)), args.rounds)
        print(f"  conversion check: {100 * (checked - bare) / bare:+.1f} %")
        checked, bare = _pair(f"Q8_0 GGUF {ggb:.2f} GB dequantized: checks vs none",
                              lambda: load_checkpoint(gg, dtype=torch.float32, quantized=False),
                              _without_checks(lambda: load_checkpoint(gg, dtype=torch.float32, quantized=False)),
                              args.rounds)
        print(f"  dequantization checks: {100 * (checked - bare) / bare:+.1f} %")
    print(f"uptime after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
