"""CPU qlinear benchmark (csrc/cpu/quant.cpp): quantized weights vs the dense linear on the same shape.

    python benchmarks/bench_quant.py [--threads 1,2] [--only FORMAT] [--prefill-tokens M] [--parts prefill]

Decode (M = 1): the GEMV streams the packed weight once, so its roofline is the memory bandwidth: the table
gives GB/s of packed bytes (N · K / QK · bytes per block) and that as a % of the copy bandwidth measured in the
same run (reads + writes of a 256 MB copy), next to ops.linear on the dense bf16 weight (N · K · 2 bytes)
and the speed-up over it (fewer bytes per weight → fewer bytes to stream).
Decode activations are bf16 (Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K: quantized to int8 per 32 on a VNNI CPU, see
csrc/cpu/isa/quant_kernels.h).
Prefill (M = --prefill-tokens; ``--parts prefill`` alone): dequantized tiles of W and a GEMM, fp32 and bf16
activations; GFLOP/s (2 · M · N · K / time) next to torch's GEMM on the dense weight of the same dtype.
Weights: random blocks with finite fp16 scales (speed does not depend on the values).
Times are the minimum over repeated calls (and the copy bandwidth the maximum): on a shared machine the
minimum is the run least disturbed by other processes, and both sides of every ratio are measured alike.
Shapes: Mistral-7B (H 4096, I 14336) and SmolLM2-135M (H 576, I 1536; K = 576 is not a multiple of 256, so
the K formats have no SmolLM2 rows — GGUF files keep such tensors in a 32-block format).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from common import bench_parser, markdown_table  # noqa: E402

from mistral_kernels import ops  # noqa: E402
from mistral_kernels.ops.quant import QFORMATS  # noqa: E402
from tests.helpers.quant_data import random_qweight  # noqa: E402

# (model, projection) → (N, K)
SHAPES = {
    ("mistral-7b", "q/o proj"): (4096, 4096),
    ("mistral-7b", "gate/up proj"): (14336, 4096),
    ("mistral-7b", "down proj"): (4096, 14336),
    ("smollm2-135m", "q/o proj"): (576, 576),
    ("smollm2-135m", "gate/up proj"): (1536, 576),
    ("smollm2-135m", "down proj"): (576, 1536),
}
PREFILL_SHAPES = {  # the fused projections of the models (q|k|v and gate|up are one packed weight each)
    ("mistral-7b", "q/o proj"): (4096, 4096),
    ("smollm2-135m", "qkv proj"): (960, 576),
    ("smollm2-135m", "gate|up proj"): (3072, 576),
    ("smollm2-135m", "down proj"): (576, 1536),
}
QCall = Callable[[torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]  # (qweight, qtype, scales) → out


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


def format_timings(n: int, k: int, formats: list[str], call: QCall, *, repeats: int,
                   min_time: float = 0.3) -> Iterator[tuple[str, float, int]]:
    """(format, best seconds per call, packed bytes) of ``call(qweight, qtype, scales)`` on a random W [N, K] in
    each format of ``formats`` that K fits (K a multiple of its block)."""
    for name in formats:
        f = QFORMATS[name]
        if k % f.block:
            continue
        qweight, scales = random_qweight(name, n, k, seed=1, random_bytes=True)
        nbytes = qweight.numel() * qweight.element_size() + (0 if scales is None else scales.numel() * 4)
        t = best_time(lambda: call(qweight, f.qtype, scales), repeats=repeats, min_time=min_time)
        yield name, t, nbytes


def decode_table(formats: list[str], bw: float) -> str:
    """M = 1, bf16 x: GB/s of packed bytes vs the dense bf16 GEMV, every shape of SHAPES."""
    rows: list[list[object]] = []
    for (model, proj), (n, k) in SHAPES.items():
        g = torch.Generator().manual_seed(n + k)
        x = torch.randn(1, k, generator=g).to(torch.bfloat16)
        dense = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        t_dense = best_time(lambda: ops.linear(x, dense), repeats=60, min_time=1.0)
        dense_gbs = n * k * 2 / t_dense / 1e9
        rows.append([model, proj, n, k, "bf16 dense", 2.0, t_dense * 1e6, dense_gbs, 100 * dense_gbs / bw, 1.0])
        print(rows[-1], flush=True)
        for name, t, nbytes in format_timings(n, k, formats, lambda q, qt, sc: ops.qlinear(x, q, qt, sc),
                                              repeats=60, min_time=1.0):
            gbs = nbytes / t / 1e9
            rows.append([model, proj, n, k, name, nbytes / (n * k), t * 1e6, gbs, 100 * gbs / bw, t_dense / t])
            print(rows[-1], flush=True)
    return markdown_table(["model", "weight", "N", "K", "format", "bytes/weight", "time (us)", "GB/s packed",
                           "% of copy bw", "speed-up vs bf16"], rows)


def prefill_table(formats: list[str], m: int) -> str:
    """M = m rows of x in fp32 and bf16: GFLOP/s of qlinear vs ops.linear on the dense weight of the same dtype
    (torch's GEMM), every shape of PREFILL_SHAPES."""
    rows: list[list[object]] = []
    for (model, proj), (n, k) in PREFILL_SHAPES.items():
        flop = 2 * m * n * k
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(n + k)
            x = torch.randn(m, k, generator=g).to(dtype)
            dense = (torch.randn(n, k, generator=g) * 0.02).to(dtype)
            label = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
            t_dense = best_time(lambda: ops.linear(x, dense), repeats=5)
            rows.append([model, proj, m, n, k, label, f"{label} dense", t_dense * 1e3, flop / t_dense / 1e9, 1.0])
            print(rows[-1], flush=True)
            for name, t, _ in format_timings(n, k, formats, lambda q, qt, sc: ops.qlinear(x, q, qt, sc), repeats=5):
                rows.append([model, proj, m, n, k, label, name, t * 1e3, flop / t / 1e9, t_dense / t])
                print(rows[-1], flush=True)
    return markdown_table(["model", "weight", "M", "N", "K", "x", "format", "time (ms)", "GFLOP/s",
                           "vs dense GEMM"], rows)


def run(threads: int, formats: list[str], m: int, parts: str) -> str:
    """The decode and / or prefill tables for one thread count, as markdown."""
    torch.set_num_threads(threads)
    bw = copy_gbs()
    print(f"{threads} threads: copy bandwidth {bw:.1f} GB/s", flush=True)
    text = f"## {threads} thread{'s' if threads > 1 else ''} (copy bandwidth {bw:.1f} GB/s)\n\n"
    if parts in ("both", "decode"):
        text += f"### Decode (M = 1, bf16 x)\n\n{decode_table(formats, bw)}\n\n"
    if parts in ("both", "prefill"):
        text += f"### Prefill (M = {m})\n\n{prefill_table(formats, m)}\n"
    return text


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--only", default="", help="one format, e.g. Q4_K (prints, writes no file)")
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--parts", choices=("both", "decode", "prefill"), default="both",
                        help="which tables (prefill alone writes results/cpu_quant_prefill.md)")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    formats = [f for f in QFORMATS if not args.only or f == args.only]
    sections = [run(int(t), formats, args.prefill_tokens, args.parts) for t in args.threads.split(",")]
    title = {"both": "decode GEMV and prefill GEMM", "decode": "decode GEMV", "prefill": "prefill GEMM"}[args.parts]
    text = (f"# qlinear on CPU: {title}\n\n"
            "`python benchmarks/bench_quant.py` on this machine (AMD EPYC Zen 4 VM, AVX-512 VNNI / BF16, shared with "
            "other jobs: best-of-N times). GB/s count packed bytes; the copy bandwidth (reads + writes) is measured "
            "in the same run.\n\n" + "\n".join(sections))
    print(text)
    if not args.only:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "cpu_quant_prefill.md" if args.parts == "prefill" else "cpu_quant.md"
        (args.out / name).write_text(text)


if __name__ == "__main__":
    main()
