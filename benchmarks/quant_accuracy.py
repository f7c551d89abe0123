"""The accuracy cost of the fast CPU paths of a quantized GGUF against the exact one (fp32 activations, fp32
decoding of the blocks: ``activations="exact"``): the default (fp32 activations rounded to bf16 and quantized to
int8 inside every quantized matmul, ``activations="auto"``), bf16 activations (int8 inside the matmuls as well,
the residual stream in bf16), and llama.cpp on the same file (its default: 8-bit activations in every quantized
matmul) — next-token distributions along a fixed text, decoded one token at a time (the decode GEMV path: M = 1).

    python benchmarks/quant_accuracy.py [--model FILE.gguf] [--tokens 256] [--llama-logits BIN] [--out FILE]

``--llama-logits``: benchmarks/native/llama_logits.c built against libllama (its header says how).
Every run reads the same packed weights (``LLM``'s loader, ``quantized=True``); the exact run is the reference.
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


def step_logits(path: Path, dtype: torch.dtype, ids: list[int], activations: str = "auto") -> torch.Tensor:
    """fp32 logits [T, V]: position t's distribution after ids[: t + 1], decoded one token per forward."""
    from mistral_kernels import LLM
    from mistral_kernels.batch import AttentionBatch

    llm = LLM(path, dtype=dtype, max_batch=1, activations=activations)
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


def llama_logits(binary: Path, path: Path, ids: list[int], threads: int) -> torch.Tensor:
    """llama.cpp's logits [T, V] along ids, one token per llama_decode (benchmarks/native/llama_logits.c)."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    ids_file, out_file = tmp / f"ids_{os.getpid()}.i32", tmp / f"logits_{os.getpid()}.f32"
    ids_file.write_bytes(torch.tensor(ids, dtype=torch.int32).numpy().tobytes())
    try:
        subprocess.run([str(binary), str(path), str(threads), str(ids_file), str(out_file)], check=True,
                       capture_output=True)
        flat = torch.frombuffer(bytearray(out_file.read_bytes()), dtype=torch.float32)
    finally:
        ids_file.unlink(missing_ok=True)
        out_file.unlink(missing_ok=True)
    return flat.view(len(ids), -1)


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
    ap.add_argument("--llama-logits", type=Path, default=None,
                    help="benchmarks/native/llama_logits.c's binary: add llama.cpp's row")
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

    ref = step_logits(args.model, torch.float32, ids, activations="exact")
    rows = {f"default: fp32 activations, bf16 → int8 inside the quantized matmuls ({mk.cpu_isa()})":
            compare(ref, step_logits(args.model, torch.float32, ids)),
            f"bf16 activations + int8 in the quantized matmuls ({mk.cpu_isa()})":
            compare(ref, step_logits(args.model, torch.bfloat16, ids))}
    if args.llama_logits is not None:
        rows["llama.cpp, same file (its default: 8-bit activations in the quantized matmuls)"] = compare(
            ref, llama_logits(args.llama_logits, args.model, ids, args.threads))
    dump = Path(os.environ.get("TMPDIR", "/tmp")) / f"quant_accuracy_{os.getpid()}.pt"
    env = dict(os.environ, MK_CPU_ISA="generic")
    subprocess.run([sys.executable, __file__, "--model", str(args.model), "--tokens", str(args.tokens),
                    "--threads", str(args.threads), "--dump", str(dump)], check=True, env=env)
    rows["bf16 activations, 32-blocks decoded in fp32 (generic level)"] = compare(ref, torch.load(dump))
    dump.unlink()
    lines = [f"Model: `{args.model.name}`; text: README.md's first {len(ids)} tokens, decoded one token at a time; "
             f"reference: fp32 activations (exact path); reference top-1 probability (mean): "
             f"{ref.softmax(-1).max(-1).values.mean().item():.3f}. Load average at the start: "
             f"{os.getloadavg()[0]:.1f} (does not change these values).", "",
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
