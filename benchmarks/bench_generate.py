"""End-to-end generation benchmark: ours vs transformers on the same weights, in one process run.

    python benchmarks/bench_generate.py [--model smollm2|mistral|mixtral|all] [--dtype fp32|bf16|both]
                                        [--weights dense|native|both] [--new-tokens 32] [--prompt-tokens 128]
                                        [--device cpu|cuda] [--repeat 1] [--threads N] [--no-transformers]
                                        [--per-op] [--profile] [--model-cache DIR]

Models: SmolLM2-135M-Instruct (the default Q4_1 GGUF, real weights), a random Mistral-shaped model (~0.9B
dense parameters, GQA: H 2048, I 5632, 16 layers, 16 / 4 heads, vocab 49152; saved in bf16) and a random
Mixtral-shaped model (8 experts, top-2, ~1B parameters), both saved with transformers' save_pretrained into a
temp dir (or ``--model-cache DIR``, reused by later runs) and run with no tokenizer (the engine alone, token ids
in: nothing to download). ``all`` = SmolLM2 and Mixtral (the Mistral model is
opt-in: its fp32 copy is ~3.7 GB; ours and transformers load one after the other, peak RSS 4.7 GB measured
for ours in bf16 then fp32).

Weights (``--weights``, the GGUF model only; the random models are dense checkpoints):
``dense`` = ``LLM(..., quantized=False)``: every quantized matrix dequantized at load into ``--dtype``;
``native`` = the file's packed blocks as they are (Q4_1 matrices, the Q8_0 tied head), ``--dtype`` sets the
activations, norms and KV cache. Each row says which.

Measured through the engine (the path of ``LLM.generate``, token ids in): prompt tok/s (the median of max(3,
--repeat) prefills of distinct --prompt-tokens prompts), decode tok/s at batch 1 and batch 8 (greedy, ignore EOS; decode time = total − time to
first token; the median of --repeat runs), and % of the decode roofline: bytes read per decode step — every
weight the step multiplies by once (the LM head, not the input embedding table, which a step reads one
row of; packed matrices by their packed bytes; benchmarks/roofline.py) + the KV cache at the mean context — /
the copy bandwidth measured just before that model's run. ``--profile`` adds, per row, where one batch-1
decode step's wall time goes (benchmarks/decode_profile.py: decoder layers, final norm + LM head, sampling,
the engine outside the forward; each with its bytes and % of its own roofline).
``--per-op`` runs decode steps op by op (no fused CPU decode step, mistral_kernels.cpu_decode) to compare.

Targets (CPU, 2 cores; benchmarks/results/cpu_summary.md), marked met / missed per row: dense decode at
batch 1 ≥ 90 % of the roofline (bf16 and fp32; SmolLM2 bf16 also ≥ 4× transformers); batch 8 ≥ 3× batch 1;
prompt ≥ 1.5× transformers; Mixtral decode ≥ 5× transformers; native packed weights: decode above our dense
bf16 run and prompt within 20 % of it. With ``--device cuda`` both run on the GPU (ours with CUDA-graph
decode), the roofline is the HBM bandwidth of a device copy measured in the same run, and the table goes to
results/gpu_generate.md. Same weights vs llama.cpp: benchmarks/bench_llamacpp.py.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, dtypes, copy_bandwidth_gbs, device_name, load_average, markdown_table  # noqa: E402
from decode_profile import DecodeProfile, profile_decode  # noqa: E402
from roofline import StepBytes, step_bytes  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402
from mistral_kernels.quant_weight import format_names  # noqa: E402

DTYPES = dtypes("fp32", "bf16")
METRICS = [("prompt_tok_s", "prompt tok/s"), ("decode_tok_s_b1", "decode tok/s b=1"),
           ("decode_tok_s_b8", "decode tok/s b=8")]


def _prompt_ids(vocab: int, n: int, batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, min(vocab, 20000), (n,), generator=g).tolist() for _ in range(batch)]


def weights_label(model: object, dtype: str) -> str:
    """'dense bf16', or the packed formats of the layers and the head and the activation dtype, e.g.
    'native Q4_1, head Q8_0, bf16 act.'."""
    layers = {f for name, w in model.named_weights() if name.startswith("layers.") for f in format_names(w)}
    head = set(format_names(model.lm_head))
    if not layers and not head:
        return f"dense {dtype}"
    return f"native {'/'.join(sorted(layers)) or dtype}, head {'/'.join(sorted(head)) or dtype}, {dtype} act."


# ---- ours -----------------------------------------------------------------------------------------------
def ours(path: Path, dtype: torch.dtype, prompt_tokens: int, new_tokens: int, device: str = "cpu", *,
         repeat: int = 1, per_op: bool = False, quantized: bool = False,
         profile: bool = False) -> tuple[dict[str, float], StepBytes, str, DecodeProfile | None]:
    """Prompt / decode tok/s through the engine, the bytes of a batch-1 decode step, the weights label and
    (``profile``) the split of a batch-1 decode step."""
    from mistral_kernels.sampling import SamplingParams

    if path.suffix == ".gguf":
        llm = mistral_kernels.LLM(path, dtype=dtype, max_batch=8, device=device, quantized=quantized,
                                  prefix_caching=False)
    else:  # the random models have no tokenizer: the engine alone, token ids in (no download, no borrowed one)
        llm = tokenizer_free(path, dtype, device)
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
    prompt_rates = []
    for i in range(max(3, repeat)):  # distinct prompts (no cache hits), median: one prefill is ~0.1 s
        ids = torch.randint(100, min(cfg.vocab_size, 20000), (prompt_tokens,),
                            generator=torch.Generator().manual_seed(1000 + i)).tolist()
        t0 = time.perf_counter()
        run([ids], 1)
        prompt_rates.append(prompt_tokens / (time.perf_counter() - t0))
    res["prompt_tok_s"] = statistics.median(prompt_rates)
    for batch in (1, 8):
        prompts = [p[:16] for p in _prompt_ids(cfg.vocab_size, 16, batch)]
        rates = []
        for _ in range(repeat):
            done = run(prompts, new_tokens)
            start = max(c.timings.first_token for c in done)
            end = max(c.timings.finished for c in done)
            rates.append(batch * (new_tokens - 1) / (end - start))
        res[f"decode_tok_s_b{batch}"] = statistics.median(rates)
    context = 16 + new_tokens / 2  # mean keys per decode step (16-token prompts)
    prof = profile_decode(llm, prompt[:16], new_tokens) if profile else None
    dtype_name = next(k for k, v in DTYPES.items() if v == dtype)
    return res, step_bytes(llm.model, context), weights_label(llm.model, dtype_name), prof


def tokenizer_free(path: Path, dtype: torch.dtype, device: str, max_batch: int = 8,
                   max_tokens_per_step: int = 512) -> SimpleNamespace:
    """``model`` and ``engine`` (no tokenizer: ids in, EOS from the config) of the checkpoint at ``path``, with
    the KV pool LLM would size; what ``ours`` uses of an LLM."""
    from mistral_kernels.cache import default_num_blocks
    from mistral_kernels.engine import Engine

    model = mistral_kernels.load_model(path, device=device, dtype=dtype)
    blocks = default_num_blocks(model.config, 16, max_batch, max_tokens_per_step)
    engine = Engine(model, None, num_blocks=blocks, block_size=16, max_batch=max_batch,
                    max_tokens_per_step=max_tokens_per_step, prefix_caching=False)
    return SimpleNamespace(model=model, engine=engine)


# ---- transformers -------------------------------------------------------------------------------------
def hf(model: torch.nn.Module, vocab: int, prompt_tokens: int, new_tokens: int,
       device: str = "cpu") -> dict[str, float]:
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

    # Dequantised to fp32 at load (plain nn.Linear weights), then cast: the same weights as ours (dense).
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.to(dtype).eval()


def _save_random(model: torch.nn.Module, out: Path) -> Path:
    """``model`` (bf16, allocated, uninitialised) with Normal(0, 0.02) weights, saved with save_pretrained
    into ``out`` (renamed into place when complete)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.02)
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tmp.rename(out)
    return out


