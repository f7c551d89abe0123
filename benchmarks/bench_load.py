"""Checkpoint load benchmark: load time, GB/s, peak RSS / weight bytes, first-token latency, decode.

Writes a random checkpoint of a real architecture (Mistral-7B-v0.1's shape by default; every size is an
argument, e.g. ``--layers 6`` for a scaled-down run), makes sure its files are in the page cache, then in a
fresh process loads it with :func:`mistral_kernels.load_model` and measures:

- load seconds and GB/s (checkpoint bytes / load time, files in the page cache), next to the rate at which
  this machine hands out and first-touches new memory (a fresh 1 GiB tensor filled): a loader that copies
  into new memory cannot beat it;
- peak RSS added by the load / bytes of the loaded weights (the loader's memory overhead);
- first-token latency (prefill of an 8-token prompt right after loading: first touch of all weights) and
  decode tok/s over the next tokens, with % of roofline = weight bytes per token × tok/s / copy bandwidth.

Never part of the test suite (a 7B-shaped checkpoint is 14.5 GB on disk and in memory)::

    python benchmarks/bench_load.py                       # Mistral-7B shape, HF bf16, 33 shards: ~15 GB RAM + disk
    python benchmarks/bench_load.py --layers 6 --format gguf --gguf-type Q8_0 --out benchmarks/results/cpu_load.md
    python benchmarks/bench_load.py --layers 6 --pythonpath /path/to/other/checkout/python   # compare loaders
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from common import bench_parser, copy_bandwidth_gbs, markdown_table  # noqa: E402

from mistral_kernels.config import ModelConfig  # noqa: E402
from tests.helpers.random_checkpoints import write_random_checkpoint  # noqa: E402

CHILD = r"""
import json, sys, time
import torch
from mistral_kernels import load_model
from mistral_kernels.batch import AttentionBatch

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

path, decode_tokens = sys.argv[1], int(sys.argv[2])
dtype = None if sys.argv[3] == "auto" else getattr(torch, sys.argv[3])
base = status("VmRSS")
t0 = time.perf_counter()
model = load_model(path, dtype=dtype) if dtype is not None else load_model(path)
load_s = time.perf_counter() - t0
peak = status("VmHWM")
weights = model.config.num_parameters() * model.dtype.itemsize
prompt, bs = torch.arange(1, 9), 16
total = prompt.shape[0] + decode_tokens
table = list(range((total + bs - 1) // bs))
cache = model.new_cache(len(table), bs)
t0 = time.perf_counter()
logits = model.forward(prompt, AttentionBatch.build([table], [0], [prompt.shape[0]], bs, logits_sequences=[0]), cache)
token = logits[-1].argmax()
first_token_s = time.perf_counter() - t0
t0 = time.perf_counter()
for i in range(decode_tokens):
    batch = AttentionBatch.build([table], [prompt.shape[0] + i], [1], bs)
    token = model.forward(token.view(1), batch, cache)[-1].argmax()
decode_s = time.perf_counter() - t0
t0 = time.perf_counter()
fresh = torch.empty(1 << 30, dtype=torch.uint8).fill_(1)  # first touch of new memory: the loader's ceiling here
touch_gbs = fresh.numel() / (time.perf_counter() - t0) / 1e9
print(json.dumps({"touch_gbs": touch_gbs, "load_s": load_s, "base": base, "peak": peak, "weights": weights,
                  "dtype": str(model.dtype), "first_token_s": first_token_s, "decode_tok_s": decode_tokens / decode_s}))
"""


def mistral_7b(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                       head_dim=args.head_dim, hidden_dim=args.hidden, vocab_size=args.vocab, rope_theta=1e6,
                       max_position=32768)


def warm_page_cache(path: Path) -> int:
    """Read every file once (so the load is timed from the page cache); returns the bytes on disk."""
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    total = 0
    for f in files:
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while chunk := fh.read(64 << 20):
                    total += len(chunk)
    return total


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--hidden", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--format", choices=("hf", "consolidated", "gguf"), default="hf")
    p.add_argument("--file-dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--gguf-type", default="BF16", help="GGUF matrix type: F32, F16, BF16, Q8_0")
    p.add_argument("--shards", type=int, default=0, help="HF shards (default: ~450 MB each, like save_pretrained)")
    p.add_argument("--dtype", default="auto", help="load dtype: auto (the checkpoint's) or a torch dtype name")
    p.add_argument("--decode-tokens", type=int, default=8)
    p.add_argument("--dir", type=Path, help="where to write the checkpoint (default: a temporary directory)")
    p.add_argument("--pythonpath", help="load with the mistral_kernels package found here (compare loaders)")
    p.add_argument("--out", type=Path, help="append the markdown table to this file")
    args = p.parse_args()

    config = mistral_7b(args)
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_load_"))
    work.mkdir(parents=True, exist_ok=True)
    path = work / ("model.gguf" if args.format == "gguf" else "model")
    file_dtype = getattr(torch, args.file_dtype)
    if not path.exists():
        shards = args.shards or max(1, round(config.num_parameters() * file_dtype.itemsize / 450e6))
        t0 = time.perf_counter()
        write_random_checkpoint(config, path, args.format, file_dtype, shards=shards, gguf_type=args.gguf_type,
                                seed=None)  # a fixed pattern: fast to write, and timings do not depend on values
        print(f"wrote {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    disk = warm_page_cache(path)
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.decode_tokens), args.dtype],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(run.stderr)
    r = json.loads(run.stdout.strip().splitlines()[-1])
    bandwidth = copy_bandwidth_gbs()
    roofline = r["weights"] * r["decode_tok_s"] / 1e9 / bandwidth
    shape = (f"L={config.n_layers} H={config.dim} Hq={config.n_heads} Hkv={config.n_kv_heads} "
             f"D={config.head_dim} I={config.hidden_dim} V={config.vocab_size}")
    kind = args.format + (f" {args.gguf_type}" if args.format == "gguf" else f" {args.file_dtype}")
    row = [kind, shape, f"{disk / 1e9:.2f}", r["dtype"].removeprefix("torch."), f"{r['load_s']:.2f}",
           f"{disk / r['load_s'] / 1e9:.2f}", f"{r['touch_gbs']:.2f}", f"{(r['peak'] - r['base']) / r['weights']:.3f}",
           f"{r['first_token_s']:.2f}", f"{r['decode_tok_s']:.2f}", f"{100 * roofline:.0f} %"]
    table = markdown_table(["checkpoint", "shape", "file GB", "loaded as", "load s", "GB/s",
                            "new-memory GB/s", "peak RSS / weights",
                            "first token s", "decode tok/s", "% roofline"], [row])
    note = (f"\n{args.pythonpath or 'this checkout'}; copy bandwidth {bandwidth:.1f} GB/s; "
            f"{os.cpu_count()} CPUs; files in the page cache\n")
    print(table + note)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + note + "\n")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
