"""CPU MoE benchmark: ops.fused_moe vs transformers' MixtralSparseMoeBlock vs reference.fused_moe, plus the
router / permute / unpermute ops vs their references. Decode (T = 1) and prefill (T = 512).

    python benchmarks/bench_moe.py [--dtype bf16|fp32] [--threads N] [--tokens 1,512]

Shapes are Mixtral-like but sized for this machine (a real Mixtral layer is 2.8 GB of bf16 experts):
  mixtral-mini  H=1024, I=3584, E=8,  k=2   (Mixtral's ratios I/H = 3.5, E, k)
  many-experts  H=512,  I=1024, E=64, k=6
Bounds: decode streams the k touched experts' weights once → bytes = k·3·I·H·sizeof(T) + gate (reported as
GB/s and % of the measured copy bandwidth); prefill is compute: FLOPs = 2·T·k·3·I·H (reported as GFLOP/s).
Times are medians after warm-up, measured in one process run; the reference loops over tokens in Python, so
its prefill is timed with few repeats.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbs, markdown_table, median_time  # noqa: E402

from mistral_kernels import ops, reference as ref  # noqa: E402

# T tokens, H hidden, I intermediate, E experts, k top-k.
SHAPES = {
    "mixtral-mini": dict(H=1024, I=3584, E=8, k=2),
    "many-experts": dict(H=512, I=1024, E=64, k=6),
}


def make_weights(H: int, I: int, E: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    gate = torch.randn(E, H, generator=g) / H**0.5
    w1 = torch.randn(E, I, H, generator=g) / H**0.5
    w3 = torch.randn(E, I, H, generator=g) / H**0.5
    w2 = torch.randn(E, H, I, generator=g) / I**0.5
    return tuple(w.to(dtype) for w in (gate, w1, w2, w3))


def transformers_block(gate: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor,
                       k: int) -> MixtralSparseMoeBlock:
    E, I, H = w1.shape
    config = MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k,
                           experts_implementation="eager")
    block = MixtralSparseMoeBlock(config).eval().to(gate.dtype)
    with torch.no_grad():
        block.gate.weight.copy_(gate)
        block.experts.gate_up_proj.copy_(torch.cat([w1, w3], dim=1))
        block.experts.down_proj.copy_(w2)
    return block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--tokens", default="1,512", help="comma-separated token counts")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    es = torch.tensor([], dtype=dtype).element_size()
    token_counts = [int(t) for t in args.tokens.split(",")]

    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth: {bw:.1f} GB/s, threads: {torch.get_num_threads()}, dtype: {dtype}")
    block_rows, op_rows = [], []
    torch.set_grad_enabled(False)
    for name, s in SHAPES.items():
        H, I, E, k = s["H"], s["I"], s["E"], s["k"]
        gate, w1, w2, w3 = make_weights(H, I, E, dtype)
        block = transformers_block(gate, w1, w2, w3, k)
        for T in token_counts:
            x = torch.randn(T, H, generator=torch.Generator().manual_seed(T)).to(dtype)
            # Relative error: in bf16 a few tokens may tie at the top-k boundary and route differently.
            hf = block(x[None])[0].float()
            diff = ((ops.fused_moe(x, gate, w1, w2, w3, k).float() - hf).norm() / hf.norm()).item()
            t_ours = median_time(lambda: ops.fused_moe(x, gate, w1, w2, w3, k))
            t_hf = median_time(lambda: block(x[None]))
            slow = T > 16
            t_ref = median_time(lambda: ref.fused_moe(x, gate, w1, w2, w3, k), warmup=1 if slow else 3,
                                repeats=3 if slow else 15, min_time=0.0 if slow else 0.2)
            if T == 1:
                bound = f"{k * 3 * I * H * es / t_ours / 1e9:.1f} GB/s ({100 * k * 3 * I * H * es / t_ours / 1e9 / bw:.0f}% bw)"
            else:
                bound = f"{2 * T * k * 3 * I * H / t_ours / 1e9:.1f} GFLOP/s"
            block_rows.append([name, T, t_ours * 1e3, t_hf * 1e3, t_ref * 1e3, t_hf / t_ours, t_ref / t_ours, bound,
                               f"{diff:.1e}"])
            print(f"fused_moe {name:13s} T={T:4d}  ours {t_ours*1e3:8.3f} ms  transformers {t_hf*1e3:8.3f} ms  "
                  f"reference {t_ref*1e3:9.3f} ms  {bound}", flush=True)

        # The individual ops at prefill size.
        T = max(token_counts)
        logits = torch.randn(T, E).to(dtype)
        w, ids = ops.topk_softmax(logits, k)
        x = torch.randn(T, H).to(dtype)
        permuted, _, inv = ops.moe_permute(x, ids, E)
        cases = [
            ("topk_softmax", lambda: ops.topk_softmax(logits, k), lambda: ref.topk_softmax(logits, k)),
            ("moe_permute", lambda: ops.moe_permute(x, ids, E), lambda: ref.moe_permute(x, ids, E)),
            ("moe_unpermute", lambda: ops.moe_unpermute(permuted, w, inv), lambda: ref.moe_unpermute(permuted, w, inv)),
        ]
        for op, ours, reference in cases:
            t_o, t_r = median_time(ours), median_time(reference)
            op_rows.append([op, f"{name} T={T}", t_o * 1e6, t_r * 1e6, t_r / t_o])
            print(f"{op:14s} {name:13s} T={T}  ours {t_o*1e6:8.1f} us  reference {t_r*1e6:8.1f} us", flush=True)

    table1 = markdown_table(["shape", "T", "ours (ms)", "transformers (ms)", "reference (ms)", "vs transformers",
                             "vs reference", "achieved", "‖ours − transformers‖ / ‖transformers‖"], block_rows)
    table2 = markdown_table(["op", "shape", "ours (us)", "reference (us)", "speed-up"], op_rows)
    header = f"copy bandwidth {bw:.1f} GB/s, {torch.get_num_threads()} threads, {dtype}"
    print(f"\n{header}\n\n{table1}\n\n{table2}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"bench_moe_{args.dtype}.md").write_text(f"{header}\n\n{table1}\n\n{table2}\n")


if __name__ == "__main__":
    main()
