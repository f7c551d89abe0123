"""The GPU kernels against the device's own limits, for a short first contact with a GPU (scripts/gpu_check.sh):
decode attention, prefill attention, the MoE block and the quantized GEMV / GEMM, each timed call preceded by an
L2 flush (common.flushed_cuda_time), so that bytes / time is HBM bandwidth even where the working set fits in L2.

    python benchmarks/bench_gpu_kernels.py [--device cuda] [--out DIR] [--parts attention,moe,quant]
    python benchmarks/bench_gpu_kernels.py --device cpu --smoke   # tiny shapes on the CPU: checks the script

Each row: time (median of 20 calls after warm-up, CUDA events), GB/s of the compulsory bytes and that as a % of
the HBM bandwidth of a 1 GiB device copy measured at the start of the same run; TFLOP/s and the % of the dense
bf16 tensor-core peak (common.DENSE_BF16_PEAK_TFLOPS, by device name: H100 SXM / H200 989 TFLOP/s) for the
compute-bound rows; the working set and whether it fits in the L2 cache (H100 50 MB, H200 60 MB) — such a case
would be L2-resident if timed back to back; here it is not (flushed), and a small one is latency-bound.

Shapes: Mistral-7B attention (Hq 32, Hkv 8, D 128, block 16: benchmarks/bench_attention.py's cases and byte
rules), a Mixtral-8x7B MoE layer (H 4096, I 14336, E 8, k 2, bf16), Mistral-7B projections for qlinear
(q/o 4096×4096, gate/up 14336×4096, down 4096×14336) in Q4_K / Q6_K / Q8_0 / Q4_0 / INT8_ROWWISE with bf16
activations, and moe_qgemm (Q4_K, gated w1|w3) on the Mixtral layer. Bytes: decode attention every visible
K/V row + q + out; prefill the same (compute-bound: 4·D FLOPs per visible (query head, key) pair); MoE
decode the touched experts' weights + gate, prefill 2·T·k·3·I·H FLOPs; qlinear the packed weight + x + out,
2·M·N·K FLOPs. The quantized rows need the ``gguf`` package (random blocks: tests/helpers/quant_data.py); without it
they are left out, and the table says so. Written to DIR/gpu_kernels.md (default benchmarks/results).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
import bench_attention  # noqa: E402
from common import (bench_parser, copy_bandwidth_gbs, dense_bf16_peak_tflops, device_name, gpu_device,  # noqa: E402
                    flushed_cuda_time, l2_bytes, l2_flush_buffer, markdown_table, median_time, results_dir)

from mistral_kernels import ops  # noqa: E402

PARTS = ("attention", "moe", "quant")
QUANT_FORMATS = ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "INT8_ROWWISE")


@dataclasses.dataclass
class Row:
    """One timed case: ``nbytes`` compulsory bytes, ``flops``, ``bound`` memory or compute."""

    op: str
    shape: str
    nbytes: int
    flops: int
    bound: str
    fn: Callable[[], object]


def attention_rows(dev: str, smoke: bool) -> list[Row]:
    bench_attention.DEVICE = dev
    bf16 = torch.bfloat16
    if smoke:
        decode = [(1, 64, None), (2, 64, 16)]
        prefill = [(32, 0, 1), (16, 32, 1)]
    else:
        decode = [(1, 512, None), (1, 4096, None), (1, 4096, 1024), (32, 4096, None), (64, 1024, None),
                  (1, 32768, None)]
        prefill = [(4096, 0, 1), (512, 0, 16), (128, 2048, 1)]
    rows = []
    for b, ctx, window in decode:
        c = bench_attention.decode_case(b, ctx, bf16, window)
        rows.append(Row(c.op, c.shape, c.nbytes, c.flops, "memory", c.ours))
    for new, cached, b in prefill:
        c = bench_attention.prefill_case(new, cached, bf16, batch=b)
        rows.append(Row(c.op, c.shape, c.nbytes, c.flops, "compute", c.ours))
    return rows


def moe_rows(dev: str, smoke: bool) -> list[Row]:
    import bench_moe  # transformers at import: only for this part

    h, i, e, k = (64, 96, 8, 2) if smoke else (4096, 14336, 8, 2)
    tokens = (1, 16) if smoke else (1, 16, 512, 4096)
    bf16 = torch.bfloat16
    es = 2
    gate, w1, w2, w3 = bench_moe.make_weights(h, i, e, bf16, dev)
    rows = []
    for t in tokens:
        x = torch.randn(t, h, generator=torch.Generator().manual_seed(t)).to(dev, bf16)
        _, ids = ops.topk_softmax(torch.matmul(x, gate.T), k)
        touched = int(torch.unique(ids).numel())  # host sync, before timing
        compute = t > 64
        rows.append(Row("fused_moe", f"Mixtral layer T={t} ({touched} experts)", touched * 3 * i * h * es + e * h * es
                        + 2 * t * h * es, 2 * t * k * 3 * i * h, "compute" if compute else "memory",
                        lambda x=x: ops.fused_moe(x, gate, w1, w2, w3, k)))
    return rows


def _packed(name: str, n: int, k: int, dev: str, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    from tests.helpers.quant_data import random_qweight

    q, s = random_qweight(name, n, k, seed, random_bytes=True)
    return q.to(dev), None if s is None else s.to(dev)


def quant_rows(dev: str, smoke: bool) -> list[Row]:
    from mistral_kernels.quant_formats import QFORMATS

    shapes = {"q/o 4096×4096": (256, 256)} if smoke else \
        {"q/o 4096×4096": (4096, 4096), "gate/up 14336×4096": (14336, 4096), "down 4096×14336": (4096, 14336)}
    ms = (1, 8) if smoke else (1, 8, 512)
    # The small-batch GEMM (8 < M ≤ kQGemmDequantRows = 64: the split-K tile GEMM, quant_gemm.cuh) and, at
    # M = 65, the path above it (W dequantized once to bf16 + cuBLAS): its time at 65 rows stands in for that
    # alternative at any M ≤ 64 (both of its steps stream W; an estimate), so the rows decide the threshold.
    small_ms = (16, 65) if smoke else (16, 32, 64, 65)
    small_formats = ("Q4_K", "Q8_0")
    small_shapes = ("q/o 4096×4096", "gate/up 14336×4096")
    rows = []
    for fi, name in enumerate(QUANT_FORMATS if not smoke else ("Q4_K", "INT8_ROWWISE")):
        qtype = QFORMATS[name].qtype
        for label, (n, k) in shapes.items():
            q, s = _packed(name, n, k, dev, seed=fi)
            wbytes = q.numel() * q.element_size() + (0 if s is None else s.numel() * 4)
            extra = small_ms if name in small_formats and label in small_shapes else ()
            if smoke:
                label = f"{n}×{k}"
            for m in (*ms, *extra):
                if m > 8 and m not in extra and name not in small_formats:
                    continue  # prefill GEMM: two formats are enough
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dev, torch.bfloat16)
                path = " (dequant + mm)" if m == 65 else " (split-K tile)" if m in extra else ""
                rows.append(Row("qlinear", f"{name} {label} M={m}{path}", wbytes + 2 * m * (n + k), 2 * m * n * k,
                                "compute" if m > 65 else "memory",
                                lambda x=x, q=q, s=s, qtype=qtype: ops.qlinear(x, q, qtype, s)))
    # moe_qgemm: the gated expert projection (w1 | w3 with SwiGLU) of a decode step, T = 1 → 2 rows, 2 experts
    h, i, e = (256, 512, 8) if smoke else (4096, 14336, 8)
    qtype = QFORMATS["Q4_K"].qtype
    w1 = torch.stack([_packed("Q4_K", i, h, dev, seed=10 + g)[0] for g in range(e)])
    w3 = torch.stack([_packed("Q4_K", i, h, dev, seed=20 + g)[0] for g in range(e)])
    for t in (1, 16):
        rows_per = [0] * e
        for r in range(2 * t):
            rows_per[r % e] += 1
        offsets = torch.tensor([0, *torch.tensor(rows_per).cumsum(0).tolist()], device=dev)
        touched = sum(c > 0 for c in rows_per)
        x = torch.randn(2 * t, h, generator=torch.Generator().manual_seed(t)).to(dev, torch.bfloat16)
        nbytes = touched * 2 * w1[0].numel() + 2 * x.numel() + 2 * x.shape[0] * i
        rows.append(Row("moe_qgemm", f"Q4_K gated w1+w3 Mixtral T={t} ({touched} experts)", nbytes,
                        2 * 2 * x.shape[0] * i * h, "memory",
                        lambda x=x, offsets=offsets: ops.moe_qgemm(x, offsets, w1, qtype, None, w3)))
    return rows


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--device", default="cuda", help="cuda[:N] (default) or cpu (with --smoke: checks the script)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (any device): runs every code path quickly")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory of gpu_kernels.md (default: benchmarks/results; a --smoke run: a temporary directory)")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if any(p not in PARTS for p in parts):
        ap.error(f"--parts: choose from {', '.join(PARTS)}")
    gpu = gpu_device(ap, args.device, args.smoke, "bench_attention.py, bench_quant.py, ...")
    torch.set_grad_enabled(False)
    dev = args.device
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    name = device_name(dev)
    bw = copy_bandwidth_gbs(device=dev)
    l2 = l2_bytes(dev)
    peak = dense_bf16_peak_tflops(name) if gpu else None
    flush = l2_flush_buffer(dev) if gpu else None
    print(f"{name}: copy bandwidth {bw:.0f} GB/s, L2 {l2 / 1e6:.0f} MB, dense bf16 peak "
          f"{'unknown' if peak is None else f'{peak:.0f} TFLOP/s'}", flush=True)
    notes: list[str] = []
    failures: list[str] = []
    builders = {"attention": attention_rows, "moe": moe_rows, "quant": quant_rows}
    table_rows: list[list[object]] = []
    peak_text = "unknown for this device" if peak is None else f"{peak:.0f} TFLOP/s (data sheet, by device name)"
    header = (f"{started}, {name}: HBM copy bandwidth {bw:.0f} GB/s (1 GiB device copy, measured in this run), L2 "
              f"{l2 / 1e6:.0f} MB, dense bf16 peak {peak_text}; load average "
              f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}. Every timed call follows an L2 flush"
              f"{'' if gpu else ' (CPU smoke run: no flush, tiny shapes, figures meaningless)'}; measured, "
              f"median of 20 calls, device index checks off (as in the engine). "
              f"Command: `python benchmarks/bench_gpu_kernels.py {' '.join(sys.argv[1:])}`")
    args.out = results_dir(args.out, args.smoke, ROOT / "results")
    args.out.mkdir(parents=True, exist_ok=True)
    for part in parts:
        if part == "quant" and importlib.util.find_spec("gguf") is None:
            notes.append("quantized rows left out: the gguf package is not installed (bring its wheel)")
            print(notes[-1], flush=True)
            continue
        try:
            part_rows = builders[part](dev, args.smoke)
        except Exception as exc:  # a part that cannot even be set up: said so, the other parts still run
            failures.append(f"{part}: setting up failed: {type(exc).__name__}: {exc}")
            print(failures[-1], flush=True)
            continue
        for r in part_rows:
            try:
                with ops.device_index_checks(False):  # no host sync inside the timed calls
                    t = flushed_cuda_time(r.fn, flush) if gpu else median_time(r.fn, repeats=5, min_time=0.0)
            except Exception as exc:  # one failing kernel: its row says so, the others are still measured
                failures.append(f"{r.op} {r.shape}: {type(exc).__name__}: {str(exc)[:300]}")
                table_rows.append([r.op, r.shape, r.bound, "FAILED (below)", "", "", "", "", r.nbytes / 1e6, ""])
                print(failures[-1], flush=True)
                continue
            gbs = r.nbytes / t / 1e9
            tflops = r.flops / t / 1e12
            fits = "yes (flushed)" if gpu and r.nbytes <= l2 else ("no" if gpu else "—")
            pct_peak = f"{100 * tflops / peak:.0f}%" if peak and r.bound == "compute" else "—"
            table_rows.append([r.op, r.shape, r.bound, t * 1e6, gbs, f"{100 * gbs / bw:.0f}%", tflops, pct_peak,
                               r.nbytes / 1e6, fits])
            print(" | ".join(str(v) for v in table_rows[-1]), flush=True)
        if gpu:
            torch.cuda.empty_cache()
        _write(args.out / "gpu_kernels.md", header, table_rows,
               notes + failures + [f"parts done: {part} (of {', '.join(parts)})"])
    text = _write(args.out / "gpu_kernels.md", header, table_rows, notes + failures)
    print("\n" + text)
    print(f"wrote {args.out / 'gpu_kernels.md'}")
    if failures:
        raise SystemExit(f"{len(failures)} case(s) failed (listed in the table)")


def _write(path: Path, header: str, rows: list[list[object]], notes: list[str]) -> str:
    """The table so far (rewritten after each part: a run cut short by its time limit keeps what it measured)."""
    table = markdown_table(["op", "shape", "bound", "µs", "GB/s", "% of HBM copy bw", "TFLOP/s",
                            "% of dense bf16 peak", "bytes (MB)", "working set ≤ L2"], rows)
    text = header + "\n\n" + table + "\n" + "".join(f"\n{n}\n" for n in notes)
    path.write_text(text)
    return text


if __name__ == "__main__":
    main()
