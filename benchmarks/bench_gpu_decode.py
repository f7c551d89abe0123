"""End-to-end decode on a GPU with no tokenizer and no download: random models built in device memory, run
through the engine (token ids in, ``Engine(model, None, ...)``), for a short first contact (scripts/gpu_check.sh).

    python benchmarks/bench_gpu_decode.py [--device cuda] [--models mistral,mixtral,q4k] [--batches 1,32]
                                          [--new-tokens 32] [--prompt-tokens 64] [--out DIR]
    python benchmarks/bench_gpu_decode.py --device cpu --smoke    # tiny configs on the CPU: checks the script

Models (random weights, normal × 0.02, bf16 activations and KV cache):
  mistral  Mistral-7B-shaped (H 4096, I 14336, Hq 32, Hkv 8, D 128, V 32000), bf16, 32 layers or as many as
           fit in 55 % of the free device memory (the row says how many)
  mixtral  Mixtral-8x7B-shaped (the same + E 8, k 2), bf16, as many layers as fit in 45 % of the free memory
           (a whole layer is 2.8 GB: ~12 on an H100)
  q4k      the Mistral-7B shape with every matrix packed Q4_K (the LM head Q6_K; random blocks with small scales,
           tests/helpers/quant_data.py's layout), run natively by qlinear; all 32 layers
Each runs with CUDA-graph decode on and off (``enforce_eager``), at each batch size: B prompts of
--prompt-tokens random ids, then --new-tokens greedy tokens (ignore EOS); decode tok/s = B · (new − 1) / (last
finish − last first token), after one warm-up run. % of roofline: tok/s over B · bandwidth / bytes of one decode
step (benchmarks/roofline.py batch_step_bytes: every weight once — a MoE layer the experts B tokens are expected to
touch — plus every sequence's KV at the mean context), with the bandwidth of a 1 GiB device copy measured at
the start of the same run. Written to DIR/gpu_decode.md (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from common import (bench_parser, copy_bandwidth_gbs, device_name, gpu_device, markdown_table,  # noqa: E402
                    results_dir)
from roofline import batch_step_bytes  # noqa: E402

from mistral_kernels import ops  # noqa: E402
from mistral_kernels.config import ModelConfig  # noqa: E402
from mistral_kernels.engine import Engine  # noqa: E402
from mistral_kernels.model import Model  # noqa: E402
from mistral_kernels.quant_formats import QFORMATS  # noqa: E402
from mistral_kernels.quant_weight import QuantizedWeight  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402

MODELS = ("mistral", "mixtral", "q4k")
MEMORY_SHARE = {"mistral": 0.55, "mixtral": 0.45, "q4k": 0.55}  # of the free device memory, for the weights
BLOCK = 16


def full_config(kind: str, smoke: bool) -> ModelConfig:
    """The 32-layer config of ``kind`` (tiny when ``smoke``)."""
    if smoke:
        base = dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=512, vocab_size=512)
    else:
        base = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
                    vocab_size=32000)
    moe = dict(num_experts=8, top_k=2) if kind == "mixtral" else {}
    return ModelConfig(**base, max_position=4096, rope_theta=1e6, **moe)


def _packed(name: str, n: int, k: int, dev: str, g: torch.Generator) -> QuantizedWeight:
    """Random blocks of format ``name`` [N, K] made on the device, fp16 scale fields set small and finite."""
    from tests.helpers.quant_data import FP16_FIELDS

    f = QFORMATS[name]
    raw = torch.randint(0, 256, (n, k // f.block, f.bytes), generator=g, device=dev, dtype=torch.uint8)
    scale = torch.tensor([4e-5], dtype=torch.float16).view(torch.uint8).to(dev)
    for off in FP16_FIELDS[name]:
        raw[..., off:off + 2] = scale
    return QuantizedWeight(raw.view(n, -1), f.qtype, (n, k))


def layer_bytes(c: ModelConfig, kind: str) -> int:
    """Device bytes of one decoder layer of ``kind``."""
    h, i, d = c.dim, c.hidden_dim, c.head_dim
    attn = ((c.n_heads + 2 * c.n_kv_heads) * d * h + h * c.n_heads * d)
    ffn = 3 * i * h * (c.num_experts or 1)
    per_weight = QFORMATS["Q4_K"].bytes / QFORMATS["Q4_K"].block if kind == "q4k" else 2
    return int((attn + ffn) * per_weight)


def build(kind: str, c: ModelConfig, dev: str, seed: int = 0) -> Model:
    """A random :class:`Model` of ``c`` on ``dev``: bf16 matrices, or Q4_K packed (``q4k``; LM head Q6_K)."""
    g = torch.Generator(dev).manual_seed(seed)
    bf16 = torch.bfloat16

    def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=dev, dtype=bf16) * scale)

    def mat(n: int, k: int, fmt: str = "Q4_K") -> torch.Tensor | QuantizedWeight:
        return _packed(fmt, n, k, dev, g) if kind == "q4k" else rnd(n, k)

    qkv_rows = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
    w: dict[str, object] = {"embed": rnd(c.vocab_size, c.dim, scale=1.0),
                            "norm": torch.ones(c.dim, dtype=bf16, device=dev),
                            "lm_head": mat(c.vocab_size, c.dim, "Q6_K")}
    for n in range(c.n_layers):
        p = f"layers.{n}."
        w |= {p + "attn_norm": torch.ones(c.dim, dtype=bf16, device=dev),
              p + "ffn_norm": torch.ones(c.dim, dtype=bf16, device=dev),
              p + "qkv": mat(qkv_rows, c.dim), p + "wo": mat(c.dim, c.n_heads * c.head_dim)}
        if c.is_moe:
            w |= {p + "gate": rnd(c.num_experts, c.dim), p + "w1": rnd(c.num_experts, c.hidden_dim, c.dim),
                  p + "w3": rnd(c.num_experts, c.hidden_dim, c.dim), p + "w2": rnd(c.num_experts, c.dim, c.hidden_dim)}
        else:
            w |= {p + "w13": mat(2 * c.hidden_dim, c.dim), p + "w2": mat(c.dim, c.hidden_dim)}
    return Model(c, w, ops)


def decode_rate(engine: Engine, vocab: int, batch: int, prompt_tokens: int, new_tokens: int, seed: int) -> float:
    """Decode tok/s of ``batch`` sequences of ``prompt_tokens`` random ids, ``new_tokens`` greedy tokens each."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist() for _ in range(batch)]
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    done = engine.run([engine.add_request(p, params) for p in prompts])
    start = max(c.timings.first_token for c in done)
    end = max(c.timings.finished for c in done)
    return batch * (new_tokens - 1) / (end - start)


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--device", default="cuda", help="cuda[:N] (default) or cpu (with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny configs (any device): runs every code path quickly")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    ap.add_argument("--batches", default="1,32", help="batch sizes (default 1,32)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per row (median)")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory of gpu_decode.md (default: benchmarks/results; a --smoke run: a temporary directory)")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if any(m not in MODELS for m in models):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        ap.error(f"--batches: comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.new_tokens < 2 or args.prompt_tokens < 1 or args.repeat < 1:
        ap.error("--batches must be positive, --new-tokens >= 2, --prompt-tokens and --repeat >= 1")
    gpu = gpu_device(ap, args.device, args.smoke, "benchmarks/bench_generate.py")
    torch.set_grad_enabled(False)
    dev = args.device
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    name = device_name(dev)
    bw = copy_bandwidth_gbs(device=dev)
    print(f"{name}: copy bandwidth {bw:.0f} GB/s", flush=True)
    rows: list[list[object]] = []
    failures: list[str] = []
    context = args.prompt_tokens + args.new_tokens / 2  # mean keys per decode step
    header = (f"{started}, {name}: HBM copy bandwidth {bw:.0f} GB/s (1 GiB device copy, this run); load average "
              f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}. Random weights built on the device, no "
              f"tokenizer; {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, mean context "
              f"{context:.0f}; median of {args.repeat} run(s); measured"
              f"{'' if gpu else ' (CPU smoke run: tiny configs, figures meaningless)'}. "
              f"Command: `python benchmarks/bench_gpu_decode.py {' '.join(sys.argv[1:])}`")
    args.out = results_dir(args.out, args.smoke, ROOT / "results")
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in models:
        c = full_config(kind, args.smoke)
        if gpu:
            free = torch.cuda.mem_get_info(torch.device(dev))[0]
            layers = max(1, min(c.n_layers, int(MEMORY_SHARE[kind] * free // layer_bytes(c, kind))))
            c = dataclasses.replace(c, n_layers=layers)
        label = {"mistral": "Mistral-7B-shaped bf16", "mixtral": "Mixtral-8x7B-shaped bf16",
                 "q4k": "Mistral-7B-shaped Q4_K (head Q6_K)"}[kind] + f", {c.n_layers} of 32 layers"
        try:
            t0 = time.perf_counter()
            model = build(kind, c, dev)
            if gpu:
                torch.cuda.synchronize()
            print(f"{label}: built in {time.perf_counter() - t0:.1f} s", flush=True)
            for graphs in (True, False) if gpu else (False,):
                try:
                    rows += measure(model, label, graphs, batches, args, bw, context)
                except Exception as exc:  # one failing mode: said so, the others still run
                    failures.append(f"{label}, CUDA graphs {'on' if graphs else 'off'}: {type(exc).__name__}: "
                                    f"{str(exc)[:300]}")
                    print(failures[-1], flush=True)
                gc.collect()
            del model
        except Exception as exc:  # the model could not be built
            failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
            print(failures[-1], flush=True)
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
        _write(args.out / "gpu_decode.md", header, rows, [*failures, f"models done: {kind} (of {', '.join(models)})"])
    text = _write(args.out / "gpu_decode.md", header, rows, failures)
    print("\n" + text)
    print(f"wrote {args.out / 'gpu_decode.md'}")
    if failures:
        raise SystemExit(f"{len(failures)} run(s) failed (listed under the table)")


def measure(model: Model, label: str, graphs: bool, batches: list[int], args: argparse.Namespace, bw: float,
            context: float) -> list[list[object]]:
    """The table rows of ``model`` through a fresh engine (CUDA graphs on or off), one per batch size."""
    c = model.config
    max_batch = max(batches)
    blocks = max_batch * (-(-(args.prompt_tokens + args.new_tokens) // BLOCK)) + 8
    engine = Engine(model, None, num_blocks=blocks, block_size=BLOCK, max_batch=max_batch,
                    max_tokens_per_step=max(512, args.prompt_tokens), prefix_caching=False, enforce_eager=not graphs)
    decode_rate(engine, c.vocab_size, max_batch, min(16, args.prompt_tokens), 3, seed=99)  # warm-up
    rows = []
    for b in batches:
        rate = statistics.median(decode_rate(engine, c.vocab_size, b, args.prompt_tokens, args.new_tokens,
                                             seed=b * 10 + r) for r in range(args.repeat))
        step = batch_step_bytes(model, context, b)
        roof = b * bw * 1e9 / step.total
        rows.append([label, "on" if graphs else "off", b, rate, f"{100 * rate / roof:.0f}%", step.weights / 1e9,
                     step.kv / 1e9, roof])
        print(" | ".join(str(v) for v in rows[-1]), flush=True)
    return rows


def _write(path: Path, header: str, rows: list[list[object]], notes: list[str]) -> str:
    """The table so far (rewritten after each model: a run cut short by its time limit keeps what it measured)."""
    table = markdown_table(["model", "CUDA graphs", "batch", "decode tok/s", "% of roofline",
                            "weight GB / step", "KV GB / step", "roofline tok/s"], rows)
    text = f"{header}\n\n{table}\n" + "".join(f"\n{n}\n" for n in notes)
    path.write_text(text)
    return text


if __name__ == "__main__":
    main()
