"""Batched decode, ours vs llama.cpp on the same GGUF and thread count: aggregate tok/s of B sequences decoding
together (llama-batched-bench's S_TG), interleaved rounds, medians.

    python benchmarks/bench_batched.py --model FILE.gguf --llama-decode BIN [--batches 1,4,8,16]
                                       [--prompt-tokens 128] [--new-tokens 32] [--rounds 3] [--threads 2]
                                       [--activations auto] [--out FILE]

- **ours**: ``LLM(FILE, max_batch=max B, prefix_caching=False).generate`` of B prompts (the first
  ``--prompt-tokens`` tokens of README.md, rotated by one token per sequence so that no two are equal), greedy,
  EOS ignored, run twice per round: with ``--new-tokens`` G and with 1 new token. The second run is the same
  prefill; aggregate decode tok/s = B · (G − 1) / (time(G) − time(1)), so neither prefill nor the first sample
  is counted — the engine, sampling and detokenisation of the decode steps are.
- **llama.cpp**: ``llama_decode FILE THREADS P G B1,B2,..`` (benchmarks/native/llama_decode.c, built against
  libllama as its header says): B sequences of P random tokens of context, then G steps of B tokens, aggregate
  = B · G / time (no sampling).

Each round runs ours for every B, then llama.cpp for every B. The report states the date, load average and
copy bandwidth; on a shared machine only same-round ratios mean something.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, copy_bandwidth_gbs, load_average, markdown_table  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.activations import ACTIVATIONS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def prompts(llm: mistral_kernels.LLM, tokens: int, n: int) -> list[str]:
    """n plain-text prompts of ``tokens`` tokens each (BOS included): README.md's opening rotated by i tokens."""
    ids = llm.tokenizer.encode((ROOT / "README.md").read_text(), add_special_tokens=False)[: tokens - 1]
    return [llm.tokenizer.decode(ids[i:] + ids[:i]) for i in range(n)]


def ours_aggregate(llm: mistral_kernels.LLM, texts: list[str], new_tokens: int) -> float:
    """B · (G − 1) / (time of G new tokens − time of 1), both runs with the same prompts."""
    def timed(g: int) -> float:
        t0 = time.perf_counter()
        outs = llm.generate(texts, max_new_tokens=g, ignore_eos=True)
        dt = time.perf_counter() - t0
        if any(len(c.token_ids) != g for c in outs):
            raise RuntimeError(f"expected {g} tokens per sequence, got {[len(c.token_ids) for c in outs]}")
        return dt
    one = timed(1)
    full = timed(new_tokens)
    return len(texts) * (new_tokens - 1) / (full - one)


def llama_aggregate(binary: Path, model: Path, threads: int, prompt: int, gen: int, batches: list[int]) -> dict[int, float]:
    """llama_decode's "tg B=b X tok/s" lines → {b: X}."""
    out = subprocess.run([str(binary), str(model), str(threads), str(prompt), str(gen), ",".join(map(str, batches)), "1"],
                         capture_output=True, text=True, check=True).stdout
    got: dict[int, float] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "tg" and parts[1].startswith("B="):
            got[int(parts[1][2:])] = float(parts[2])
    missing = [b for b in batches if b not in got]
    if missing:
        raise RuntimeError(f"llama_decode printed no 'tg B=' line for {missing}:\n{out}")
    return got


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", type=Path, required=True, help="a GGUF file")
    ap.add_argument("--llama-decode", type=Path, required=True, help="the built benchmarks/native/llama_decode.c")
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--activations", default="auto", choices=ACTIVATIONS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batches: expected a comma-separated list of integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.rounds < 1 or args.new_tokens < 2 or args.prompt_tokens < 2:
        ap.error("--batches must be >= 1, --rounds >= 1, --new-tokens and --prompt-tokens >= 2")
    if not args.llama_decode.is_file():
        ap.error(f"--llama-decode: no file {args.llama_decode} (build benchmarks/native/llama_decode.c)")
    torch.set_num_threads(args.threads)

    start = datetime.datetime.now(datetime.timezone.utc)
    load0 = load_average()
    llm = mistral_kernels.LLM(args.model, max_batch=max(batches), prefix_caching=False, activations=args.activations)
    texts = prompts(llm, args.prompt_tokens, max(batches))
    llm.generate(texts[:2], max_new_tokens=2, ignore_eos=True)  # warm-up
    ours: dict[int, list[float]] = {b: [] for b in batches}
    theirs: dict[int, list[float]] = {b: [] for b in batches}
    bws: list[float] = []
    for r in range(args.rounds):
        bws.append(copy_bandwidth_gbs())
        print(f"round {r + 1}/{args.rounds}: copy bandwidth {bws[-1]:.1f} GB/s, load {load_average()}", flush=True)
        for b in batches:
            ours[b].append(ours_aggregate(llm, texts[:b], args.new_tokens))
            print(f"  ours B={b}: {ours[b][-1]:.2f} tok/s", flush=True)
        for b, v in llama_aggregate(args.llama_decode, args.model, args.threads, args.prompt_tokens,
                                    args.new_tokens, batches).items():
            theirs[b].append(v)
            print(f"  llama.cpp B={b}: {v:.2f} tok/s", flush=True)
    end = datetime.datetime.now(datetime.timezone.utc)

    rows = []
    for b in batches:
        o, t = statistics.median(ours[b]), statistics.median(theirs[b])
        per_round = " ".join(f"{x:.1f}" for x in ours[b]) + " / " + " ".join(f"{x:.1f}" for x in theirs[b])
        rows.append([b, f"{o:.2f}", f"{t:.2f}", f"{o / t:.2f}×", per_round])
    cmd = "python benchmarks/bench_batched.py " + " ".join(sys.argv[1:])
    lines = [
        "# Batched decode, ours vs llama.cpp (CPU)", "",
        f"`{cmd}`", "",
        f"**Conditions.** {start:%Y-%m-%d %H:%M} – {end:%H:%M} UTC, {os.cpu_count()} CPUs, {args.threads} threads on "
        f"both sides; load average (1 / 5 / 15 min) {load0} at the start, {load_average()} at the end; copy bandwidth "
        f"{' '.join(f'{x:.1f}' for x in bws)} GB/s (before each round). File: {args.model.name}; ours with "
        f"activations={args.activations}; {args.prompt_tokens} tokens of context per sequence, {args.new_tokens} "
        f"decode steps; medians of {args.rounds} interleaved rounds.", "",
        markdown_table(["B", "ours aggregate tok/s", "llama.cpp aggregate tok/s", "ours / llama.cpp",
                        "per round: ours / llama.cpp"], rows),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
