"""Long-prompt prefill on the CPU: ours vs llama.cpp's ``llama-bench`` on the same GGUF file and thread count, in
one sitting (interleaved rounds, medians), with the FLOP bound.

    python benchmarks/bench_prefill_long.py --llama-bin DIR [--model FILE.gguf] [--lengths 512,2048,8192]
                                            [--threads 2] [--rounds 3] [--chunk 512] [--out FILE]
                                            [--baseline-library OLD/_C.so]
    python benchmarks/bench_prefill_long.py --profile N      # where one N-token prefill of ours spends its time

- **ours**: one engine request of N random token ids (as llama-bench's prompt is random tokens), one new token
  (sampled from the last prefill chunk: no decode step), prefix caching off; prompt tok/s = N / wall time of
  ``Engine.run``. The engine cuts the prompt into chunks of ``--chunk`` tokens (its ``max_tokens_per_step``,
  default 512, the engine's default).
- **llama-bench**: ``-p N -n 0 -r 1 -t THREADS -o jsonl`` (its defaults otherwise: batch 2048, ubatch 512).
- ``--baseline-library``: also ours with another build of the native library (e.g. the previous commit's), run
  in a child process of this script (``MISTRAL_KERNELS_LIBRARY``; model loading not timed), same prompts.
- Each round runs every length, ours (then the baseline) then llama-bench; the table gives the medians and every round.
- **Bound**: the prefill's FLOPs — 2 · (the layers' matrix weights) · N for the projections (the LM head once,
  for the sampled row), 2 · N² · head_dim · n_heads per layer for causal attention (QKᵀ and P·V, N²/2 pairs
  each) — over this machine's measured fp32 peak: the best of a few ``torch.mm`` fp32 2048³ GEMMs (MKL) at the
  same thread count, measured before every round; "% of peak" = achieved FLOP/s / that peak.
- ``--profile N``: one prefill of N tokens under ``torch.profiler`` (CPU), the ops' self time, and nothing else.
- The load average (``os.getloadavg``) at the start and the end of every round is printed: on a shared machine
  other jobs take cores from both sides alike, which the interleaving spreads over both.

Not part of the test suite; ``Command:`` in the output names the run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, command_line, markdown_table  # noqa: E402
from llamacpp_output import parse_bench_jsonl  # noqa: E402

from mistral_kernels import LLM  # noqa: E402
from mistral_kernels.config import ModelConfig  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402
from mistral_kernels.sampling_params import SamplingParams  # noqa: E402


def prefill_flops(cfg: ModelConfig, n: int) -> tuple[float, float]:
    """(projection FLOPs, attention FLOPs) of one prefill of n tokens (see the module docstring)."""
    h, d, hq, hkv, i = cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim
    per_layer = h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * i
    proj = 2.0 * cfg.n_layers * per_layer * n + 2.0 * h * cfg.vocab_size
    attn = 2.0 * n * n * d * hq * cfg.n_layers
    return proj, attn


def fp32_peak_gflops() -> float:
    """Best GFLOP/s of five fp32 2048³ GEMMs (torch.mm) at torch's thread count."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * 2048**3 / best / 1e9


def ours_len(llm: LLM, n: int) -> int:
    """The prompt length ours runs for llama-bench's n: n, or max_position - 1 (the sampled token needs one more
    position; llama-bench -p 8192 fills an 8192-token context exactly)."""
    return min(n, llm.model.config.max_position - 1)


def ours_tok_per_s(llm: LLM, n: int, seed: int) -> float:
    n = ours_len(llm, n)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, llm.model.config.vocab_size - 100, (n,), generator=g).tolist()
    engine = llm.engine
    t0 = time.perf_counter()
    rid = engine.add_request(ids, SamplingParams(max_new_tokens=1, ignore_eos=True))
    engine.run([rid])
    return n / (time.perf_counter() - t0)


def baseline_tok_per_s(library: Path, args: argparse.Namespace, n: int, seed: int) -> float:
    """ours_tok_per_s in a child process that loads ``library``."""
    cmd = [sys.executable, __file__, "--ours-only", str(n), "--seed", str(seed), "--threads", str(args.threads),
           "--chunk", str(args.chunk), "--llama-bin", str(args.llama_bin)]
    if args.model:
        cmd += ["--model", str(args.model)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env={**os.environ, "MISTRAL_KERNELS_LIBRARY": str(library)}).stdout
    return float(out.strip().splitlines()[-1])


