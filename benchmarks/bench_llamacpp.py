"""Ours vs llama.cpp on the same weights and thread count, in one run (interleaved rounds, medians).

    python benchmarks/bench_llamacpp.py [--llama-bin DIR] [--model FILE.gguf] [--threads 2] [--rounds 3]
                                        [--new-tokens 64] [--files q4_1,bf16,f32] [--prompt-tokens N]
                                        [--no-completion] [--out FILE]

Any quantized GGUF: ``--model FILE --files q4_1`` runs the file as is ("q4_1" names the given file, whatever
its formats) without conversions, e.g. the Mistral-7B-shaped files of benchmarks/make_random_gguf.py::

    python benchmarks/bench_llamacpp.py --model /work/models/mistral7b-random-q4_k_m.gguf --files q4_1 \
        --prompt-tokens 128 --new-tokens 32 --no-completion --out benchmarks/results/cpu_llamacpp_7b.md

Weights: the default model's GGUF (SmolLM2-135M-Instruct Q4_1: Q4_1 matrices, a Q8_0 tied embedding) and its
BF16 and F32 conversions made by ``llama-quantize --allow-requantize IN OUT BF16|F32`` (into a temp dir):

- **Q4_1** (the file as is): ours natively on the packed blocks (``LLM(..., quantized=True)``, the default;
  fp32 activations with int8 inside the quantized matmuls — the default —, bf16 activations, and fp32 exact:
  ``activations="exact"``) vs llama.cpp on the same file.
- **BF16** / **F32**: ours dense (``LLM(q4_1_file, dtype=..., quantized=False)``: dequantized at load) vs
  llama.cpp on the converted file. Same values: the script loads the converted file with our loader and
  prints the max |difference| to ours dequantized from the Q4_1 file (expected 0).

Same prompt: "What is the capital of France?" through the model's chat template (42 tokens for SmolLM2), or
with ``--prompt-tokens N`` the first N tokens of this repository's README.md as plain text; then
--new-tokens greedy tokens with EOS ignored; --threads threads on both sides (torch.set_num_threads; llama.cpp
``-t``). Each round runs every configuration once, ours and llama.cpp alternating; the tables give medians.

- **ours**, through ``LLM.generate`` (the CLI's path): prompt tok/s = prompt tokens / time to first token,
  decode tok/s = (tokens − 1) / (finish − first token) — wall time, engine and sampling included; plus the
  stats line's decode tok/s (the engine's step time, as ``mistral-kernels generate`` prints it).
- **llama-bench**: ``-p N -n 0`` (prompt, pp) and ``-p 0 -n G -d N`` (G tokens generated after N tokens of
  context, tg: the same context as ours) with ``-r 1 -o jsonl``; no sampling.
- **llama-completion**: ``-p PROMPT -n G --ignore-eos --temp 0 -no-cnv`` with the chat-formatted prompt
  text (its token count is checked against ours), parsed from its ``prompt eval time`` / ``eval time`` lines.

% of roofline: bytes read per decode step (benchmarks/roofline.py: every weight multiplied once — the LM
head, not the input embedding table —, packed matrices by their packed bytes, + the KV cache at the mean
context N + G/2) / the copy bandwidth measured just before that round (benchmarks/common.py). llama.cpp's
% uses the same bytes (its KV cache is f16, ours in the activation dtype: a few % of a step at most here).

Output: a markdown report (default benchmarks/results/cpu_llamacpp.md) with the conditions (date, load
average at the start and the end, copy bandwidth per round, llama.cpp build), the value check and the tables.

Building llama.cpp (the version vendored in PyPI's llama-cpp-python 0.3.36 sdist; ~8 minutes on 2 cores)::

    python -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   # the sdist, .tar.gz
    tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
          -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAMA_CURL=OFF
    cmake --build llama-build --target llama-bench llama-quantize llama-completion
    export LLAMA_CPP_BIN=$PWD/llama-build/bin     # or --llama-bin llama-build/bin
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth_gbs, load_average, markdown_table  # noqa: E402
from llamacpp_output import parse_bench_jsonl, parse_completion_timings  # noqa: E402
from roofline import step_bytes  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.default_model import default_model_path  # noqa: E402

QUESTION = "What is the capital of France?"
FILES = ("q4_1", "bf16", "f32")
# ours on the quantized file as is: name → (label, activation dtype, quantized, activations)
NATIVE = {"default": ("native, fp32 act., int8 in the matmuls (default)", torch.float32, True, "auto"),
          "bf16": ("native, bf16 act.", torch.bfloat16, True, "auto"),
          "exact": ("native, fp32 act., exact", torch.float32, True, "exact")}
CONVERT = {"bf16": "BF16", "f32": "F32"}  # llama-quantize type names
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Ours:
    """One of our configurations: the LLM and its measurements per round."""

    label: str
    llm: mistral_kernels.LLM
    prompt: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    stats_decode: list[float] = field(default_factory=list)
    roofline_pct: list[float] = field(default_factory=list)


@dataclass
class Llama:
    """llama.cpp on one file: its measurements per round."""

    path: Path
    pp: list[float] = field(default_factory=list)
    tg: list[float] = field(default_factory=list)
    completion_prompt: list[float] = field(default_factory=list)
    completion_decode: list[float] = field(default_factory=list)
    tg_roofline_pct: list[float] = field(default_factory=list)
    prompt_tokens_seen: set[int] = field(default_factory=set)
    build: str = ""


def _tool(bin_dir: Path, name: str, args: list[str]) -> str:
    """Run a llama.cpp tool; its stdout + stderr. A failure raises with the tail of its output."""
    exe = bin_dir / name
    if not exe.is_file():
        raise FileNotFoundError(f"--llama-bin: {exe} does not exist (build llama.cpp: see this script's docstring)")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900, check=False)
    out = proc.stdout + "\n" + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return out


def convert(bin_dir: Path, src: Path, dst: Path, qtype: str, threads: int) -> None:
    """``llama-quantize --allow-requantize src dst qtype``: the same values, stored as qtype."""
    _tool(bin_dir, "llama-quantize", ["--allow-requantize", str(src), str(dst), qtype, str(threads)])


def tensor_types(path: Path) -> str:
    """'BF16 × 211, F32 × 61': the tensor types of a GGUF file (gguf package)."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(path).tensors)
    return ", ".join(f"{k} × {v}" for k, v in sorted(counts.items()))


