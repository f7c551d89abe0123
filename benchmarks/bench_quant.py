"""CPU qlinear benchmark (csrc/cpu/quant.cpp): quantized weights vs the dense bf16 linear on the same shape.

    python benchmarks/bench_quant.py [--threads 1,2] [--only FORMAT] [--prefill-tokens M]

Decode (M = 1): the GEMV streams the packed weight once, so its roofline is the memory bandwidth: the table
gives GB/s of packed bytes (N · K / QK · bytes per block) and that as a % of the copy bandwidth measured in the
same run (reads + writes of a 256 MB copy), next to ops.linear on the dense bf16 weight (N · K · 2 bytes)
and the speed-up over it (fewer bytes per weight → fewer bytes to stream).
Prefill (M = --prefill-tokens): dequantized tiles of W and a GEMM; GFLOP/s (2 · M · N · K / time) next to
torch's bf16 GEMM on the dense weight.
Activations bf16 (Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K decode: quantized to int8 per 32 on a VNNI CPU, see
csrc/cpu/quant_kernels.h). Weights: random blocks with finite fp16 scales (speed does not depend on the values).
Times are the minimum over repeated calls (and the copy bandwidth the maximum): on a shared machine the
minimum is the run least disturbed by other processes, and both sides of every ratio are measured alike.
Shapes: Mistral-7B (H 4096, I 14336) and SmolLM2-135M (H 576, I 1536; K = 576 is not a multiple of 256, so
the K formats have no SmolLM2 rows — GGUF files keep such tensors in a 32-block format).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from common import markdown_table  # noqa: E402

from mistral_kernels import ops  # noqa: E402
from mistral_kernels.ops.quant import QFORMATS  # noqa: E402
from tests.quant_data import random_qweight  # noqa: E402

# (model, projection) → (N, K)
SHAPES = {
    ("mistral-7b", "q/o proj"): (4096, 4096),
    ("mistral-7b", "gate/up proj"): (14336, 4096),
    ("mistral-7b", "down proj"): (4096, 14336),
    ("smollm2-135m", "q/o proj"): (576, 576),
    ("smollm2-135m", "gate/up proj"): (1536, 576),
    ("smollm2-135m", "down proj"): (576, 1536),
}
PREFILL_SHAPES = [("mistral-7b", "q/o proj"), ("smollm2-135m", "gate/up proj")]


def best_time(fn: Callable[[], object], repeats: int = 20, min_time: float = 0.3) -> float:
    """Minimum seconds per call of ``fn`` over at least ``repeats`` calls and ``min_time`` seconds (after one
    warm-up call; at least 3 calls for calls over 0.1 s)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (len(times) < repeats and time.perf_counter() - start < max(min_time, 3 * times[0])):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def copy_gbs(nbytes: int = 64 << 20) -> float:
    """Copy bandwidth (reads + writes, GB/s) of a 64 MB tensor copy (twice the L3 of the machine measured),
    best of 40 repeats (short calls: on a loaded machine some run undisturbed)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_time(lambda: dst.copy_(src), repeats=40, min_time=1.0) / 1e9


def run(threads: int, formats: list[str], m: int) -> str:
    """The decode and prefill tables for one thread count, as markdown."""
    torch.set_num_threads(threads)
    dtype = torch.bfloat16
    bw = copy_gbs()
    print(f"{threads} threads: copy bandwidth {bw:.1f} GB/s", flush=True)
    decode_rows: list[list[object]] = []
    for (model, proj), (n, k) in SHAPES.items():
        g = torch.Generator().manual_seed(n + k)
        x = torch.randn(1, k, generator=g).to(dtype)
        dense = (torch.randn(n, k, generator=g) * 0.02).to(dtype)
        t_dense = best_time(lambda: ops.linear(x, dense), repeats=60, min_time=1.0)
        dense_gbs = n * k * 2 / t_dense / 1e9
        decode_rows.append([model, proj, n, k, "bf16 dense", 2.0, t_dense * 1e6, dense_gbs, 100 * dense_gbs / bw, 1.0])
        print(decode_rows[-1], flush=True)
        for name in formats:
            f = QFORMATS[name]
            if k % f.block:
                continue
            qweight, scales = random_qweight(name, n, k, seed=1, random_bytes=True)
            nbytes = qweight.numel() * qweight.element_size() + (0 if scales is None else scales.numel() * 4)
            t = best_time(lambda: ops.qlinear(x, qweight, f.qtype, scales), repeats=60, min_time=1.0)
            gbs = nbytes / t / 1e9
            decode_rows.append([model, proj, n, k, name, nbytes / (n * k), t * 1e6, gbs, 100 * gbs / bw, t_dense / t])
            print(decode_rows[-1], flush=True)

    prefill_rows: list[list[object]] = []
    for model, proj in PREFILL_SHAPES:
        n, k = SHAPES[(model, proj)]
        g = torch.Generator().manual_seed(n + k)
        x = torch.randn(m, k, generator=g).to(dtype)
        dense = (torch.randn(n, k, generator=g) * 0.02).to(dtype)
        flop = 2 * m * n * k
        t_dense = best_time(lambda: ops.linear(x, dense), repeats=5)
        prefill_rows.append([model, proj, m, n, k, "bf16 dense", t_dense * 1e3, flop / t_dense / 1e9, 1.0])
        print(prefill_rows[-1], flush=True)
        for name in formats:
            f = QFORMATS[name]
            if k % f.block:
                continue
            qweight, scales = random_qweight(name, n, k, seed=1, random_bytes=True)
            t = best_time(lambda: ops.qlinear(x, qweight, f.qtype, scales), repeats=5)
            prefill_rows.append([model, proj, m, n, k, name, t * 1e3, flop / t / 1e9, t_dense / t])
            print(prefill_rows[-1], flush=True)

    decode = markdown_table(["model", "weight", "N", "K", "format", "bytes/weight", "time (us)", "GB/s packed",
                             "% of copy bw", "speed-up vs bf16"], decode_rows)
    prefill = markdown_table(["model", "weight", "M", "N", "K", "format", "time (ms)", "GFLOP/s",
                              "vs bf16 GEMM"], prefill_rows)
    return (f"## {threads} thread{'s' if threads > 1 else ''} (copy bandwidth {bw:.1f} GB/s)\n\n"
            f"### Decode (M = 1)\n\n{decode}\n\n### Prefill (M = {m})\n\n{prefill}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--only", default="", help="one format, e.g. Q4_K (prints, writes no file)")
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    formats = [f for f in QFORMATS if not args.only or f == args.only]
    sections = [run(int(t), formats, args.prefill_tokens) for t in args.threads.split(",")]
    text = ("# qlinear on CPU: decode GEMV and prefill GEMM\n\n"
            "`python benchmarks/bench_quant.py` on this machine (AMD EPYC Zen 4 VM, AVX-512 VNNI / BF16, shared with "
            "other jobs: best-of-N times). GB/s count packed bytes; the copy bandwidth (reads + writes) is measured "
            "in the same run. bf16 activations.\n\n" + "\n".join(sections))
    print(text)
    if not args.only:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "quant_cpu.md").write_text(text)


if __name__ == "__main__":
    main()
