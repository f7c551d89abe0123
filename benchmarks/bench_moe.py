"""MoE benchmark. CPU (default): ops.fused_moe vs transformers' MixtralSparseMoeBlock vs reference.fused_moe,
plus the router / permute / unpermute ops vs their references. Decode (T = 1) and prefill (T = 512).

    python benchmarks/bench_moe.py [--dtype bf16|fp32] [--threads N] [--tokens 1,512]
    python benchmarks/bench_moe.py --device cuda [--dtype bf16|fp16|fp32] [--tokens 1,4,16,64,512,4096]

GPU (--device cuda): real Mixtral-8x7B layer shapes (H 4096, I 14336, E 8, k 2), every call timed with CUDA
events. Per T: ops.fused_moe (router GEMM, softmax / top-k, permute, experts, unpermute), ops.moe_expert_ffn
(the expert GEMMs alone over the permuted segments) and the dense torch equivalent of the latter
(per-expert torch.matmul over the same segments, the segment bounds read on the host before timing).
Decode (T ≤ 64) reports the % of HBM bandwidth, the bandwidth measured by a 1 GiB device copy in the same
run; the bytes are the weights of the experts the routing touches, read once (plus the gate). Prefill
reports TFLOP/s = 2·T·k·3·I·H / time. Written to benchmarks/results/gpu_moe_<dtype>.md.

Shapes are Mixtral-like but sized for this machine (a real Mixtral layer is 2.8 GB of bf16 experts):
  mixtral-mini  H=1024, I=3584, E=8,  k=2   (Mixtral's ratios I/H = 3.5, E, k)
  many-experts  H=512,  I=1024, E=64, k=6
Bounds: decode streams the k touched experts' weights once → bytes = k·3·I·H·sizeof(T) + gate (reported as
GB/s and % of the measured copy bandwidth); prefill is compute: FLOPs = 2·T·k·3·I·H (reported as GFLOP/s).
Times are medians after warm-up, measured in one process run; the reference loops over tokens in Python, so
its prefill is timed with few repeats.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (DTYPES, bench_parser, command_line, copy_bandwidth_gbs, device_name,  # noqa: E402
                    device_time, markdown_table, median_time)

from mistral_kernels import ops, reference as ref  # noqa: E402

# T tokens, H hidden, I intermediate, E experts, k top-k.
SHAPES = {
    "mixtral-mini": dict(H=1024, I=3584, E=8, k=2),
    "many-experts": dict(H=512, I=1024, E=64, k=6),
}
GPU_SHAPES = {"mixtral-8x7b": dict(H=4096, I=14336, E=8, k=2)}
GPU_DECODE_MAX_T = 64  # up to here a step is weight-streaming (reported as % of HBM bandwidth)


def make_weights(H: int, I: int, E: int, dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device).manual_seed(0)
    gate = torch.randn(E, H, generator=g, device=device) / H**0.5
    w1 = (torch.randn(E, I, H, generator=g, device=device) / H**0.5).to(dtype)
    w3 = (torch.randn(E, I, H, generator=g, device=device) / H**0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g, device=device) / I**0.5).to(dtype)
    return gate.to(dtype), w1, w2, w3


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


def torch_experts(permuted: torch.Tensor, bounds: list[int], w1: torch.Tensor, w2: torch.Tensor,
                  w3: torch.Tensor) -> torch.Tensor:
    """The dense torch equivalent of moe_expert_ffn: per non-empty segment e, torch.matmul with expert e."""
    y = torch.empty_like(permuted)
    for e in range(len(bounds) - 1):
        r0, r1 = bounds[e], bounds[e + 1]
        if r1 == r0:
            continue
        a = permuted[r0:r1]
        act = torch.nn.functional.silu(torch.matmul(a, w1[e].T)) * torch.matmul(a, w3[e].T)
        y[r0:r1] = torch.matmul(act, w2[e].T)
    return y


def run_device(device: str, dtype: torch.dtype, token_counts: list[int], shapes: dict[str, dict[str, int]],
               out_dir: Path | None, tag: str) -> str:
    """The GPU table (also runs on the CPU with tiny shapes, to check the script without a GPU)."""
    es = torch.tensor([], dtype=dtype).element_size()
    bw = copy_bandwidth_gbs(device=device)
    header = f"{command_line(__file__)}\n\n{device_name(device)}: copy bandwidth {bw:.0f} GB/s, {dtype}"
    print(header, flush=True)
    rows = []
    torch.set_grad_enabled(False)
    for name, s in shapes.items():
        H, I, E, k = s["H"], s["I"], s["E"], s["k"]
        gate, w1, w2, w3 = make_weights(H, I, E, dtype, device)
        for T in token_counts:
            x = torch.randn(T, H, generator=torch.Generator().manual_seed(T)).to(dtype).to(device)
            _, ids = ops.topk_softmax(torch.matmul(x, gate.T), k)
            permuted, offsets, _ = ops.moe_permute(x, ids, E)
            bounds = offsets.tolist()  # host sync, outside the timed calls
            touched = sum(b > a for a, b in zip(bounds, bounds[1:]))
            ffn = ops.moe_expert_ffn(permuted, offsets, w1, w2, w3)
            dense = torch_experts(permuted, bounds, w1, w2, w3)
            diff = ((ffn.float() - dense.float()).norm() / dense.float().norm().clamp_min(1e-30)).item()
            t_fused = device_time(lambda: ops.fused_moe(x, gate, w1, w2, w3, k), device)
            t_ffn = device_time(lambda: ops.moe_expert_ffn(permuted, offsets, w1, w2, w3), device)
            t_torch = device_time(lambda: torch_experts(permuted, bounds, w1, w2, w3), device)
            flops = 2 * T * k * 3 * I * H
            nbytes = touched * 3 * I * H * es + E * H * es
            times = (t_fused, t_ffn, t_torch)
            if T <= GPU_DECODE_MAX_T:
                metric = [f"{100 * nbytes / t / 1e9 / bw:.0f}%" for t in times]
                kind = "% of HBM bw"
            else:
                metric = [f"{flops / t / 1e12:.1f}" for t in times]
                kind = "TFLOP/s"
            rows.append([name, T, touched, *(t * 1e6 for t in times), kind, *metric, f"{diff:.1e}"])
            print(f"{name} T={T:5d} experts {touched}  fused_moe {t_fused*1e6:9.1f} us  expert_ffn {t_ffn*1e6:9.1f} "
                  f"us  torch {t_torch*1e6:9.1f} us  {kind}: {' / '.join(metric)}", flush=True)
    table = markdown_table(["shape", "T", "experts touched", "fused_moe (us)", "moe_expert_ffn (us)",
                            "torch per-expert matmul (us)", "metric", "fused_moe", "moe_expert_ffn",
                            "torch per-expert matmul", "‖ffn − torch‖ / ‖torch‖"], rows)
    text = (f"{header}\n\nDecode rows: % of the copy bandwidth for the touched experts' weights read once; "
            f"prefill rows: TFLOP/s (2·T·k·3·I·H).\n\n{table}\n")
    print(f"\n{text}")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"gpu_moe_{tag}.md").write_text(text)
    return text


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default="bf16")
    parser.add_argument("--tokens", default=None, help="comma-separated token counts (CPU: 1,512; "
                        "GPU: 1,4,16,64,512,4096)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    gpu = torch.device(args.device).type == "cuda"
    if not gpu and dtype == torch.float16:
        parser.error("--dtype fp16 needs --device cuda (the CPU kernels take fp32 and bf16)")
    if gpu:
        tokens = args.tokens or "1,4,16,64,512,4096"
        run_device(args.device, dtype, [int(t) for t in tokens.split(",")], GPU_SHAPES, args.out, args.dtype)
        return
    es = torch.tensor([], dtype=dtype).element_size()
    token_counts = [int(t) for t in (args.tokens or "1,512").split(",")]

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
    header = (f"{command_line(__file__)}\n\ncopy bandwidth {bw:.1f} GB/s, {torch.get_num_threads()} threads, "
              f"{dtype}")
    print(f"\n{header}\n\n{table1}\n\n{table2}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"cpu_moe_{args.dtype}.md").write_text(f"{header}\n\n{table1}\n\n{table2}\n")


if __name__ == "__main__":
    main()