def _named_weights(model: object) -> dict[str, torch.Tensor]:
    out = {"embed": model.embed, "norm": model.norm, "lm_head": model.lm_head}
    for i, layer in enumerate(model.layers):
        out.update({f"layers.{i}.{k}": v for k, v in vars(layer).items() if isinstance(v, torch.Tensor)})
    return out


def max_abs_diff(converted: Path, original: Path, dtype: torch.dtype) -> float:
    """Max |w_a − w_b| over every weight: ``converted`` loaded by our loader vs ``original`` dequantized at load."""
    a = _named_weights(mistral_kernels.load_model(converted, dtype=dtype, quantized=False))
    b = _named_weights(mistral_kernels.load_model(original, dtype=dtype, quantized=False))
    if a.keys() != b.keys():
        raise RuntimeError(f"{converted.name} and {original.name} load different weights: "
                           f"{sorted(a.keys() ^ b.keys())}")
    worst = 0.0
    for name, t in a.items():
        if t.shape != b[name].shape or t.dtype != b[name].dtype:
            raise RuntimeError(f"{name}: {tuple(t.shape)} {t.dtype} vs {tuple(b[name].shape)} {b[name].dtype}")
        worst = max(worst, (t.float() - b[name].float()).abs().max().item())
    return worst


@dataclass
class Prompt:
    """The prompt of every run: text, through the chat template or not."""

    text: str
    chat: bool


def readme_prompt(llm: mistral_kernels.LLM, tokens: int) -> Prompt:
    """The first ``tokens`` tokens (BOS included) of README.md as plain text."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    ids = llm.tokenizer.encode(text, add_special_tokens=False)[: tokens - 1]
    return Prompt(llm.tokenizer.decode(ids), chat=False)


def run_ours(o: Ours, new_tokens: int, bw: float, prompt: Prompt) -> int:
    """One generate of the prompt; appends the measurements; returns the prompt's token count."""
    llm = o.llm
    llm.engine.stats.__init__()  # reset the stats line's counters
    (c,) = llm.generate([prompt.text], chat=prompt.chat, max_new_tokens=new_tokens, ignore_eos=True)
    t = c.timings
    n_prompt = len(c.prompt_token_ids)
    o.prompt.append(n_prompt / (t.first_token - t.arrival))
    o.decode.append((len(c.token_ids) - 1) / (t.finished - t.first_token))
    o.stats_decode.append(llm.engine.stats.decode_tok_per_s)
    nbytes = step_bytes(llm.model, n_prompt + new_tokens / 2).total
    o.roofline_pct.append(100 * o.decode[-1] * nbytes / (bw * 1e9))
    return n_prompt


