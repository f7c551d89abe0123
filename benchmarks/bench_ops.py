"""CPU op benchmark: our native kernels vs the torch-eager references, at Mistral-7B / Mixtral-8x7B /
SmolLM2 shapes. Prints a markdown table (median time, speed-up, achieved GB/s, % of the measured copy
bandwidth) and writes it plus a PNG plot to benchmarks/results/.

    python benchmarks/bench_ops.py [--dtype bf16|fp32] [--threads N] [--only NAME]

Bytes moved are the compulsory ones (each input read once, each output written once); memory-bound ops
should approach the copy bandwidth.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, command_line, copy_bandwidth_gbs, markdown_table, median_time  # noqa: E402

from mistral_kernels import ops, reference as ref  # noqa: E402

# Model shapes: hidden H, intermediate I, heads Hq / Hkv, head_dim D.
SHAPES = {
    "mistral-7b": dict(H=4096, I=14336, Hq=32, Hkv=8, D=128),
    "smollm2-135m": dict(H=576, I=1536, Hq=9, Hkv=3, D=64),
}


@dataclasses.dataclass
class Case:
    op: str
    shape: str
    nbytes: int
    ours: Callable[[], object]
    reference: Callable[[], object]
    memory_bound: bool = True


def norm_cases(dtype: torch.dtype, tokens: int) -> list[Case]:
    cases = []
    es = torch.tensor([], dtype=dtype).element_size()
    for model, s in SHAPES.items():
        H, I = s["H"], s["I"]
        x = torch.randn(tokens, H, dtype=dtype)
        w = torch.randn(H, dtype=dtype)
        out = torch.empty_like(x)
        res = torch.randn(tokens, H, dtype=dtype)
        xi = torch.randn(tokens, 2 * I, dtype=dtype)
        oi = torch.empty(tokens, I, dtype=dtype)
        tag = f"{model} T={tokens}"
        cases += [
            Case("rms_norm", tag, 2 * x.numel() * es, lambda x=x, w=w, o=out: ops.rms_norm(x, w, 1e-5, out=o),
                 lambda x=x, w=w: ref.rms_norm(x, w, 1e-5)),
            Case("fused_add_rms_norm", tag, 4 * x.numel() * es,
                 lambda x=x, w=w, r=res: ops.fused_add_rms_norm(x, r, w, 1e-5),
                 lambda x=x, w=w, r=res: ref.fused_add_rms_norm(x, r, w, 1e-5)),
            Case("silu_and_mul", tag, 3 * oi.numel() * es, lambda xi=xi, oi=oi: ops.silu_and_mul(xi, out=oi),
                 lambda xi=xi: ref.silu_and_mul(xi)),
        ]
    return cases


def rope_cases(dtype: torch.dtype, tokens: int) -> list[Case]:
    cases = []
    es = torch.tensor([], dtype=dtype).element_size()
    for model, s in SHAPES.items():
        Hq, Hkv, D = s["Hq"], s["Hkv"], s["D"]
        cache = ops.rope_cos_sin_cache(8192, D, 1e6)
        pos = torch.randint(0, 8192, (tokens,))
        q = torch.randn(tokens, Hq, D, dtype=dtype)
        k = torch.randn(tokens, Hkv, D, dtype=dtype)
        nbytes = 2 * (q.numel() + k.numel()) * es + tokens * D * 4
        cases.append(Case("rotary_embedding", f"{model} T={tokens}", nbytes,
                          lambda q=q, k=k, pos=pos, c=cache: ops.rotary_embedding(pos, q, k, c, True),
                          lambda q=q, k=k, pos=pos, c=cache: ref.rotary_embedding(pos, q, k, c, True)))
    return cases


def attention_cases(dtype: torch.dtype, tokens: int) -> list[Case]:
    """Mistral-7B attention (Hq 32, Hkv 8, D 128, block 16): the cases of bench_attention.py."""
    import bench_attention as ba

    cases = [ba.cache_case(tokens, dtype), ba.decode_case(1, 512, dtype), ba.decode_case(1, 4096, dtype),
             ba.decode_case(8, 512, dtype), ba.prefill_case(tokens, 0, dtype)]
    return [Case(c.op, f"mistral-7b {c.shape}", c.nbytes, c.ours, c.reference, memory_bound=c.op != "paged_prefill_attention")
            for c in cases]


def moe_cases(dtype: torch.dtype, tokens: int) -> list[Case]:
    """Mixtral-shaped MoE (H 1024, I 3584, E 8, k 2 — Mixtral-8x7B's E/k with machine-sized H/I) and 64 experts."""
    import bench_moe as bm

    cases = []
    es = torch.tensor([], dtype=dtype).element_size()
    for name, s in bm.SHAPES.items():
        H, I, E, k = s["H"], s["I"], s["E"], s["k"]
        gate, w1, w2, w3 = bm.make_weights(H, I, E, dtype)
        g = torch.Generator().manual_seed(1)
        for T in (1, tokens):
            x = torch.randn(T, H, generator=g).to(dtype)
            logits = torch.randn(T, E, generator=g)
            w, ids = ref.topk_softmax(logits, k)
            perm, _, inv = ref.moe_permute(x, ids, E)
            used = len(set(ids.flatten().tolist()))
            tag = f"{name} T={T}"
            cases += [
                Case("topk_softmax", tag, logits.numel() * 4 + ids.numel() * 8,
                     lambda l=logits, k=k: ops.topk_softmax(l, k), lambda l=logits, k=k: ref.topk_softmax(l, k)),
                Case("moe_permute", tag, 2 * T * k * H * es, lambda x=x, ids=ids, E=E: ops.moe_permute(x, ids, E),
                     lambda x=x, ids=ids, E=E: ref.moe_permute(x, ids, E)),
                Case("moe_unpermute", tag, (T * k + T) * H * es, lambda p=perm, w=w, inv=inv: ops.moe_unpermute(p, w, inv),
                     lambda p=perm, w=w, inv=inv: ref.moe_unpermute(p, w, inv)),
                Case("fused_moe", tag, used * 3 * H * I * es,
                     lambda x=x, ws=(gate, w1, w2, w3), k=k: ops.fused_moe(x, *ws, k),
                     lambda x=x, ws=(gate, w1, w2, w3), k=k: ref.fused_moe(x, *ws, k),
                     memory_bound=T == 1),
            ]
    return cases


CASE_BUILDERS: dict[str, Callable[[torch.dtype, int], list[Case]]] = {
    "norm": norm_cases,
    "rope": rope_cases,
    "attention": attention_cases,
    "moe": moe_cases,
}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", default=None, help="run only case groups whose name contains this")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth: {bw:.1f} GB/s, threads: {torch.get_num_threads()}, dtype: {dtype}")
    rows = []
    for group, build in CASE_BUILDERS.items():
        if args.only and args.only not in group:
            continue
        for c in build(dtype, args.tokens):
            t_ours = median_time(c.ours)
            t_ref = median_time(c.reference)
            gbs = c.nbytes / t_ours / 1e9
            pct = 100 * gbs / bw if c.memory_bound else float("nan")
            # CPU targets (benchmarks/results/cpu_summary.md): ≥ 3× the eager reference; ≥ 70 % of copy bandwidth where memory-bound
            # (judged only for ≥ 4 MB moved: smaller cases are latency-bound, not bandwidth-bound).
            missed = [f"x{t_ref / t_ours:.1f} < 3"] if t_ref / t_ours < 3 else []
            if c.memory_bound and c.nbytes >= 4 << 20 and pct < 70:
                missed.append(f"{pct:.0f}% < 70% bw")
            rows.append([c.op, c.shape, t_ours * 1e6, t_ref * 1e6, t_ref / t_ours, gbs, pct,
                         "MISSED: " + ", ".join(missed) if missed else "met"])
            print(f"{c.op:24s} {c.shape:24s} ours {t_ours*1e6:9.1f} us  ref {t_ref*1e6:9.1f} us  "
                  f"x{t_ref/t_ours:5.2f}  {gbs:6.1f} GB/s", flush=True)
    table = markdown_table(["op", "shape", "ours (us)", "reference (us)", "speed-up", "GB/s", "% of copy bw", "target"], rows)
    print()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"cpu_ops_{args.dtype}.md").write_text(
        f"{command_line(__file__)}\n\ncopy bandwidth {bw:.1f} GB/s, {torch.get_num_threads()} threads, {dtype}\n\n"
        f"{table}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    labels = [f"{r[0]} [{r[1]}]" for r in rows]
    ax.barh(labels, [r[4] for r in rows])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("speed-up vs torch-eager reference")
    ax.set_title(f"mistral-kernels CPU ops ({dtype}, {torch.get_num_threads()} threads)")
    fig.tight_layout()
    fig.savefig(args.out / f"cpu_ops_{args.dtype}.png", dpi=100)


if __name__ == "__main__":
    main()
