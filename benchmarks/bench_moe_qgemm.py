"""Packed-MoE expert GEMMs on the CPU: one ``moe_qgemm`` call over all experts (csrc/cpu/moe_quant.cpp) vs the
former per-expert loop (offsets to the host, one ``qlinear`` per segment and projection, ``silu_and_mul``),
measured interleaved in one process on the same permuted rows and packed experts.

    python benchmarks/bench_moe_qgemm.py [--threads 2] [--format Q4_K] [--tokens 1,4,64] [--small]

Shapes: Mixtral-8x7B experts (E 8, H 4096, I 14336, top-2), or ``--small`` (H 1024, I 3584). Rows are routed
uniformly at random (T tokens · 2 choices). Weights: random blocks with finite scales. Activations bf16.
Reports the minimum time per layer of each path and the packed bytes of the touched experts per second
(decode bound: those bytes at memory bandwidth).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from common import bench_parser, markdown_table  # noqa: E402

from mistral_kernels import ops  # noqa: E402
from mistral_kernels.ops.quant import QFORMATS  # noqa: E402
from tests.helpers.quant_data import random_qweight  # noqa: E402


def best_time(fn: Callable[[], object], repeats: int = 10) -> float:
    fn()
    return min(_timed(fn) for _ in range(repeats))


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--format", default="Q4_K", choices=[f for f in QFORMATS if f != "INT8_ROWWISE"])
    ap.add_argument("--tokens", default="1,4,64")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    e, h, i, k = (8, 1024, 3584, 2) if a.small else (8, 4096, 14336, 2)
    f = QFORMATS[a.format]

    def stack(n: int, kk: int, seed: int) -> torch.Tensor:
        return torch.stack([random_qweight(a.format, n, kk, seed=seed + j, random_bytes=True)[0] for j in range(e)])

    w1, w3, w2 = stack(i, h, 0), stack(i, h, 100), stack(h, i, 200)
    rows = []
    for t in map(int, a.tokens.split(",")):
        ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(s))[:k] for s in range(t)]).int()
        x = torch.randn(t, h).bfloat16()
        permuted, offsets, _ = ops.moe_permute(x, ids, e)

        def fused() -> torch.Tensor:
            act = ops.moe_qgemm(permuted, offsets, w1, f.qtype, None, w3, None)
            return ops.moe_qgemm(act, offsets, w2, f.qtype)

        def loop() -> torch.Tensor:
            out = torch.empty_like(permuted)
            bounds = offsets.tolist()
            for g in range(e):
                r = permuted[bounds[g]:bounds[g + 1]]
                if r.shape[0]:
                    gu = torch.cat([ops.qlinear(r, w1[g], f.qtype), ops.qlinear(r, w3[g], f.qtype)], dim=-1)
                    ops.qlinear(ops.silu_and_mul(gu), w2[g], f.qtype, out=out[bounds[g]:bounds[g + 1]])
            return out

        torch.testing.assert_close(fused().float(), loop().float(), atol=0.05, rtol=0.05)
        tf, tl = [], []
        for _ in range(5):  # interleaved A/B
            tf.append(best_time(fused, 3))
            tl.append(best_time(loop, 3))
        touched = int((offsets[1:] > offsets[:-1]).sum())
        nbytes = touched * 3 * i * f.row_bytes(h)
        rows.append([t, touched, f"{min(tl) * 1e3:.2f}", f"{min(tf) * 1e3:.2f}", f"{min(tl) / min(tf):.2f}x",
                     f"{nbytes / min(tf) / 1e9:.1f}"])
    print(f"{a.format}, E {e}, H {h}, I {i}, top-{k}, bf16, {a.threads} threads (loaded machine: ratios only)")
    print(markdown_table(["T", "experts touched", "loop ms", "moe_qgemm ms", "speed-up", "GB/s packed"], rows))


if __name__ == "__main__":
    main()
