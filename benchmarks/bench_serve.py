"""Load test of ``mistral-kernels serve`` over the OpenAI API, next to llama-server on the same GGUF file.

Each run: C concurrent streaming clients send ``C × --requests-per-client`` chat requests (a client sends
its next request when the previous one ends; ``max_tokens`` with ``ignore_eos``, temperature 0). Measured
by the clients: aggregate output tokens/s (the servers' ``usage``, over the run's wall time), time to
first token (median, p90) and the gap between content chunks of a stream (inter-token latency, median).
Each request's user message starts with its own number, so no prompt repeats (neither server answers from a
cached copy of the whole prompt); the chat template's system part is common to all, as with real clients.

Recipe (the comparison of benchmarks/results/cpu_serve.md): both servers up at once on the default model's
file, ours with its defaults (no ``--max-batch`` / ``--max-tokens-per-step`` / ``--dtype``: sized at startup,
see python/mistral_kernels/engine_sizing.py), llama-server with the same 2 threads, 32 slots and 1024
tokens of context per slot (``-t 2 -tb 2 -np 32 -c 32768``); runs interleaved — for each round, for each
concurrency, ours then llama-server — and the medians over rounds reported, with the load average before
each run (the machine is shared; ``--llama-no-poll`` adds llama-server with ``--poll 0``, whose threads do
not spin while they wait — llama.cpp's default spinning loses most of its time when other processes want
the cores):

    python benchmarks/bench_serve.py --concurrency 1,8,32 --rounds 2 --requests-per-client 1 \\
        --llama-server /work/llama/llama-build/bin/llama-server --llama-no-poll \\
        --out benchmarks/results/cpu_serve.md

Only ours: leave out ``--llama-server``; a running server: ``--url`` (then nothing is started).
Head of line: ``--head-of-line 3000 --rounds 2`` prints, per round, the time to first token of a short chat
request sent 1 s after a 3,000-token prompt, the long prompt's total time and the load average.
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
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, command_line  # noqa: E402

PROMPTS = ["Write a haiku about the sea.", "Explain what a CPU cache is.", "Give three tips for learning Go.",
           "What is the capital of Italy?", "Describe a sunset in two sentences.", "Why is the sky blue?",
           "List four fruits.", "Summarize the plot of a heist movie."]


@dataclass
class Result:
    ttft: float
    gaps: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class Run:
    server: str
    clients: int
    seconds: float
    load: float
    results: list[Result]

    @property
    def tokens_per_s(self) -> float:
        return sum(r.output_tokens for r in self.results) / self.seconds


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
            result.prompt_tokens = chunk.usage.prompt_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            if last is None:
                result.ttft = now - t0
            else:
                result.gaps.append(now - last)
            last = now
    return result


async def _run(url: str, model: str, clients: int, requests: int, max_tokens: int,
               first: int) -> tuple[list[Result], float]:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    todo = list(range(requests))
    results: list[Result] = []

    async def worker() -> None:
        while todo:
            i = todo.pop(0)
            prompt = f"Request {first + i}. {PROMPTS[i % len(PROMPTS)]}"
            results.append(await _one(client, model, prompt, max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    await client.close()
    return results, time.perf_counter() - t0


async def _head_of_line(url: str, long_tokens: int, rounds: int) -> list[tuple[float, float, float]]:
    """(short request's TTFT, long prompt's total time, load) per round: a ``long_tokens``-token prompt (token
    ids, completions API) is sent, and 1 s later a short chat request, while the long one is being prefilled."""
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    out = []
    for rnd in range(rounds):
        long_ids = [(7 * i + 3 + rnd) % 20000 + 100 for i in range(long_tokens)]
        t0 = time.perf_counter()
        long = asyncio.create_task(client.completions.create(model="bench", prompt=long_ids, max_tokens=1))
        await asyncio.sleep(1.0)
        load = os.getloadavg()[0]
        short = await _one(client, "bench", f"Round {rnd}. What is the capital of France?", 8)
        await long
        out.append((short.ttft, time.perf_counter() - t0, load))
    await client.close()
    return out


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, name: str) -> None:
    deadline = time.time() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"bench_serve: {name} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise SystemExit(f"bench_serve: {name} did not come up in 600 s")
        time.sleep(0.3)


def _start_ours(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "mistral_kernels", "serve", "--port", str(port), "--served-model-name",
           "bench", "--device", args.device]
    for flag, value in (("--max-batch", args.max_batch), ("--max-tokens-per-step", args.max_tokens_per_step),
                        ("--dtype", args.dtype), ("--model", args.model)):
        if value is not None:
            cmd += [flag, str(value)]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(proc, url, "mistral-kernels serve")
    return proc, url


def _start_llama(args: argparse.Namespace, gguf: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [args.llama_server, "-m", gguf, "-t", str(args.threads), "-tb", str(args.threads), "-np",
           str(args.llama_slots), "-c", str(args.llama_slots * 1024), "--port", str(port), "--no-webui", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(proc, url, "llama-server")
    return proc, url


def _row(runs: list[Run]) -> str:
    ttft = [r.ttft for run in runs for r in run.results]
    gaps = [g for run in runs for r in run.results for g in r.gaps]
    tps = statistics.median(run.tokens_per_s for run in runs)
    prompt = statistics.median(r.prompt_tokens for run in runs for r in run.results)
    loads = ", ".join(f"{run.load:.1f}" for run in runs)
    return (f"| {runs[0].server} | {runs[0].clients} | {len(runs[0].results)} | {prompt:.0f} | {tps:.1f} | "
            f"{statistics.median(ttft) * 1e3:.0f} | {_percentile(ttft, 90) * 1e3:.0f} | "
            f"{statistics.median(gaps) * 1e3 if gaps else float('nan'):.0f} | {loads} |")


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--url", help="a running server (default: start ours)")
    p.add_argument("--model", help="model for our server (default: the default model)")
    p.add_argument("--concurrency", default="1,8,32", help="client counts, comma-separated (1,8,32)")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; medians over them (2)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-batch", type=int, help="our --max-batch (default: the server's)")
    p.add_argument("--max-tokens-per-step", type=int, help="our --max-tokens-per-step (default: the server's)")
    p.add_argument("--dtype", help="our --dtype (default: the server's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--llama-server", help="llama-server binary: also run it on the same GGUF file")
    p.add_argument("--llama-slots", type=int, default=32, help="llama-server -np (32)")
    p.add_argument("--threads", type=int, default=2, help="llama-server -t / -tb (2)")
    p.add_argument("--llama-no-poll", action="store_true",
                   help="also run a llama-server with --poll 0 (its threads sleep instead of spinning while they "
                        "wait: on a machine shared with other jobs it loses far less time)")
    p.add_argument("--head-of-line", type=int, metavar="TOKENS",
                   help="instead: the TTFT of a short request sent 1 s after a prompt of TOKENS tokens (our server)")
    p.add_argument("--out", help="write a markdown report here")
    args = p.parse_args()
    from mistral_kernels.default_model import default_model_path

    gguf = args.model or str(default_model_path())
    procs: list[subprocess.Popen[bytes]] = []
    servers: dict[str, str] = {}
    try:
        if args.url:
            servers["ours"] = args.url
        else:
            proc, servers["mistral-kernels"] = _start_ours(args)
            procs.append(proc)
        if args.llama_server:
            proc, servers["llama-server"] = _start_llama(args, gguf, [])
            procs.append(proc)
            if args.llama_no_poll:
                proc, servers["llama-server --poll 0"] = _start_llama(args, gguf, ["--poll", "0"])
                procs.append(proc)
        for name, url in servers.items():  # warm-up
            asyncio.run(_run(url, "bench", 1, 1, 4, 10**6))
        if args.head_of_line:
            for ttft, total, load in asyncio.run(_head_of_line(servers[next(iter(servers))], args.head_of_line,
                                                               args.rounds)):
                print(f"| {args.head_of_line} | {ttft:.2f} | {total:.1f} | {load:.1f} |", flush=True)
            return
        runs: dict[tuple[str, int], list[Run]] = {}
        counter = 0
        for rnd in range(args.rounds):
            for clients in (int(c) for c in args.concurrency.split(",")):
                for name, url in servers.items():
                    n = clients * args.requests_per_client
                    load = os.getloadavg()[0]
                    results, seconds = asyncio.run(_run(url, "bench", clients, n, args.max_tokens, counter))
                    counter += n
                    run = Run(name, clients, seconds, load, results)
                    runs.setdefault((name, clients), []).append(run)
                    print(f"round {rnd} {name} c={clients}: {run.tokens_per_s:.1f} tok/s, TTFT median "
                          f"{statistics.median(r.ttft for r in results) * 1e3:.0f} ms (load {load:.1f})",
                          flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(60)
    table = ("| server | clients | requests/run | prompt tokens | output tok/s (median of rounds) | TTFT median ms | "
             "TTFT p90 ms | inter-token median ms | load avg before each run |\n|---|---|---|---|---|---|---|---|---|\n"
             + "\n".join(_row(rs) for rs in runs.values()))
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("# `mistral-kernels serve` vs llama-server, same GGUF file\n\n"
                    f"{command_line(__file__)}\n\n"
                    f"Model: {gguf}. Ours with its defaults unless the command says otherwise; llama-server "
                    f"`-t {args.threads} -tb {args.threads} -np {args.llama_slots} -c {args.llama_slots * 1024}`. "
                    f"{args.max_tokens} tokens per request (ignore_eos), {args.rounds} interleaved rounds. Machine: "
                    f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.platform()}), shared with other jobs "
                    "(load average per run in the table).\n\n"
                    f"{table}\n")


if __name__ == "__main__":
    main()
