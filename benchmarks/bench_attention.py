"""Benchmark of the paged attention ops: paged_decode_attention at 512 and 4096 tokens of context,
paged_prefill_attention (a first prefill and a chunk after a cached prefix), reshape_and_cache — ours
vs the gather-then-softmax reference (mistral_kernels.reference). Mistral-7B head shapes (Hq 32,
Hkv 8, D 128), block_size 16, shuffled physical blocks. Prints a markdown table and writes it to
benchmarks/results/cpu_attention_<dtype>.md (CPU) or gpu_attention_<dtype>.md (--device cuda).

    python benchmarks/bench_attention.py [--dtype bf16|fp32|fp16] [--threads N] [--device cpu|cuda]

On a GPU (--device cuda) the calls are timed with CUDA events, the bandwidth column is relative to the
HBM bandwidth of a device copy measured in the same run, more decode batch sizes run, and prefill reports
TFLOP/s next to torch's scaled_dot_product_attention with the flash backend on the same (dense, causal)
shapes; the reference column is left out there.

Bytes are the compulsory ones: every visible K/V row read once, q read and out written once. Decode is
memory-bound, so its GB/s should approach the copy bandwidth; prefill is compute-bound (GFLOP/s column,
4·D FLOPs per visible (query head, key) pair).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DTYPES, bench_parser, command_line, copy_bandwidth_gbs, device_name,  # noqa: E402
                    device_time, markdown_table, median_time)

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
    flash: Flash | None = None


DEVICE = "cpu"  # set by main()


@dataclasses.dataclass
class Flash:
    """torch's SDPA (flash backend) on the dense causal equivalent of a first prefill (no paging)."""

    tokens: int
    dtype: torch.dtype

    def __call__(self) -> Callable[[], object]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        g = torch.Generator().manual_seed(self.tokens)
        q = torch.randn(1, HQ, self.tokens, D, generator=g).to(DEVICE, self.dtype)
        k = torch.randn(1, HKV, self.tokens, D, generator=g).to(DEVICE, self.dtype)
        v = torch.randn(1, HKV, self.tokens, D, generator=g).to(DEVICE, self.dtype)

        def run() -> object:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        return run


def _paged(seq_lens: list[int], dtype: torch.dtype, g: torch.Generator):
    need = [(n + S - 1) // S for n in seq_lens]
    n_blocks = sum(need)
    perm = torch.randperm(n_blocks, generator=g).int()
    tables = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used : used + n]
        used += n
    kc = torch.randn(n_blocks, S, HKV, D, generator=g).to(DEVICE, dtype)
    vc = torch.randn(n_blocks, S, HKV, D, generator=g).to(DEVICE, dtype)
    return kc, vc, tables.to(DEVICE), torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)


def decode_case(batch: int, ctx: int, dtype: torch.dtype, window: int | None = None) -> Case:
    g = torch.Generator().manual_seed(ctx + batch)
    kc, vc, tables, lens = _paged([ctx] * batch, dtype, g)
    q = torch.randn(batch, HQ, D, generator=g).to(DEVICE, dtype)
    out = torch.empty_like(q)
    es = q.element_size()
    visible = min(ctx, window or ctx)
    nbytes = batch * visible * HKV * D * 2 * es + 2 * q.numel() * es
    flops = 4 * batch * HQ * visible * D
    tag = f"B={batch} ctx={ctx}" + (f" W={window}" if window else "")
    return Case("paged_decode_attention", tag, nbytes, flops,
                lambda: ops.paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, window, out=out),
                lambda: ref.paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, window))


def prefill_case(new: int, cached: int, dtype: torch.dtype, batch: int = 1) -> Case:
    g = torch.Generator().manual_seed(new + cached)
    total = new + cached
    kc, vc, tables, lens = _paged([total] * batch, dtype, g)
    q = torch.randn(batch * new, HQ, D, generator=g).to(DEVICE, dtype)
    out = torch.empty_like(q)
    cu = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device=DEVICE)
    es = q.element_size()
    nbytes = batch * total * HKV * D * 2 * es + 2 * q.numel() * es
    pairs = batch * sum(cached + i + 1 for i in range(new))
    tag = f"new={new} cached={cached}" + (f" B={batch}" if batch > 1 else "")
    return Case("paged_prefill_attention", tag, nbytes, 4 * HQ * D * pairs,
                lambda: ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5, out=out),
                lambda: ref.paged_prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5),
                Flash(new, dtype) if cached == 0 and batch == 1 and dtype != torch.float32 else None)


