"""End-to-end generation benchmark: ours vs transformers on the same weights, in one process run.

    python benchmarks/bench_generate.py [--model smollm2|mistral|mixtral|all] [--dtype fp32|bf16|both]
                                        [--new-tokens 32] [--prompt-tokens 128] [--device cpu|cuda]
                                        [--repeat 1] [--no-transformers] [--per-op]

Models: SmolLM2-135M-Instruct (the default GGUF, real weights), a random Mistral-shaped model (~0.9B dense
parameters, GQA) and a random Mixtral-shaped model (8 experts, top-2, ~1B parameters), both saved with
transformers' save_pretrained into a temp dir. ``all`` = SmolLM2 and Mixtral (the Mistral model is opt-in:
its fp32 copy alone is ~3.7 GB).
Measured through the engine (the path of ``LLM.generate``, token ids in): prompt tok/s (one prefill of
--prompt-tokens), decode tok/s at batch 1 and batch 8 (greedy, ignore EOS; decode time = total − time to
first token; the median of --repeat runs), and % of the decode roofline: bytes read per decode step — every
weight the step multiplies by once (the LM head, not the input embedding table, which a step reads one
row of) + the KV cache at the mean context — / the copy bandwidth measured just before that model's run.
``--per-op`` runs decode steps op by op (no fused CPU decode step, mistral_kernels.cpu_decode) to compare.
Targets (CPU, 2 cores; benchmarks/results/cpu_summary.md): SmolLM2 bf16 decode ≥ 4× transformers and ≥ 90 %
of the roofline; prompt ≥ 1.5× transformers; Mixtral decode ≥ 5× transformers. The table marks each target
met / missed. With ``--device cuda`` both run on the GPU (ours with CUDA-graph decode), the roofline is the
HBM bandwidth of a device copy measured in the same run, and the table goes to results/gpu_generate.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbs, device_name, markdown_table  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _prompt_ids(vocab: int, n: int, batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, min(vocab, 20000), (n,), generator=g).tolist() for _ in range(batch)]


# ---- ours -----------------------------------------------------------------------------------------------
def ours(path: Path, dtype: torch.dtype, prompt_tokens: int, new_tokens: int, device: str = "cpu", *,
         repeat: int = 1, per_op: bool = False) -> dict[str, float]:
    from mistral_kernels.sampling import SamplingParams

    # The random models have no tokenizer of their own: borrow SmolLM2's; prompts are ids.
    tokenizer = None if path.suffix == ".gguf" else default_model_path()
    llm = mistral_kernels.LLM(path, dtype=dtype, max_batch=8, tokenizer=tokenizer, device=device)
    if per_op:
        llm.model.cpu_decode = None
    cfg = llm.model.config
    res: dict[str, float] = {}
    prompt = _prompt_ids(cfg.vocab_size, prompt_tokens, 1)[0]

    def run(prompts: list[list[int]], n: int) -> list:
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        rids = [llm.engine.add_request(p, params) for p in prompts]
        return llm.engine.run(rids)

    run([prompt[:16]], 2)  # warm-up
    t0 = time.perf_counter()
    run([prompt], 1)
    res["prompt_tok_s"] = prompt_tokens / (time.perf_counter() - t0)
    for batch in (1, 8):
        prompts = [p[:16] for p in _prompt_ids(cfg.vocab_size, 16, batch)]
        rates = []
        for _ in range(repeat):
            done = run(prompts, new_tokens)
            start = max(c.timings.first_token for c in done)
            end = max(c.timings.finished for c in done)
            rates.append(batch * (new_tokens - 1) / (end - start))
        res[f"decode_tok_s_b{batch}"] = statistics.median(rates)
    es = torch.tensor([], dtype=dtype).element_size()
    input_table = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim  # a decode step reads one row of it
    res["weight_bytes"] = float((cfg.num_parameters(active_only=True) - input_table) * es)
    res["kv_bytes_per_token"] = float(cfg.kv_bytes_per_token(dtype))
    return res


# ---- transformers -------------------------------------------------------------------------------------
def hf(model: torch.nn.Module, vocab: int, prompt_tokens: int, new_tokens: int, device: str = "cpu") -> dict[str, float]:
    res: dict[str, float] = {}
    prompt = torch.tensor(_prompt_ids(vocab, prompt_tokens, 1), device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    with torch.inference_mode():
        model(prompt[:, :16])  # warm-up
        sync()
        t0 = time.perf_counter()
        model(prompt)
        sync()
        res["prompt_tok_s"] = prompt_tokens / (time.perf_counter() - t0)
        for batch in (1, 8):
            ids = torch.tensor([p[:16] for p in _prompt_ids(vocab, 16, batch)], device=device)
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            sync()
            t_first = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
            sync()
            res[f"decode_tok_s_b{batch}"] = batch * (new_tokens - 1) / (time.perf_counter() - t0 - t_first)
    return res


def load_hf_smollm2(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    # Dequantised to fp32 at load (plain nn.Linear weights), then cast: the same weights as ours.
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.to(dtype).eval()


def make_random_mixtral(tmp: Path) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=49152, hidden_size=1024, intermediate_size=2816, num_hidden_layers=14,
                        num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=4096, sliding_window=None,
                        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg).to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(tmp)
    return tmp


def make_random_mistral(tmp: Path) -> Path:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                        sliding_window=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = MistralForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(tmp)
    return tmp


def _target(model: str, dtype: str, key: str, ratio: float, roofline_pct: float) -> str:
    """The CPU targets (module docstring) for this row: 'met', 'MISSED: …' or '' (no target)."""
    goals: list[tuple[bool, str]] = []
    if key == "prompt_tok_s":
        goals.append((ratio >= 1.5, f"x{ratio:.2f} < 1.5"))
    elif key == "decode_tok_s_b1" and model.startswith("SmolLM2") and dtype == "bf16":
        goals += [(ratio >= 4, f"x{ratio:.2f} < 4"), (roofline_pct >= 90, f"{roofline_pct:.0f}% < 90% roofline")]
    elif key == "decode_tok_s_b1" and "Mistral" in model:
        goals.append((roofline_pct >= 90, f"{roofline_pct:.0f}% < 90% roofline"))
    elif key == "decode_tok_s_b1" and "Mixtral" in model:
        goals.append((ratio >= 5, f"x{ratio:.2f} < 5"))
    if not goals:
        return ""
    missed = [why for ok, why in goals if not ok]
    return "MISSED: " + ", ".join(missed) if missed else "met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "mistral", "mixtral", "all"], default="all")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--repeat", type=int, default=1, help="decode runs per batch size (median)")
    ap.add_argument("--no-transformers", action="store_true", help="ours only (no reference columns)")
    ap.add_argument("--per-op", action="store_true", help="decode op by op (no fused CPU decode step)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    gpu = torch.device(args.device).type == "cuda"
    bw0 = copy_bandwidth_gbs(device=args.device)
    where = device_name(args.device)
    print(f"{where}: copy bandwidth {bw0:.1f} GB/s")
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models: list[tuple[str, Path]] = []
        if args.model in ("smollm2", "all"):
            models.append(("SmolLM2-135M (GGUF)", default_model_path()))
        if args.model == "mistral":
            models.append(("random Mistral ~0.9B", make_random_mistral(Path(tmp) / "mistral")))
        if args.model in ("mixtral", "all"):
            models.append(("random Mixtral 8×top-2 ~1B", make_random_mixtral(Path(tmp) / "mixtral")))
        for name, path in models:
            for dt in dtypes:
                dtype = DTYPES[dt]
                bw = copy_bandwidth_gbs(device=args.device)  # just before this run: the load changes
                o = ours(path, dtype, args.prompt_tokens, args.new_tokens, args.device, repeat=args.repeat,
                         per_op=args.per_op)
                if args.no_transformers:
                    h = {k: float("nan") for k in ("prompt_tok_s", "decode_tok_s_b1", "decode_tok_s_b8")}
                else:
                    if path.suffix == ".gguf":
                        ref_model = load_hf_smollm2(path, dtype)
                    else:
                        from transformers import AutoModelForCausalLM

                        ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
                    ref_model = ref_model.to(args.device)
                    h = hf(ref_model, ref_model.config.vocab_size, args.prompt_tokens, args.new_tokens, args.device)
                    del ref_model
                context = 16 + args.new_tokens / 2  # mean keys per decode step (16-token prompts)
                roof = bw * 1e9 / (o["weight_bytes"] + context * o["kv_bytes_per_token"])
                for key, label in [("prompt_tok_s", "prompt tok/s"), ("decode_tok_s_b1", "decode tok/s b=1"),
                                   ("decode_tok_s_b8", "decode tok/s b=8")]:
                    pct = f"{100 * o[key] / roof:.0f}%" if key == "decode_tok_s_b1" else ""
                    if key == "decode_tok_s_b8":
                        pct = f"{o[key] / o['decode_tok_s_b1']:.2f}× b=1"
                    target = "" if gpu or args.no_transformers else _target(name, dt, key, o[key] / h[key],
                                                                             100 * o[key] / roof)
                    rows.append([name, dt, label, o[key], h[key], o[key] / h[key], f"{bw:.1f}", pct, target])
                    print(rows[-1], flush=True)
    table = markdown_table(["model", "dtype", "metric", "ours", "transformers", "ratio", "copy GB/s",
                            "% roofline (b=8: × b=1)", "target"], rows)
    print()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    mode = ", decode op by op (--per-op)" if args.per_op else ""
    (args.out / ("gpu_generate.md" if gpu else "bench_generate.md")).write_text(
        f"{where}, copy bandwidth {bw0:.1f} GB/s at the start, {args.new_tokens} new tokens, "
        f"{args.prompt_tokens}-token prompt, median of {args.repeat} decode run(s){mode}\n\n{table}\n")


if __name__ == "__main__":
    main()
