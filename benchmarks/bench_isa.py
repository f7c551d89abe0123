"""Decode speed per CPU ISA level (SmolLM2, batch 1, through LLM's engine) in one process, with the copy bandwidth.

    python benchmarks/bench_isa.py [--new-tokens 32] [--dtype bf16|fp32|both] [--label NAME]

Each level the CPU supports is forced with mistral_kernels.set_cpu_isa; a library without per-ISA kernels (an
older -march=native build, loaded through MISTRAL_KERNELS_LIBRARY with its own python/) is measured once as
"native". Prints one markdown row per (dtype, level): decode tok/s and % of the decode roofline (weights +
KV bytes per step / copy bandwidth). Results: benchmarks/results/cpu_isa.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbs  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def decode_tok_s(llm: mistral_kernels.LLM, new_tokens: int) -> float:
    prompt = list(range(100, 116))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    (done,) = llm.engine.run([llm.engine.add_request(prompt, params)])
    return (new_tokens - 1) / (done.timings.finished - done.timings.first_token)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--label", default="", help="build label for the table (e.g. before / after)")
    args = ap.parse_args()
    levels = [lv for lv in getattr(mistral_kernels, "CPU_ISA_LEVELS", ()) if mistral_kernels.cpu_isa_supported(lv)]
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.1f} GB/s, {torch.get_num_threads()} threads, {args.new_tokens} new tokens")
    print("| build | dtype | ISA level | decode tok/s b=1 | % roofline |\n|---|---|---|---|---|")
    for name in (["fp32", "bf16"] if args.dtype == "both" else [args.dtype]):
        llm = mistral_kernels.LLM(default_model_path(), dtype=DTYPES[name], max_batch=1)
        cfg = llm.model.config
        es = torch.tensor([], dtype=DTYPES[name]).element_size()
        step_bytes = cfg.num_parameters(active_only=True) * es + (16 + args.new_tokens // 2) * cfg.kv_bytes_per_token(DTYPES[name])
        decode_tok_s(llm, 4)  # warm-up
        for level in levels or ["native"]:
            if levels:
                mistral_kernels.set_cpu_isa(level)
            best = max(decode_tok_s(llm, args.new_tokens) for _ in range(2))
            print(f"| {args.label} | {name} | {level} | {best:.1f} | {100 * best * step_bytes / (bw * 1e9):.0f}% |",
                  flush=True)
            time.sleep(0.2)
        if levels:
            mistral_kernels.set_cpu_isa(None)


if __name__ == "__main__":
    main()
