"""The CPU prefill GEMM of qlinear on bf16 x: the int8 GEMM (csrc/cpu/isa/quant_gemm8.h, the avx512bf16 level)
against the dequantized-tile bf16 GEMM it replaces (the same op at the avx512 level: W decoded to bf16 tiles,
oneDNN's vdpbf16ps GEMM), on the Mistral-7B shapes, interleaved rounds in one process.

    python benchmarks/bench_quant_gemm8.py [--threads 1,2] [--ms 32,128,512] [--formats Q4_0,Q8_0,Q4_K,Q5_K,Q6_K]
                                           [--rounds 3] [--out FILE]

Each cell: the minimum time of 3 calls per round, the median over the rounds; GOP/s = 2·M·N·K / time. The
int8 GEMM's bound is the vpdpbusd issue rate (Zen 4: one 512-bit vpdpbusd per cycle, 64 multiply-adds), so its
% column divides by 2 · 64 · the clock per thread (``--ghz``, default 3.7: Zen 4's boost clock — an estimate;
this VM's /proc/cpuinfo reports the 2.6 GHz base, which the kernel's measured rate already exceeds). Weights: random blocks (speed does not depend on the values).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from common import bench_parser, load_average, markdown_table  # noqa: E402

from mistral_kernels import ops  # noqa: E402
from mistral_kernels._library import cpu_isa_supported, set_cpu_isa  # noqa: E402
from mistral_kernels.quant_formats import QFORMATS  # noqa: E402
from tests.helpers.quant_data import random_qweight  # noqa: E402

SHAPES = {"q/o proj": (4096, 4096), "gate/up proj": (14336, 4096), "down proj": (4096, 14336)}  # (N, K)
PATHS = {"int8 GEMM": "avx512bf16", "bf16 tiles": "avx512"}


def time_call(x: torch.Tensor, qweight: torch.Tensor, qtype: int, level: str) -> float:
    set_cpu_isa(level)
    ops.qlinear(x, qweight, qtype)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        ops.qlinear(x, qweight, qtype)
        best = min(best, time.perf_counter() - t)
    return best


def run(threads: int, ms: list[int], formats: list[str], rounds: int, ghz: float) -> str:
    torch.set_num_threads(threads)
    rows = []
    for proj, (n, k) in SHAPES.items():
        for name in formats:
            qweight, _ = random_qweight(name, n, k, seed=n + k, random_bytes=True)
            qtype = QFORMATS[name].qtype
            for m in ms:
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
                times: dict[str, list[float]] = {p: [] for p in PATHS}
                for _ in range(rounds):
                    for path, level in PATHS.items():
                        times[path].append(time_call(x, qweight, qtype, level))
                t8, tb = (statistics.median(times[p]) for p in PATHS)
                ops_ = 2 * m * n * k
                peak = 2 * 64 * ghz * 1e9 * threads
                rows.append([proj, n, k, name, m, f"{tb * 1e3:.1f}", f"{ops_ / tb / 1e9:.0f}", f"{t8 * 1e3:.1f}",
                             f"{ops_ / t8 / 1e9:.0f}", f"{100 * ops_ / t8 / peak:.0f} %" if peak else "-",
                             f"**{tb / t8:.2f}×**"])
                print(rows[-1], flush=True)
    set_cpu_isa(None)
    return markdown_table(["weight", "N", "K", "format", "M", "bf16 tiles ms", "GOP/s", "int8 GEMM ms", "GOP/s",
                           "% of vpdpbusd peak (est.)", "speed-up"], rows)


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--ms", default="32,128,512")
    p.add_argument("--formats", default="Q4_0,Q8_0,Q4_K,Q5_K,Q6_K")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ghz", type=float, default=3.7, help="clock for the peak column (an estimate)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "cpu_quant_gemm8.md")
    a = p.parse_args()
    if not cpu_isa_supported("avx512bf16"):
        sys.exit("bench_quant_gemm8: the int8 GEMM needs the avx512bf16 level (AVX512-VNNI); this CPU has none")
    ghz = a.ghz
    start = load_average()
    sections = []
    for t in (int(v) for v in a.threads.split(",")):
        table = run(t, [int(v) for v in a.ms.split(",")], a.formats.split(","), a.rounds, ghz)
        sections.append(f"## {t} thread{'s' if t > 1 else ''}\n\n{table}\n")
    cmd = "python benchmarks/bench_quant_gemm8.py " + " ".join(sys.argv[1:])
    text = (f"# qlinear prefill on bf16 x: int8 GEMM vs dequantized bf16 tiles (CPU)\n\n`{cmd}` — "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {start} at the start, "
            f"{load_average()} at the end; clock for the peak column {ghz:.2f} GHz (estimate). {__doc__}\n"
            + "\n".join(sections))
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
