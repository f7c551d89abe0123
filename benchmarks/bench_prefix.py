"""Prefix caching: time to first token of a request whose long prefix is cached vs not (SmolLM2, CPU).

    python benchmarks/bench_prefix.py [--dtype fp32|bf16] [--prefix-tokens 1000] [--suffix-tokens 24]
                                      [--repeats 5] [--out benchmarks/results/cpu_prefix.md]

One process, one loaded model, three engines' worth of requests (greedy, one new token, default engine
settings: block size 16, 512-token steps):
  off   an engine with prefix caching disabled: prefix + a fresh suffix, computed in full;
  miss  prefix caching on, a fresh random prefix each time (nothing to share: the cost of hashing);
  hit   prefix caching on, the same prefix (cached by a warm-up request) + a fresh suffix each time:
        only the suffix is computed.
TTFT = arrival → first token (``Completion.timings``), median over ``--repeats`` rounds of off / miss / hit
(interleaved). A miss evicts nothing the hit needs: the pool holds the prefix and a miss at once.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, command_line, dtypes, markdown_table  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.engine import Engine  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402

DTYPES = dtypes("fp32", "bf16")


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--suffix-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = ap.parse_args()

    llm = mistral_kernels.LLM(dtype=DTYPES[args.dtype])
    vocab = llm.model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def rand(n: int) -> list[int]:
        return torch.randint(100, min(vocab, 20000), (n,), generator=g).tolist()

    def ttft(engine: Engine, prompt: list[int]) -> float:
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=1, ignore_eos=True))
        first = engine.run([rid])[0].timings.time_to_first_token
        assert first is not None
        return first

    on = llm.engine
    off = Engine(llm.model, llm.tokenizer, num_blocks=on.blocks.num_blocks, block_size=on.blocks.block_size,
                 max_batch=on.max_batch, max_tokens_per_step=on.max_tokens_per_step, prefix_caching=False)
    prefix = rand(args.prefix_tokens)
    ttft(off, rand(args.prefix_tokens + args.suffix_tokens))  # warm-up
    ttft(on, prefix + rand(args.suffix_tokens))  # warm-up; caches the prefix
    times: dict[str, list[float]] = {"off": [], "miss": [], "hit": []}
    hit_tokens = 0
    for _ in range(args.repeats):  # interleaved, so that a busy machine slows the three alike
        times["off"].append(ttft(off, prefix + rand(args.suffix_tokens)))
        times["miss"].append(ttft(on, rand(args.prefix_tokens + args.suffix_tokens)))
        before = on.stats.prefix_hit_tokens
        times["hit"].append(ttft(on, prefix + rand(args.suffix_tokens)))
        hit_tokens += on.stats.prefix_hit_tokens - before
    cached_per_hit = hit_tokens / args.repeats
    med = {k: statistics.median(v) for k, v in times.items()}
    total = args.prefix_tokens + args.suffix_tokens
    rows = [
        ["prefix caching off", total, 0, med["off"] * 1e3, 1.0],
        ["on, prefix not cached (miss)", total, 0, med["miss"] * 1e3, med["off"] / med["miss"]],
        ["on, prefix cached (hit)", total, cached_per_hit, med["hit"] * 1e3, med["off"] / med["hit"]],
    ]
    table = markdown_table(["request", "prompt tokens", "cached tokens", "TTFT ms (median)", "speed-up vs off"],
                           rows)
    header = (f"SmolLM2-135M-Instruct, {args.dtype}, CPU ({torch.get_num_threads()} threads), "
              f"{args.prefix_tokens}-token shared prefix + {args.suffix_tokens}-token fresh suffix, 1 new token, "
              f"median of {args.repeats}; block size {on.blocks.block_size}, "
              f"{on.max_tokens_per_step}-token steps.\n\n")
    print(header + table)
    if args.out:
        args.out.write_text("# Prefix caching: time to first token (`benchmarks/bench_prefix.py`)\n\n"
                            + command_line(__file__) + "\n\n" + header + table
                            + "\n")


if __name__ == "__main__":
    main()