def make_random_mixtral(out: Path) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=49152, hidden_size=1024, intermediate_size=2816, num_hidden_layers=14,
                        num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=4096, sliding_window=None,
                        tie_word_embeddings=False)
    if (out / "config.json").exists():
        return out
    with torch.device("meta"):
        model = MixtralForCausalLM(cfg).to(torch.bfloat16)
    return _save_random(model.to_empty(device="cpu"), out)


def make_random_mistral(out: Path) -> Path:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                        sliding_window=None, tie_word_embeddings=False)
    if (out / "config.json").exists():
        return out
    with torch.device("meta"):
        model = MistralForCausalLM(cfg).to(torch.bfloat16)
    return _save_random(model.to_empty(device="cpu"), out)


def _target(model: str, dtype: str, native: bool, key: str, ratio: float | None, roofline_pct: float,
            b8_over_b1: float, dense_bf16: dict[str, float] | None, value: float) -> str:
    """The CPU targets (module docstring) for this row: 'met', 'MISSED: …' or '' (no target). ``ratio``:
    ours / transformers, None without the reference (its goals are then left out)."""
    goals: list[tuple[bool, str]] = []
    if key == "prompt_tok_s":
        if not native:
            if ratio is not None:
                goals.append((ratio >= 1.5, f"x{ratio:.2f} < 1.5 transformers"))
        elif dense_bf16 is not None:
            rel = value / dense_bf16[key]
            goals.append((rel >= 0.8, f"{rel:.2f}× dense bf16 < 0.8"))
    elif key == "decode_tok_s_b8":
        goals.append((b8_over_b1 >= 3, f"{b8_over_b1:.2f}× b=1 < 3"))
    elif native:
        if dense_bf16 is not None:
            rel = value / dense_bf16[key]
            goals.append((rel > 1, f"{rel:.2f}× dense bf16 ≤ 1"))
    elif "Mixtral" in model:
        if ratio is not None:
            goals.append((ratio >= 5, f"x{ratio:.2f} < 5 transformers"))
    else:
        if model.startswith("SmolLM2") and dtype == "bf16" and ratio is not None:
            goals.append((ratio >= 4, f"x{ratio:.2f} < 4 transformers"))
        goals.append((roofline_pct >= 90, f"{roofline_pct:.0f}% < 90% roofline"))
    if not goals:
        return ""
    missed = [why for ok, why in goals if not ok]
    return "MISSED: " + ", ".join(missed) if missed else "met"


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", choices=["smollm2", "mistral", "mixtral", "all"], default="all")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--weights", choices=["dense", "native", "both"], default="both",
                    help="GGUF model: dequantized at load (dense), packed blocks (native) or both")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--repeat", type=int, default=1, help="decode runs per batch size (median)")
    ap.add_argument("--no-transformers", action="store_true", help="ours only (no reference columns)")
    ap.add_argument("--per-op", action="store_true", help="decode op by op (no fused CPU decode step)")
    ap.add_argument("--profile", action="store_true", help="split one batch-1 decode step's time per row (CPU)")
    ap.add_argument("--model-cache", type=Path, default=None,
                    help="keep the random checkpoints here and reuse them (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--out-name", default=None, help="file name in --out (default cpu_generate.md / "
                    "gpu_generate.md)")
    args = ap.parse_args()
    if args.new_tokens < 2 or args.prompt_tokens < 16:
        ap.error("--new-tokens must be >= 2 and --prompt-tokens >= 16")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    gpu = torch.device(args.device).type == "cuda"
    started, load0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load_average()
    bw0 = copy_bandwidth_gbs(device=args.device)
    where = device_name(args.device)
    print(f"{where}: copy bandwidth {bw0:.1f} GB/s")
    dtypes = ["bf16", "fp32"] if args.dtype == "both" else [args.dtype]  # dense bf16 first: native's target
    weight_modes = ["dense", "native"] if args.weights == "both" else [args.weights]
    rows: list[list[object]] = []
    profiles: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.model_cache or Path(tmp)
        models: list[tuple[str, Path]] = []
        if args.model in ("smollm2", "all"):
            models.append(("SmolLM2-135M Q4_1 GGUF", default_model_path()))
        if args.model == "mistral":
            models.append(("random Mistral ~0.9B", make_random_mistral(cache / "random-mistral-0.9b")))
        if args.model in ("mixtral", "all"):
            models.append(("random Mixtral 8×top-2 ~1B", make_random_mixtral(cache / "random-mixtral-1b")))
        for name, path in models:
            modes = weight_modes if path.suffix == ".gguf" else ["dense"]
            if modes != weight_modes:
                print(f"{name}: dense weights only (--weights native applies to a GGUF file)")
            dense_bf16: dict[str, float] | None = None
            for dt in dtypes:
                dtype = DTYPES[dt]
                h: dict[str, float] | None = None
                for mode in modes:
                    native = mode == "native"
                    bw = copy_bandwidth_gbs(device=args.device)  # just before this run: the load changes
                    o, nbytes, label, prof = ours(path, dtype, args.prompt_tokens, args.new_tokens, args.device,
                                                  repeat=args.repeat, per_op=args.per_op, quantized=native,
                                                  profile=args.profile and not gpu)
                    gc.collect()
                    if not native and dt == "bf16":
                        dense_bf16 = o
                    if h is None:  # transformers runs the dense weights: one run serves both modes
                        h = reference(path, dtype, args) if not args.no_transformers else \
                            {k: float("nan") for k, _ in METRICS}
                    roof = bw * 1e9 / nbytes.total
                    for key, metric in METRICS:
                        pct = f"{100 * o[key] / roof:.0f}%" if key == "decode_tok_s_b1" else ""
                        b8 = o["decode_tok_s_b8"] / o["decode_tok_s_b1"]
                        if key == "decode_tok_s_b8":
                            pct = f"{b8:.2f}× b=1"
                        ratio = o[key] / h[key]
                        target = "" if gpu else _target(name, dt, native, key, None if args.no_transformers else ratio,
                                                        100 * o[key] / roof, b8, dense_bf16, o[key])
                        rows.append([name, label, metric, o[key], h[key], ratio, f"{bw:.1f}",
                                     f"{nbytes.total / 1e6:.0f}", pct, target])
                        print(rows[-1], flush=True)
                    if prof is not None:
                        profiles.append(_profile_section(name, label, prof, bw))
                        print(profiles[-1], flush=True)
    table = markdown_table(["model", "weights", "metric", "ours", "transformers (dense)", "ratio", "copy GB/s",
                            "MB / decode step", "% roofline (b=8: × b=1)", "target"], rows)
    print()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    mode = ", decode op by op (--per-op)" if args.per_op else ""
    out = args.out / (args.out_name or ("gpu_generate.md" if gpu else "cpu_generate.md"))
    text = (f"{started} – {time.strftime('%H:%M UTC', time.gmtime())}, load average {load0} at the start, "
            f"{load_average()} at the end; "
            f"{where}, copy bandwidth {bw0:.1f} GB/s at the start, {args.new_tokens} new tokens, "
            f"{args.prompt_tokens}-token prompt, median of {args.repeat} decode run(s){mode}. "
            f"Command: `python benchmarks/bench_generate.py {' '.join(sys.argv[1:])}`\n\n{table}\n")
    if profiles:
        text += "\n## Where a batch-1 decode step goes\n\n" + "\n".join(profiles)
    out.write_text(text)
    print(f"wrote {out}")


def reference(path: Path, dtype: torch.dtype, args: argparse.Namespace) -> dict[str, float]:
    """transformers on the dense weights of ``path`` in ``dtype``."""
    if path.suffix == ".gguf":
        ref_model = load_hf_smollm2(path, dtype)
    else:
        from transformers import AutoModelForCausalLM

        ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    ref_model = ref_model.to(args.device)
    res = hf(ref_model, ref_model.config.vocab_size, args.prompt_tokens, args.new_tokens, args.device)
    del ref_model
    gc.collect()
    return res


def _profile_section(name: str, label: str, prof: DecodeProfile, bw: float) -> str:
    table = markdown_table(["part", "ms / step", "% of step", "MB read", "GB/s", "% of its roofline"],
                           prof.rows(bw))
    return (f"{name}, {label}: decoder layers {prof.layers_kind}; median of {prof.steps} batch-1 decode steps at "
            f"mean context {prof.context:.0f}; copy bandwidth {bw:.1f} GB/s\n\n{table}\n")


if __name__ == "__main__":
    main()
