"""Load test of ``mistral-kernels serve`` over the OpenAI API: N concurrent streaming clients.

Starts the server as a subprocess (or uses ``--url`` of a running one), sends ``--requests`` chat requests
from ``--clients`` concurrent clients (each client sends its next request when the previous one ends), and
reports requests/s, output tokens/s, time to first token and inter-token latency (p50 / p99) as measured by
the clients. Output tokens come from the server's ``usage`` (``stream_options.include_usage``); the
inter-token latency is the gap between successive content chunks of one stream.

    python benchmarks/bench_serve.py --clients 8 --requests 32 --max-tokens 32 \\
        --out benchmarks/results/cpu_serve.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field

import httpx
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser  # noqa: E402

PROMPTS = ["Write a haiku about the sea.", "Explain what a CPU cache is.", "Give three tips for learning Go.",
           "What is the capital of Italy?", "Describe a sunset in two sentences.", "Why is the sky blue?",
           "List four fruits.", "Summarize the plot of a heist movie."]


@dataclass
class Result:
    ttft: float
    gaps: list[float] = field(default_factory=list)
    output_tokens: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


async def _one(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int) -> Result:
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    last: float | None = None
    result = Result(ttft=float("nan"))
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            result.output_tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            if last is None:
                result.ttft = now - t0
            else:
                result.gaps.append(now - last)
            last = now
    return result


async def _run(url: str, model: str, clients: int, requests: int, max_tokens: int) -> tuple[list[Result], float]:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    todo = list(range(requests))
    results: list[Result] = []

    async def worker() -> None:
        while todo:
            i = todo.pop()
            results.append(await _one(client, model, PROMPTS[i % len(PROMPTS)], max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return results, time.perf_counter() - t0


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "mistral_kernels", "serve", "--port", str(port), "--served-model-name",
           args.model_name, "--max-batch", str(args.max_batch), "--device", args.device, "--dtype", args.dtype]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"bench_serve: the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise SystemExit("bench_serve: the server did not come up in 300 s")
        time.sleep(0.3)


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--url", help="a running server (default: start one)")
    p.add_argument("--model", help="model path for the started server (default model if omitted)")
    p.add_argument("--model-name", default="bench", help="served model name (bench)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", help="write a markdown report here")
    args = p.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = _start_server(args)
    try:
        asyncio.run(_run(url, args.model_name, 1, 1, 4))  # warm-up
        results, seconds = asyncio.run(_run(url, args.model_name, args.clients, args.requests, args.max_tokens))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    out_tokens = sum(r.output_tokens for r in results)
    ttft = [r.ttft for r in results]
    itl = [g for r in results for g in r.gaps]
    rows = [("requests", f"{len(results)}"), ("concurrent clients", f"{args.clients}"),
            ("max_tokens (ignore_eos)", f"{args.max_tokens}"), ("server --max-batch", f"{args.max_batch}"),
            ("wall time", f"{seconds:.2f} s"), ("requests/s", f"{len(results) / seconds:.2f}"),
            ("output tokens/s", f"{out_tokens / seconds:.1f}"),
            ("TTFT p50 / p99", f"{_percentile(ttft, 50) * 1e3:.0f} / {_percentile(ttft, 99) * 1e3:.0f} ms"),
            ("inter-token latency p50 / p99",
             f"{_percentile(itl, 50) * 1e3:.0f} / {_percentile(itl, 99) * 1e3:.0f} ms"),
            ("inter-token latency mean", f"{statistics.fmean(itl) * 1e3:.0f} ms" if itl else "n/a")]
    table = "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    print(table)
    if args.out:
        model = args.model or "default model (SmolLM2-135M-Instruct Q4_1 GGUF)"
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("# `mistral-kernels serve` load test\n\n"
                    f"`python benchmarks/bench_serve.py --clients {args.clients} --requests {args.requests} "
                    f"--max-tokens {args.max_tokens} --max-batch {args.max_batch}`\n\n"
                    f"Model: {model}, {args.device}, {args.dtype}. Machine: {platform.machine()}, "
                    f"{os.cpu_count()} CPUs ({platform.platform()}); measured by the clients over HTTP, "
                    "on a shared machine (other jobs running), so read the numbers as an order of magnitude.\n\n"
                    f"{table}\n")


if __name__ == "__main__":
    main()
