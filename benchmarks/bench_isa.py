"""Speed per CPU ISA level in one process: the decode GEMV (skinny_linear, M = 1, SmolLM2 / Mistral-7B shapes;
best of --reps calls) and SmolLM2 decode at batch 1 through LLM's engine (best of 3), with the copy bandwidth.

    python benchmarks/bench_isa.py [--new-tokens 32] [--dtype bf16|fp32|both] [--label NAME] [--threads N]

Each level the CPU supports is forced with mistral_kernels.set_cpu_isa; a library without per-ISA kernels (an
older -march=native build, loaded through MISTRAL_KERNELS_LIBRARY with its own python/) is measured once as
"native". Prints one markdown row per (dtype, level): GEMV GB/s (weight bytes / best time), decode tok/s and % of the
decode roofline (weights + KV bytes per step / copy bandwidth). Best-of timings: on a shared machine the
minimum is the least disturbed. Results: benchmarks/results/cpu_isa.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, dtypes, copy_bandwidth_gbs  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402

DTYPES = dtypes("fp32", "bf16")


def decode_tok_s(llm: mistral_kernels.LLM, new_tokens: int) -> float:
    prompt = list(range(100, 116))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    (done,) = llm.engine.run([llm.engine.add_request(prompt, params)])
    return (new_tokens - 1) / (done.timings.finished - done.timings.first_token)


GEMV_SHAPES = {"smollm2 mlp": (1536, 576), "mistral-7b mlp": (14336, 4096)}  # N, K


def gemv_gbs(dtype: torch.dtype, n: int, k: int, reps: int) -> float:
    x, w = torch.randn(1, k).to(dtype), torch.randn(n, k).to(dtype)
    out = torch.empty(1, n, dtype=dtype)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        mistral_kernels.ops.linear(x, w, out=out)
        best = min(best, time.perf_counter() - t0)
    return w.numel() * w.element_size() / best / 1e9


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--label", default="", help="build label for the table (e.g. before / after)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=30, help="GEMV calls per shape (best taken)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = [lv for lv in getattr(mistral_kernels, "CPU_ISA_LEVELS", ()) if mistral_kernels.cpu_isa_supported(lv)]
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.1f} GB/s, {torch.get_num_threads()} threads, {args.new_tokens} new tokens")
    heads = " | ".join(f"GEMV {s} GB/s" for s in GEMV_SHAPES)
    print(f"| build | dtype | ISA level | {heads} | decode tok/s b=1 | % roofline |")
    print("|---" * (5 + len(GEMV_SHAPES)) + "|")
    for name in (["fp32", "bf16"] if args.dtype == "both" else [args.dtype]):
        llm = mistral_kernels.LLM(default_model_path(), dtype=DTYPES[name], max_batch=1)
        cfg = llm.model.config
        es = torch.tensor([], dtype=DTYPES[name]).element_size()
        step_bytes = cfg.num_parameters(active_only=True) * es + (16 + args.new_tokens // 2) * cfg.kv_bytes_per_token(DTYPES[name])
        decode_tok_s(llm, 4)  # warm-up
        for level in levels or ["native"]:
            if levels:
                mistral_kernels.set_cpu_isa(level)
            gemv = " | ".join(f"{gemv_gbs(DTYPES[name], n, k, args.reps):.1f}" for n, k in GEMV_SHAPES.values())
            best = max(decode_tok_s(llm, args.new_tokens) for _ in range(3))
            print(f"| {args.label} | {name} | {level} | {gemv} | {best:.1f} | "
                  f"{100 * best * step_bytes / (bw * 1e9):.0f}% |", flush=True)
            time.sleep(0.2)
        if levels:
            mistral_kernels.set_cpu_isa(None)


if __name__ == "__main__":
    main()
