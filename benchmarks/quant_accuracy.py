"""The accuracy cost of the fast CPU path of a quantized GGUF (bf16 activations, quantized to int8 inside every
quantized matmul) against the exact one (fp32 activations, fp32 decoding of the blocks): next-token
distributions along a fixed text, decoded one token at a time (the decode GEMV path: M = 1).

    python benchmarks/quant_accuracy.py [--model FILE.gguf] [--tokens 256] [--out FILE]

Both runs read the same packed weights (``LLM``'s loader, ``quantized=True``); the fp32 run is the reference.
For each position: KL(p_fp32 ‖ p_fast) of the softmax over the vocabulary, whether the argmax agrees, and the
fp32 reference's own top-1 probability. A third run at the ``generic`` ISA level separates the bf16 rounding
of the activations from their int8 quantization for the 32-block formats (Q4_0 / Q4_1 / Q8_0: that level
decodes them in fp32; its K-quants take the portable int8 path), in a subprocess (MK_CPU_ISA is per process).
Text: the opening of the README of this repository (fixed, in the tree), truncated to --tokens tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser  # noqa: E402


def step_logits(path: Path, dtype: torch.dtype, ids: list[int]) -> torch.Tensor:
    """fp32 logits [T, V]: position t's distribution after ids[: t + 1], decoded one token per forward."""
    from mistral_kernels import LLM
    from mistral_kernels.batch import AttentionBatch

    llm = LLM(path, dtype=dtype, max_batch=1)
    model = llm.model
    block = 16
    nblocks = (len(ids) + block - 1) // block
    cache = model.new_cache(nblocks, block)
    out = []
    for t, tok in enumerate(ids):
        batch = AttentionBatch.build([list(range(nblocks))], [t], [1], block, "cpu")
        out.append(model.forward(torch.tensor([tok]), batch, cache)[0].float())
    return torch.stack(out)


def text_ids(path: Path, tokens: int) -> list[int]:
    from mistral_kernels import load_tokenizer

    text = (ROOT / "README.md").read_text()
    return load_tokenizer(path).encode(text)[:tokens]


def compare(ref: torch.Tensor, fast: torch.Tensor) -> dict[str, float]:
    lp_ref, lp_fast = ref.log_softmax(-1), fast.log_softmax(-1)
    kl = (lp_ref.exp() * (lp_ref - lp_fast)).sum(-1)
    top1 = (ref.argmax(-1) == fast.argmax(-1)).float()
    return {"kl_mean": kl.mean().item(), "kl_p99": kl.quantile(0.99).item(), "kl_max": kl.max().item(),
            "top1_agree": top1.mean().item(), "max_abs_logit_diff": (ref - fast).abs().max().item()}


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dump", type=Path, default=None, help=argparse.SUPPRESS)  # the generic-level subprocess
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        from mistral_kernels.default_model import default_model_path

        args.model = default_model_path()
    ids = text_ids(args.model, args.tokens)
    if args.dump is not None:
        torch.save(step_logits(args.model, torch.bfloat16, ids), args.dump)
        return
    import mistral_kernels as mk

    ref = step_logits(args.model, torch.float32, ids)
    fast = step_logits(args.model, torch.bfloat16, ids)
    rows = {f"bf16 activations + int8 in the quantized matmuls ({mk.cpu_isa()})": compare(ref, fast)}
    dump = Path(os.environ.get("TMPDIR", "/tmp")) / f"quant_accuracy_{os.getpid()}.pt"
    env = dict(os.environ, MK_CPU_ISA="generic")
    subprocess.run([sys.executable, __file__, "--model", str(args.model), "--tokens", str(args.tokens),
                    "--threads", str(args.threads), "--dump", str(dump)], check=True, env=env)
    rows["bf16 activations, 32-blocks decoded in fp32 (generic level)"] = compare(ref, torch.load(dump))
    dump.unlink()
    lines = [f"Model: `{args.model.name}`; text: README.md's first {len(ids)} tokens, decoded one token at a time; "
             f"reference: fp32 activations (exact path); reference top-1 probability (mean): "
             f"{ref.softmax(-1).max(-1).values.mean().item():.3f}.", "",
             "| run vs fp32 | KL mean | KL p99 | KL max | top-1 agreement | max abs logit diff |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['kl_mean']:.2e} | {r['kl_p99']:.2e} | {r['kl_max']:.2e} | "
                     f"{100 * r['top1_agree']:.1f} % | {r['max_abs_logit_diff']:.3f} |")
    text = "\n".join(lines)
    print(text)
    print(json.dumps(rows))
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
