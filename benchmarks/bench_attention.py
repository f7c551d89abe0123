"""CPU benchmark of the paged attention ops: paged_decode_attention at 512 and 4096 tokens of context,
paged_prefill_attention (a first prefill and a chunk after a cached prefix), reshape_and_cache — ours
vs the gather-then-softmax reference (mistral_kernels.reference). Mistral-7B head shapes (Hq 32,
Hkv 8, D 128), block_size 16, shuffled physical blocks. Prints a markdown table and writes it to
benchmarks/results/bench_attention_<dtype>.md.

    python benchmarks/bench_attention.py [--dtype bf16|fp32] [--threads N]

Bytes are the compulsory ones: every visible K/V row read once, q read and out written once. Decode is
memory-bound, so its GB/s should approach the copy bandwidth; prefill is compute-bound (GFLOP/s column,
4·D FLOPs per visible (query head, key) pair).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbs, markdown_table, median_time  # noqa: E402

from mistral_kernels import ops, reference as ref  # noqa: E402

HQ, HKV, D, S = 32, 8, 128, 16  # Mistral 7B attention, block_size 16
LAYER_WEIGHT_BYTES_BF16 = 2 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)  # one Mistral-7B layer


@dataclasses.dataclass
class Case:
    op: str
    shape: str
    nbytes: int
    flops: int
    ours: Callable[[], object]
    reference: Callable[[], object]


def _paged(seq_lens: list[int], dtype: torch.dtype, g: torch.Generator):
    need = [(n + S - 1) // S for n in seq_lens]
    n_blocks = sum(need)
    perm = torch.randperm(n_blocks, generator=g).int()
    tables = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used : used + n]
        used += n
    kc = torch.randn(n_blocks, S, HKV, D, generator=g).to(dtype)
    vc = torch.randn(n_blocks, S, HKV, D, generator=g).to(dtype)
    return kc, vc, tables, torch.tensor(seq_lens, dtype=torch.int32)


def decode_case(batch: int, ctx: int, dtype: torch.dtype, window: int | None = None) -> Case:
    g = torch.Generator().manual_seed(ctx + batch)
    kc, vc, tables, lens = _paged([ctx] * batch, dtype, g)
    q = torch.randn(batch, HQ, D, generator=g).to(dtype)
    out = torch.empty_like(q)
    es = q.element_size()
    visible = min(ctx, window or ctx)
    nbytes = batch * visible * HKV * D * 2 * es + 2 * q.numel() * es
    flops = 4 * batch * HQ * visible * D
    tag = f"B={batch} ctx={ctx}" + (f" W={window}" if window else "")
    return Case("paged_decode_attention", tag, nbytes, flops,
                lambda: ops.paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, window, out=out),
                lambda: ref.paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, window))


def prefill_case(new: int, cached: int, dtype: torch.dtype) -> Case:
    g = torch.Generator().manual_seed(new + cached)
    total = new + cached
    kc, vc, tables, lens = _paged([total], dtype, g)
    q = torch.randn(new, HQ, D, generator=g).to(dtype)
    out = torch.empty_like(q)
    cu = torch.tensor([0, new], dtype=torch.int32)
    es = q.element_size()
    nbytes = total * HKV * D * 2 * es + 2 * q.numel() * es
    pairs = sum(cached + i + 1 for i in range(new))
    return Case("paged_prefill_attention", f"new={new} cached={cached}", nbytes, 4 * HQ * D * pairs,
                lambda: ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5, out=out),
                lambda: ref.paged_prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5))


def cache_case(tokens: int, dtype: torch.dtype) -> Case:
    g = torch.Generator().manual_seed(tokens)
    n_blocks = (tokens + S - 1) // S + 4
    kc = torch.zeros(n_blocks, S, HKV, D, dtype=dtype)
    vc = torch.zeros_like(kc)
    k = torch.randn(tokens, HKV, D, generator=g).to(dtype)
    v = torch.randn(tokens, HKV, D, generator=g).to(dtype)
    slots = torch.randperm(n_blocks * S, generator=g)[:tokens]
    return Case("reshape_and_cache", f"T={tokens}", 4 * k.numel() * k.element_size(), 0,
                lambda: ops.reshape_and_cache(k, v, kc, vc, slots),
                lambda: ref.reshape_and_cache(k, v, kc, vc, slots))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth: {bw:.1f} GB/s, threads: {torch.get_num_threads()}, dtype: {dtype}")
    cases = [
        decode_case(1, 512, dtype),
        decode_case(1, 4096, dtype),
        decode_case(4, 4096, dtype),
        decode_case(1, 4096, dtype, window=1024),
        prefill_case(512, 0, dtype),
        prefill_case(128, 2048, dtype),
        cache_case(1, dtype),
        cache_case(512, dtype),
    ]
    rows = []
    decode_4k_s = None
    for c in cases:
        t_ours = median_time(c.ours)
        t_ref = median_time(c.reference, repeats=5)
        gbs = c.nbytes / t_ours / 1e9
        gflops = c.flops / t_ours / 1e9
        rows.append([c.op, c.shape, t_ours * 1e6, t_ref * 1e6, t_ref / t_ours, gbs, 100 * gbs / bw, gflops])
        if c.op == "paged_decode_attention" and c.shape == "B=1 ctx=4096":
            decode_4k_s = t_ours
        print(f"{c.op:24s} {c.shape:22s} ours {t_ours*1e6:9.1f} us  ref {t_ref*1e6:9.1f} us  "
              f"x{t_ref/t_ours:6.2f}  {gbs:6.1f} GB/s  {gflops:6.1f} GFLOP/s", flush=True)
    table = markdown_table(["op", "shape", "ours (us)", "reference (us)", "speed-up", "GB/s", "% of copy bw",
                            "GFLOP/s"], rows)
    note = ""
    if decode_4k_s is not None:
        weights_s = LAYER_WEIGHT_BYTES_BF16 / (bw * 1e9)
        note = (f"\nMistral-7B decode at 4k context, per layer: attention {decode_4k_s*1e6:.0f} us vs "
                f"{weights_s*1e6:.0f} us to stream the layer's bf16 weights at copy bandwidth "
                f"(attention share ≈ {100 * decode_4k_s / (decode_4k_s + weights_s):.0f}%).\n")
    print()
    print(table)
    print(note)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"bench_attention_{args.dtype}.md").write_text(
        f"copy bandwidth {bw:.1f} GB/s, {torch.get_num_threads()} threads, {dtype}\n\n{table}\n{note}")


if __name__ == "__main__":
    main()
