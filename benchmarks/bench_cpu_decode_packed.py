"""The fused CPU decode step on packed weights vs the per-op packed path, A/B in one process.

SmolLM2-135M-Instruct Q4_1 (the default model), loaded natively packed (the default), batch 1: decode tok/s
through the engine (``LLM.generate``'s path: greedy, EOS ignored, 16-token prompt) with the fused step
(``llm.model.cpu_decode`` as built) and per-op (``llm.model.cpu_decode = None``: one ``qlinear`` per
matrix), alternating in every round (the order flips each round), median per configuration — the only
comparison that means anything on a shared machine. Optionally llama.cpp's ``llama-bench`` on the same file
and thread count, interleaved in the same rounds (``--llama-bench PATH``; its tg rate, 64 tokens).

Not part of the test suite::

    OMP_NUM_THREADS=2 python benchmarks/bench_cpu_decode_packed.py --rounds 5 \
        --llama-bench /work/llama/build/bin/llama-bench --out benchmarks/results/cpu_decode_packed.md
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, dtypes, copy_bandwidth_gbs, markdown_table  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402

DTYPES = dtypes("bf16", "fp32")


def decode_rate(llm: mistral_kernels.LLM, prompt: list[int], new_tokens: int) -> float:
    """Batch-1 decode tok/s of one engine run (first token → last token)."""
    rid = llm.engine.add_request(prompt, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
    (done,) = llm.engine.run([rid])
    return (new_tokens - 1) / (done.timings.finished - done.timings.first_token)


def llama_bench_rate(exe: str, model: Path, threads: int, new_tokens: int) -> float:
    """llama.cpp's tg tok/s on the same file (one repetition)."""
    out = subprocess.run([exe, "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(new_tokens), "-r", "1",
                          "-o", "json"], check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--dtype", choices=[*DTYPES, "both"], default="both", help="activation dtype")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--llama-bench", default=None, help="path of llama.cpp's llama-bench (optional)")
    ap.add_argument("--out", type=Path, default=None, help="write the table (markdown) here")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    path = default_model_path()
    names = list(DTYPES) if args.dtype == "both" else [args.dtype]
    llms = {n: mistral_kernels.LLM(path, dtype=DTYPES[n], max_batch=1) for n in names}
    fused = {n: llm.model.cpu_decode for n, llm in llms.items()}
    assert all(f is not None for f in fused.values()), "the packed model did not take the fused decode step"
    prompt = list(range(100, 116))
    rates: dict[tuple[str, str], list[float]] = {}
    bws = []
    for n, llm in llms.items():  # warm-up (pages of the map, thread pool)
        decode_rate(llm, prompt, 8)
    for r in range(args.rounds):
        bws.append(copy_bandwidth_gbs())
        for n, llm in llms.items():
            modes = ["fused", "per-op"] if r % 2 == 0 else ["per-op", "fused"]
            for mode in modes:
                llm.model.cpu_decode = fused[n] if mode == "fused" else None
                rates.setdefault((n, mode), []).append(decode_rate(llm, prompt, args.new_tokens))
            llm.model.cpu_decode = fused[n]
        if args.llama_bench:
            rates.setdefault(("llama.cpp", "Q4_1 weights"), []).append(
                llama_bench_rate(args.llama_bench, path, threads, args.new_tokens))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k[0]} {k[1]} {v[-1]:.1f}" for k, v in rates.items()),
              flush=True)
    rows = []
    for (n, mode), v in rates.items():
        per_op = rates.get((n, "per-op"))
        rel = f"{statistics.median(v) / statistics.median(per_op):.2f}×" if per_op and mode == "fused" else ""
        rows.append([n, mode, f"{statistics.median(v):.1f}", f"{min(v):.1f}–{max(v):.1f}", rel])
    table = markdown_table(["activations", "decode path", "median tok/s", "range", "fused / per-op"], rows)
    load = os.getloadavg()
    head = (f"SmolLM2-135M-Instruct Q4_1 native, batch 1, {threads} threads, {args.new_tokens} new tokens, "
            f"{args.rounds} interleaved rounds; copy bandwidth {min(bws):.1f}–{max(bws):.1f} GB/s; load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    text = head + "\n\n" + table
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