def llama_tok_per_s(binary: Path, model: Path, n: int, threads: int) -> tuple[float, str]:
    out = subprocess.run([str(binary), "-m", str(model), "-p", str(n), "-n", "0", "-r", "1", "-t", str(threads),
                          "-o", "jsonl"], capture_output=True, text=True, check=True).stdout
    (r,) = parse_bench_jsonl(out)
    return r.avg_ts, f"{r.build_commit} ({r.cpu_info})"


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--llama-bin", type=Path, default=os.environ.get("LLAMA_CPP_BIN"),
                    help="directory of llama-bench (env LLAMA_CPP_BIN)")
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: the default model)")
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=512, help="the engine's max_tokens_per_step")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here (default: stdout)")
    ap.add_argument("--baseline-library", type=Path, default=None, help="another _C library to compare with")
    ap.add_argument("--profile", type=int, default=0, help="profile one prefill of N tokens of ours and exit")
    ap.add_argument("--ours-only", type=int, default=0, help=argparse.SUPPRESS)  # the baseline's child process
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_bin is None and not args.profile:
        ap.error("--llama-bin DIR (or LLAMA_CPP_BIN) is required: where llama-bench is")
    model = args.model or default_model_path()
    lengths = [int(x) for x in args.lengths.split(",")]
    torch.set_num_threads(args.threads)
    llm = LLM(model, max_batch=1, prefix_caching=False, max_tokens_per_step=args.chunk)
    cfg = llm.model.config
    ours_tok_per_s(llm, 256, seed=0)  # warm-up
    if args.ours_only:
        print(ours_tok_per_s(llm, args.ours_only, seed=args.seed))
        return
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        load = os.getloadavg()[0]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            tps = ours_tok_per_s(llm, args.profile, seed=1)
        print(f"{command_line(__file__)}\n{ours_len(llm, args.profile)} tokens: {tps:.1f} tok/s, load average "
              f"{load:.1f} / {os.getloadavg()[0]:.1f}, {args.threads} threads")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        return
    ours: dict[int, list[float]] = {n: [] for n in lengths}
    llama: dict[int, list[float]] = {n: [] for n in lengths}
    base: dict[int, list[float]] = {n: [] for n in lengths}
    peaks, loads, build = [], [], ""
    start = datetime.datetime.now(datetime.timezone.utc)

    def report() -> str:
        """The markdown report of the rounds so far (written after every round: a cut run keeps them)."""
        peak = statistics.median(peaks)
        rows = []
        for n in lengths:
            o, lc = statistics.median(ours[n]), statistics.median(llama[n])
            proj, attn = prefill_flops(cfg, n)
            flops = proj + attn
            name = f"{n}" if ours_len(llm, n) == n else f"{n} (ours {ours_len(llm, n)})"
            rows.append([name, f"{o:.1f}", f"{lc:.1f}", f"{o / lc:.2f}", f"{ours_len(llm, n) / o:.1f}",
                         f"{flops / 1e12:.2f} ({100 * attn / flops:.0f} % attention)", f"{flops / peak / 1e9:.1f}",
                         f"{100 * flops * o / n / (peak * 1e9):.0f} %", f"{100 * flops * lc / n / (peak * 1e9):.0f} %",
                         " ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(ours[n], llama[n], strict=True))]
                        + ([f"{statistics.median(base[n]):.1f}", " ".join(f"{b:.0f}" for b in base[n])]
                           if base[n] else []))
        lines = [
            "# CPU long-prompt prefill: ours vs llama-bench", "",
            command_line(__file__), "",
            f"Date {start:%Y-%m-%d %H:%M} UTC; {platform.processor() or platform.machine()}, {os.cpu_count()} logical "
            f"CPUs; {args.threads} threads on both sides; model {model.name}; ours: engine chunks of {args.chunk} "
            f"tokens, fp32 activations (the model's default dtype), prefix caching off; llama-bench build {build}.",
            f"Load average (1 min) at the start / end of each round: "
            + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in loads)
            + " — the machine is shared with other jobs, which slow both sides; rounds interleave ours and "
            "llama.cpp.",
            f"Measured fp32 peak (best torch.mm 2048³ per round, median over rounds): {peak:.0f} GFLOP/s "
            f"(rounds: {', '.join(f'{p:.0f}' for p in peaks)}).",
            (f"Baseline: ours with {args.baseline_library} (child process, same prompts)."
             if args.baseline_library else ""),
            "",
            markdown_table(["N", "ours tok/s", "llama-bench tok/s", "ours / llama", "ours s", "prefill TFLOP",
                            "bound s (at peak)", "ours % of peak", "llama % of peak", "per round ours/llama tok/s"]
                           + (["baseline tok/s", "per round baseline"] if args.baseline_library else []), rows),
        ]
        text = "\n".join(lines) + "\n"
        if args.out:
            args.out.write_text(text)
        return text

    for r in range(args.rounds):
        l0 = os.getloadavg()[0]
        peaks.append(fp32_peak_gflops())
        for n in lengths:
            ours[n].append(ours_tok_per_s(llm, n, seed=r + 1))
            if args.baseline_library:
                base[n].append(baseline_tok_per_s(args.baseline_library, args, n, seed=r + 1))
            ts, build = llama_tok_per_s(args.llama_bin / "llama-bench", model, n, args.threads)
            llama[n].append(ts)
            print(f"round {r}: N={n} ours {ours[n][-1]:.1f} tok/s, baseline {base[n][-1] if base[n] else 0:.1f}, "
                  f"llama-bench {ts:.1f} tok/s", file=sys.stderr)
        loads.append((l0, os.getloadavg()[0]))
        report()
    print(report())


if __name__ == "__main__":
    main()