def cache_case(tokens: int, dtype: torch.dtype) -> Case:
    g = torch.Generator().manual_seed(tokens)
    n_blocks = (tokens + S - 1) // S + 4
    kc = torch.zeros(n_blocks, S, HKV, D, dtype=dtype, device=DEVICE)
    vc = torch.zeros_like(kc)
    k = torch.randn(tokens, HKV, D, generator=g).to(DEVICE, dtype)
    v = torch.randn(tokens, HKV, D, generator=g).to(DEVICE, dtype)
    slots = torch.randperm(n_blocks * S, generator=g)[:tokens].to(DEVICE)
    return Case("reshape_and_cache", f"T={tokens}", 4 * k.numel() * k.element_size(), 0,
                lambda: ops.reshape_and_cache(k, v, kc, vc, slots),
                lambda: ref.reshape_and_cache(k, v, kc, vc, slots))


def main() -> None:
    global DEVICE
    parser = bench_parser(__doc__)
    parser.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    DEVICE = args.device
    gpu = torch.device(DEVICE).type == "cuda"
    dtype = DTYPES[args.dtype]
    if not gpu and dtype == torch.float16:
        parser.error("--dtype fp16 needs --device cuda (the CPU kernels take fp32 and bf16)")

    bw = copy_bandwidth_gbs(device=DEVICE)
    where = device_name(DEVICE)
    print(f"{where}: copy bandwidth {bw:.1f} GB/s, dtype: {dtype}")
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
    if gpu:
        cases[3:3] = [decode_case(32, 4096, dtype), decode_case(64, 1024, dtype), decode_case(1, 32768, dtype)]
        cases[-2:-2] = [prefill_case(4096, 0, dtype), prefill_case(512, 0, dtype, batch=64)]
    rows = []
    decode_4k_s = None
    for c in cases:
        t_ours = device_time(c.ours, DEVICE)
        gbs = c.nbytes / t_ours / 1e9
        gflops = c.flops / t_ours / 1e9
        if gpu:
            t_flash = device_time(c.flash(), DEVICE) if c.flash is not None else None
            flash_tf = c.flops / t_flash / 1e12 if t_flash else None
            rows.append([c.op, c.shape, t_ours * 1e6, gbs, 100 * gbs / bw, gflops / 1e3,
                         "—" if flash_tf is None else flash_tf])
            print(f"{c.op:24s} {c.shape:22s} ours {t_ours*1e6:9.1f} us  {gbs:7.1f} GB/s ({100*gbs/bw:5.1f}% HBM)  "
                  f"{gflops/1e3:6.1f} TFLOP/s  flash {flash_tf or 0:6.1f} TFLOP/s", flush=True)
        else:
            t_ref = median_time(c.reference, repeats=5)
            rows.append([c.op, c.shape, t_ours * 1e6, t_ref * 1e6, t_ref / t_ours, gbs, 100 * gbs / bw, gflops])
            print(f"{c.op:24s} {c.shape:22s} ours {t_ours*1e6:9.1f} us  ref {t_ref*1e6:9.1f} us  "
                  f"x{t_ref/t_ours:6.2f}  {gbs:6.1f} GB/s  {gflops:6.1f} GFLOP/s", flush=True)
        if c.op == "paged_decode_attention" and c.shape == "B=1 ctx=4096":
            decode_4k_s = t_ours
    if gpu:
        table = markdown_table(["op", "shape", "ours (us)", "GB/s", "% of HBM copy bw", "TFLOP/s",
                                "SDPA flash TFLOP/s"], rows)
    else:
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
    name = f"gpu_attention_{args.dtype}.md" if gpu else f"cpu_attention_{args.dtype}.md"
    (args.out / name).write_text(f"{command_line(__file__)}\n\n{where}, copy bandwidth {bw:.1f} GB/s, {dtype}\n\n"
                                 f"{table}\n{note}")


if __name__ == "__main__":
    main()