def run_llama(bin_dir: Path, lc: Llama, prompt_text: str, n_prompt: int, new_tokens: int, threads: int,
              nbytes: int, bw: float, completion: bool = True) -> None:
    """llama-bench pp + tg and one llama-completion on ``lc.path``; appends the measurements."""
    common = ["-m", str(lc.path), "-t", str(threads), "-r", "1", "-o", "jsonl"]
    (pp,) = parse_bench_jsonl(_tool(bin_dir, "llama-bench", [*common, "-p", str(n_prompt), "-n", "0"]))
    (tg,) = parse_bench_jsonl(_tool(bin_dir, "llama-bench", [*common, "-p", "0", "-n", str(new_tokens),
                                                             "-d", str(n_prompt)]))
    lc.pp.append(pp.avg_ts)
    lc.tg.append(tg.avg_ts)
    lc.tg_roofline_pct.append(100 * tg.avg_ts * nbytes / (bw * 1e9))
    lc.build = f"{tg.build_commit} ({tg.cpu_info})"
    if not completion:
        return
    out = _tool(bin_dir, "llama-completion", [
        "-m", str(lc.path), "-t", str(threads), "-tb", str(threads), "-p", prompt_text, "-n", str(new_tokens),
        "--ignore-eos", "--temp", "0", "-no-cnv", "-c", str(n_prompt + new_tokens + 16), "-s", "0"])
    timings = parse_completion_timings(out)
    lc.prompt_tokens_seen.add(timings.prompt_tokens)
    lc.completion_prompt.append(timings.prompt_tok_s)
    lc.completion_decode.append(timings.eval_tok_s)


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _rounds(xs: list[float]) -> str:
    return " ".join(f"{x:.3g}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", type=Path, default=os.environ.get("LLAMA_CPP_BIN"),
                    help="directory of llama-bench, llama-quantize, llama-completion (env LLAMA_CPP_BIN)")
    ap.add_argument("--model", type=Path, default=None, help="a quantized GGUF (default: the default model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--files", default=",".join(FILES), help=f"comma-separated subset of {','.join(FILES)}")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="prompt = README.md's first N tokens (0: the chat-formatted question)")
    ap.add_argument("--no-completion", action="store_true", help="llama-bench only (no llama-completion runs)")
    ap.add_argument("--native", default=",".join(NATIVE),
                    help=f"our configurations on the quantized file, a subset of {','.join(NATIVE)} (each holds "
                         "its own copy of the weights: a 7B file fits 24 GB with one or two)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "cpu_llamacpp.md")
    args = ap.parse_args()
    if args.llama_bin is None:
        ap.error("--llama-bin DIR (or LLAMA_CPP_BIN) is required: where llama-bench etc. are")
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    bad = [f for f in files if f not in FILES]
    if bad or not files:
        ap.error(f"--files: expected a comma-separated subset of {','.join(FILES)}, got {args.files!r}")
    natives = [n.strip() for n in args.native.split(",") if n.strip()]
    if not natives or any(n not in NATIVE for n in natives):
        ap.error(f"--native: expected a comma-separated subset of {','.join(NATIVE)}, got {args.native!r}")
    if args.rounds < 1 or args.new_tokens < 2 or args.threads < 1:
        ap.error("--rounds and --threads must be >= 1, --new-tokens >= 2")
    torch.set_num_threads(args.threads)
    model_path = args.model or default_model_path()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = load_average()
    bws = [copy_bandwidth_gbs()]
    print(f"start {started:%Y-%m-%d %H:%M} UTC, load {load_start}, copy bandwidth {bws[0]:.1f} GB/s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        gguf_files: dict[str, Path] = {"q4_1": model_path}
        checks: list[str] = []
        for f in files:
            if f in CONVERT:
                gguf_files[f] = Path(tmp) / f"{model_path.stem}.{CONVERT[f]}.gguf"
                convert(args.llama_bin, model_path, gguf_files[f], CONVERT[f], args.threads)
                dtype = DTYPES["bf16" if f == "bf16" else "fp32"]
                diff = max_abs_diff(gguf_files[f], model_path, dtype)
                checks.append(f"- {CONVERT[f]} file ({tensor_types(gguf_files[f])}) loaded by our loader vs the "
                              f"{model_path.name} dequantized at load to {dtype}: max |diff| = {diff:g}")
                print(checks[-1], flush=True)
                gc.collect()
        # Ours per file: Q4_1 native (two activation dtypes), the others dense from the Q4_1 file.
        ours: dict[str, list[Ours]] = {}
        for f in files:
            configs = [NATIVE[n] for n in natives] \
                if f == "q4_1" else [(f"dense {f}", DTYPES['bf16' if f == 'bf16' else 'fp32'], False, "auto")]
            ours[f] = [Ours(label, mistral_kernels.LLM(model_path, dtype=dt, quantized=q, max_batch=1,
                                                       prefix_caching=False, activations=act))
                       for label, dt, q, act in configs]
        llamas = {f: Llama(gguf_files[f]) for f in files}
        first = ours[files[0]][0].llm
        prompt = readme_prompt(first, args.prompt_tokens) if args.prompt_tokens else Prompt(QUESTION, chat=True)
        prompt_ids = first.prompt_ids(prompt.text, chat=prompt.chat)
        prompt_text = first.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        for group in ours.values():
            for o in group:  # warm-up
                o.llm.generate([prompt.text], chat=prompt.chat, max_new_tokens=4, ignore_eos=True)

        for r in range(args.rounds):
            bw = copy_bandwidth_gbs()
            bws.append(bw)
            print(f"round {r + 1}/{args.rounds}: copy bandwidth {bw:.1f} GB/s, load {load_average()}", flush=True)
            for f in files:
                nbytes = step_bytes(ours[f][0].llm.model, len(prompt_ids) + args.new_tokens / 2).total
                for o in ours[f]:
                    run_ours(o, args.new_tokens, bw, prompt)
                    print(f"  ours {f} {o.label}: prompt {o.prompt[-1]:.1f} tok/s, decode {o.decode[-1]:.1f} tok/s",
                          flush=True)
                lc = llamas[f]
                run_llama(args.llama_bin, lc, prompt_text, len(prompt_ids), args.new_tokens, args.threads, nbytes, bw,
                          completion=not args.no_completion)
                completion = (f", completion prompt {lc.completion_prompt[-1]:.1f} decode "
                              f"{lc.completion_decode[-1]:.1f}" if lc.completion_decode else "")
                print(f"  llama.cpp {f}: pp {lc.pp[-1]:.1f}, tg {lc.tg[-1]:.1f}{completion} tok/s", flush=True)
        bws.append(copy_bandwidth_gbs())
        load_end = load_average()
        ended = datetime.datetime.now(datetime.timezone.utc)
        nbytes_of = {f: step_bytes(ours[f][0].llm.model, len(prompt_ids) + args.new_tokens / 2) for f in files}

    text = report(args, model_path, files, ours, llamas, nbytes_of, prompt_ids, checks, bws,
                  (started, load_start), (ended, load_end), prompt)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"wrote {args.out}")


def report(args: argparse.Namespace, model_path: Path, files: list[str], ours: dict[str, list[Ours]],
           llamas: dict[str, Llama], nbytes_of: dict, prompt_ids: list[int], checks: list[str], bws: list[float],
           start: tuple[datetime.datetime, str], end: tuple[datetime.datetime, str], prompt: Prompt) -> str:
    """The markdown report: conditions, value check, decode and prompt tables."""
    n_prompt, g = len(prompt_ids), args.new_tokens
    dense_bf16 = _med(ours["bf16"][0].decode) if "bf16" in ours else None
    name = {f: model_path.name if f == "q4_1" else f.upper() for f in files}
    decode_rows, prompt_rows = [], []
    for f in files:
        lc = llamas[f]
        best_llama = max(_med(lc.tg), _med(lc.completion_decode))
        for o in ours[f]:
            d = _med(o.decode)
            goals = [(d > best_llama, f"{d / best_llama:.2f}× llama.cpp")]
            if f == "q4_1" and dense_bf16 is not None:
                goals.append((d > dense_bf16, f"{d / dense_bf16:.2f}× our dense bf16"))
            missed = [why for ok, why in goals if not ok]
            target = "MISSED: " + ", ".join(missed) if missed else "met"
            decode_rows.append([name[f], o.label, d, _med(o.stats_decode), _med(lc.tg), _med(lc.completion_decode),
                                d / _med(lc.tg), f"{nbytes_of[f].total / 1e6:.0f}", f"{_med(o.roofline_pct):.0f}%",
                                f"{_med(lc.tg_roofline_pct):.0f}%", f"{_rounds(o.decode)} / {_rounds(lc.tg)}", target])
            p = _med(o.prompt)
            prompt_rows.append([name[f], o.label, p, _med(lc.pp), _med(lc.completion_prompt), p / _med(lc.pp),
                                f"{_rounds(o.prompt)} / {_rounds(lc.pp)}"])
    loads = [float(x) for x in (start[1].split(" / ")[0], end[1].split(" / ")[0])]
    busy = max(loads) >= (os.cpu_count() or 1) / 2
    warning = (f"**Loaded machine**: load average {max(loads):.1f} on {os.cpu_count()} CPUs — the absolute tok/s "
               "are not an idle machine's; only the ratios of configurations measured interleaved mean something.\n"
               if busy else "")
    seen = sorted(set().union(*(lc.prompt_tokens_seen for lc in llamas.values())))
    token_note = "the same count" if seen == [n_prompt] else f"**{seen} tokens: not the same count**"
    build = next((lc.build for lc in llamas.values() if lc.build), "?")
    cmd = " ".join(sys.argv[1:])
    lines = [
        "# Ours vs llama.cpp on the same weights (CPU)",
        "",
        f"`python benchmarks/bench_llamacpp.py {cmd}`: {model_path.name}, {args.threads} threads on both sides, "
        f"{args.rounds} interleaved round(s), medians.",
        "",
        "**Conditions.** "
        f"{start[0]:%Y-%m-%d %H:%M} – {end[0]:%H:%M} UTC on {platform.node()} ({os.cpu_count()} CPUs, "
        f"{_cpu_model()}); load average (1 / 5 / 15 min) {start[1]} at the start, {end[1]} at the end; copy "
        f"bandwidth {_rounds(bws)} GB/s (start, before each round, end). llama.cpp: build {build}.",
        "",
        *([warning] if warning else []),
        (f"Prompt: {QUESTION!r} through the chat template" if prompt.chat else "Prompt: README.md's opening")
        + f" = {n_prompt} tokens (llama-completion tokenized the "
        f"same text to {token_note}); {g} greedy tokens, EOS ignored. llama-bench: pp = `-p {n_prompt} -n 0`, "
        f"tg = `-p 0 -n {g} -d {n_prompt}` (same context as ours, no sampling). Ours through `LLM.generate` "
        "(wall time: engine and sampling included; \"stats line\" = the engine's step time, as the CLI prints).",
        "",
        "Same values (converted with `llama-quantize --allow-requantize`):",
        "",
        *(checks or ["- (no converted file in this run)"]),
        "",
        "## Decode (batch 1, tok/s)",
        "",
        "Bytes per step: every weight multiplied once (packed bytes for Q4_1/Q8_0; the LM head, not the input "
        f"embedding rows) + the KV cache at the mean context {n_prompt + g / 2:.0f}; roofline = copy bandwidth "
        "measured before each round / bytes. Target: faster than llama.cpp (the faster of llama-bench and "
        "llama-completion) on the same file; Q4_1 native also faster than our dense bf16.",
        "",
        markdown_table(["file", "ours", "ours tok/s", "ours (stats line)", "llama-bench tg", "llama-completion",
                        "ours / llama-bench", "MB / step", "ours % roofline", "llama-bench % roofline",
                        "per round: ours / llama-bench", "target"], decode_rows),
        "",
        "## Prompt (tok/s)",
        "",
        "Ours: prompt tokens / time to first token (prefill + first sample).",
        "",
        markdown_table(["file", "ours", "ours tok/s", "llama-bench pp", "llama-completion", "ours / llama-bench",
                        "per round: ours / llama-bench"], prompt_rows),
        "",
    ]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
