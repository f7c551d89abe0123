"""Speculative decoding on the CPU: decode tok/s and acceptance, speculative vs plain, and the verify-step
cost table behind the adaptive rule (``mistral_kernels.speculative.cost``).

    python benchmarks/bench_speculative.py [--rounds 3] [--new-tokens 128] [--ks 3] [--gguf7b PATH]
                                           [--out benchmarks/results/cpu_speculative.md]

One process, one loaded model (the default SmolLM2-135M-Instruct Q4_1 GGUF, its checkpoint dtype), engines on
it with and without speculation, rounds interleaved (plain, speculative, plain, ...), medians reported:

(a) input-grounded: "copy this text word for word" (a ~100-token passage; the chat model mostly copies,
    sometimes shortens), greedy, n-gram proposals of at most k = each of --ks at batch 1 — adaptive (the
    default: k per request from its acceptance and the row cost measured when the engine starts) and fixed k
    (``adaptive=False``) — and adaptive at the default k at batch 2 (a different passage each);
(b) all proposals rejected: open generation with a proposer that always proposes a token the model never
    picks — the verify overhead with adaptive speculation (the default), and with a fixed k (every step
    verifies);
(c) cost model: one fused decode step of B sequences × (k+1) verify rows vs one of B rows (plain), B = 1 … 8,
    k = 1 … 8 — the ratio a verify step must beat with its accepted tokens;
(d) with --gguf7b: the same ratio at B = 1 on the 7B-shaped GGUF (random weights: no acceptance figure);
(e) with --llama-bin DIR: llama.cpp on the same file and threads — its prompt-lookup decoding (``llama-lookup
    --draft-max K --temp 0``, built with ``-DLLAMA_BUILD_EXAMPLES=ON``; its n-grams of 1 … 4 tokens) on the
    copy task's first passage (the chat-formatted text, token count checked against ours) against its plain
    decode (``llama-bench -p 0 -n G -d P``: G tokens after P of context, the same lengths), interleaved rounds,
    next to ours (plain, fixed k = K) on the same prompt.

Decode tok/s = tokens of decode steps / their time (the engine's stats: prefill excluded), so (a) and (b)
compare the decoding part, where speculation acts.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, command_line, markdown_table  # noqa: E402

import mistral_kernels  # noqa: E402
from mistral_kernels.batch import AttentionBatch  # noqa: E402
from mistral_kernels.engine import Engine  # noqa: E402
from mistral_kernels.ops import device_index_checks  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402
from mistral_kernels.speculative import Proposal, SpeculativeConfig  # noqa: E402
from mistral_kernels.stats import EngineStats  # noqa: E402

PASSAGES = [
    "The harbour town woke slowly. Fishing boats rocked against the pier while gulls argued over the nets, and "
    "the baker on the corner opened his shutters to let the smell of bread into the street. By seven the market "
    "was full: farmers from the hills sold cheese and apples, a woman with a red scarf sold knitted hats, and "
    "children ran between the stalls with their dogs. The mayor walked past at eight, as he did every morning, "
    "greeting everyone by name and asking about their families, their harvests and their boats.",
    "To install the package, first create a virtual environment and activate it. Then run pip install with the "
    "name of the package, and check that the command line tool is on your path by running it with the version "
    "flag. If the installation fails because a compiler is missing, install the build tools of your platform "
    "and try again. The configuration file lives in your home directory; copy the example file there, edit "
    "the paths to match your system, and restart the service so that it reads the new settings.",
    "Photosynthesis turns light into chemical energy. In the leaves, chlorophyll absorbs red and blue light and "
    "uses its energy to split water, releasing oxygen. The hydrogen and the energy captured are then used to "
    "turn carbon dioxide from the air into sugars, which the plant uses to grow and to store energy for the "
    "night. Most of the oxygen in the atmosphere was made this way, over billions of years, by plants, algae "
    "and bacteria living in the oceans and on land.",
    "The meeting began at nine with a short review of the last quarter. Sales had grown in the north and the "
    "east, but the south had lost two large customers, and the team discussed why. The new product would ship "
    "in March if the tests passed, and the marketing plan was ready. Before lunch everyone agreed on three "
    "goals for the next quarter: keep the customers we have, finish the product on time, and hire two more "
    "engineers for the support team.",
]
OPEN = ["Tell me a story about a dragon who learns to cook.", "What are the benefits of regular exercise?",
        "Explain how a bicycle works.", "Write a letter to a friend about your holiday."]


class NeverRight:
    """Proposes a token the model does not pick (the last vocabulary id) k times: every proposal is rejected."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, requests, k):
        return [Proposal([self.token] * n) for n in k]

    def forget(self, rid: int) -> None:
        return None


def decode_run(engine: Engine, jobs: list) -> tuple[float, float, float, list[list[int]]]:
    """(decode tok/s, acceptance rate, process CPU seconds of the whole call, outputs) of one generate call on a
    fresh stats counter."""
    engine.stats = EngineStats()
    cpu = time.process_time()
    done = engine.generate(jobs)
    cpu = time.process_time() - cpu
    s = engine.stats
    return s.decode_tok_per_s, s.spec_acceptance_rate, cpu, [c.token_ids for c in done]


def compare(engines: dict[str, Engine], jobs: list,
            rounds: int) -> dict[str, tuple[float, float, list[float], list[float]]]:
    """Per engine over interleaved rounds: median decode tok/s, median acceptance, its per-round tok/s ratios to
    the first engine's (the plain one, run first in each round), and per round the plain run's process CPU
    seconds / this engine's (whole calls: less sensitive to other jobs than wall time); outputs must agree."""
    tps: dict[str, list[float]] = {k: [] for k in engines}
    acc: dict[str, list[float]] = {k: [] for k in engines}
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    ref = None
    for _ in range(rounds):
        for name, engine in engines.items():
            t, a, c, out = decode_run(engine, jobs)
            tps[name].append(t)
            acc[name].append(a)
            cpu[name].append(c)
            if ref is None:
                ref = out
            elif out != ref:
                raise RuntimeError(f"{name}: greedy outputs differ from plain decoding")
    base = tps[next(iter(engines))]
    first = cpu[next(iter(engines))]
    return {k: (statistics.median(tps[k]), statistics.median(acc[k]), [t / b for t, b in zip(tps[k], base)],
                [b / c for b, c in zip(first, cpu[k])]) for k in engines}


def ratio_cells(ratios: list[float]) -> list[object]:
    """The median of the per-round ratios and their range."""
    return [statistics.median(ratios), f"{min(ratios):.2f}–{max(ratios):.2f}"]


def step_cost(model, cache, batch: int, rows: int, reps: int) -> float:
    """Median seconds of one decode-path forward: ``batch`` sequences, ``rows`` rows each (rows > 1: verify rows
    of one sequence at consecutive positions, its block table shared)."""
    bs, ctx = 16, 300
    tables, cached = [], []
    for b in range(batch):
        table = [1 + b * 40 + i for i in range(40)]
        for j in range(rows):
            tables.append(table)
            cached.append(ctx + j)
    n = len(cached)
    ids = torch.randint(100, 1000, (n,))
    batch_md = AttentionBatch.build(tables, cached, [1] * n, bs, "cpu")
    times = []
    with device_index_checks(False):
        model.forward(ids, batch_md, cache)
        for _ in range(reps):
            t0 = time.perf_counter()
            model.forward(ids, batch_md, cache)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cost_table(model, batches: list[int], ks: list[int], reps: int) -> list[list[object]]:
    cache = model.new_cache(8 * 40 + 1, 16)
    rows = []
    for b in batches:
        plain = step_cost(model, cache, b, 1, reps)
        ratios = [step_cost(model, cache, b, k + 1, reps) / plain for k in ks]
        rows.append([b, plain * 1e3, *ratios])
    return rows


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def lookup_vs_llamacpp(bin_dir: Path, llm, engines: dict[str, Engine], ids: list[int], new_tokens: int, k: int,
                       rounds: int) -> tuple[list[list[object]], str]:
    """Part (e): llama-lookup vs llama-bench's plain decode on our default model file, ours alongside."""
    path = str(llm.path)
    text = llm.tokenizer.decode(ids, skip_special_tokens=False)
    threads = str(torch.get_num_threads())
    lk = {"plain": [], "lookup": [], "accept": []}
    n_input = None
    ours = {name: [] for name in engines}
    ours_acc = []
    for _ in range(rounds):
        log = _run([str(bin_dir / "llama-lookup"), "-m", path, "-p", text, "-n", str(new_tokens), "-t", threads,
                    "--spec-draft-n-max", str(k), "--temp", "0", "-c", "2048"])
        n_input = int(re.search(r"encoded\s+(\d+) tokens", log).group(1))
        lk["lookup"].append(float(re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", log).group(1)))
        lk["accept"].append(float(re.search(r"accept\s+=\s+([\d.]+)%", log).group(1)) / 100)
        bench = _run([str(bin_dir / "llama-bench"), "-m", path, "-p", "0", "-n", str(new_tokens), "-d", str(len(ids)),
                      "-t", threads, "-r", "1", "-o", "jsonl"])
        lk["plain"].append(float(json.loads(bench.strip().splitlines()[-1])["avg_ts"]))
        for name, eng in engines.items():
            t, a, _, _ = decode_run(eng, [(ids, SamplingParams(max_new_tokens=new_tokens))])
            ours[name].append(t)
            if name != "plain":
                ours_acc.append(a)
    med = statistics.median
    spec = next(n for n in engines if n != "plain")
    rows = [[f"llama.cpp (llama-lookup --spec-draft-n-max {k})", med(lk["plain"]), med(lk["lookup"]),
             f"{med(lk['lookup']) / med(lk['plain']):.2f}×", f"{med(lk['accept']):.1%}"],
            [f"ours ({spec})", med(ours["plain"]), med(ours[spec]), f"{med(ours[spec]) / med(ours['plain']):.2f}×",
             f"{med(ours_acc):.1%}"]]
    note = (f"Prompt: {len(ids)} tokens ours, {n_input} as llama-lookup tokenized the same text"
            + ("" if n_input == len(ids) else " (not the same count)") + f"; {new_tokens} new tokens at most, "
            "greedy (llama-lookup's 'accept' is accepted / drafted tokens, ours accepted / proposed).")
    return rows, note


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--ks", default="3", help="proposals per step (num_speculative_tokens) to compare in (a)")
    ap.add_argument("--gguf7b", type=Path, default=None, help="the 7B-shaped GGUF for the cost ratio (d)")
    ap.add_argument("--reps", type=int, default=7, help="timed forwards per cost-model cell")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    ap.add_argument("--parts", default="abc", help="which of (a), (b), (c) to run (default all: abc)")
    ap.add_argument("--llama-bin", type=Path, default=None,
                    help="llama.cpp's bin directory (llama-lookup, llama-bench): part (e)")
    args = ap.parse_args()

    load_before = os.getloadavg()
    llm = mistral_kernels.LLM()
    model, tok = llm.model, llm.tokenizer
    blocks = 1024

    def engine(spec: SpeculativeConfig | None, proposer=None, max_batch: int = 2) -> Engine:
        # prefix caching off: every round prefills the whole prompt alike (with int8 activations a prompt's
        # cached prefix + a short recomputed tail is not bit-identical to one long prefill: README, --activations)
        return Engine(model, tok, num_blocks=blocks, block_size=16, max_batch=max_batch, speculative=spec,
                      proposer=proposer, prefix_caching=False)

    out = [f"# Speculative decoding on the CPU (`benchmarks/bench_speculative.py`)", "", command_line(__file__), ""]
    params = SamplingParams(max_new_tokens=args.new_tokens)
    grounded = [llm.prompt_ids("Copy this text word for word:\n\n" + p, chat=True) for p in PASSAGES]
    rows = []
    ks = [int(k) for k in args.ks.split(",")]
    default_k = SpeculativeConfig().num_tokens
    measured: list[float] = []
    for batch, kk in ((1, ks), (2, [default_k])) if "a" in args.parts else ():
        jobs = [(grounded[i], params) for i in range(batch)]
        engines = {"plain": engine(None)}
        for k in kk:
            engines[f"adaptive k≤{k}"] = engine(SpeculativeConfig(num_tokens=k))
            measured.append(engines[f"adaptive k≤{k}"].speculative_cost.row_cost)
            if batch == 1:
                engines[f"fixed k={k}"] = engine(SpeculativeConfig(num_tokens=k, adaptive=False))
        res = compare(engines, jobs, args.rounds)
        for name in engines:
            if name != "plain":
                got = res[name]
                rows.append([f"(a) copy a passage, batch {batch}, {name}", res["plain"][0], got[0],
                             *ratio_cells(got[2]), f"{got[1]:.1%}"])
                print(rows[-1], flush=True)
    b_note = ""
    if "b" in args.parts:
        wrong = NeverRight(model.config.vocab_size - 1)
        jobs = [(llm.prompt_ids(OPEN[0], chat=True), SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True))]
        engines_b = {"plain": engine(None),
                     "adaptive": engine(SpeculativeConfig(method="draft", draft_model="-"), wrong),
                     "fixed": engine(SpeculativeConfig(method="draft", draft_model="-", adaptive=False), wrong)}
        rho_b = engines_b["adaptive"].speculative_cost.row_cost
        measured.append(rho_b)
        res = compare(engines_b, jobs, args.rounds)
        for name, label in (("adaptive", f"(b) all rejected, adaptive k≤{default_k}"),
                            ("fixed", f"(b) all rejected, fixed k={default_k}")):
            rows.append([label, res["plain"][0], res[name][0], *ratio_cells(res[name][2]), f"{res[name][1]:.1%}"])
            print(rows[-1], flush=True)
        backed = engines_b["adaptive"].stats  # the last round's counts (the same every round: greedy, fixed proposer)
        decode_steps = backed.steps - 1
        b_note = (f"(b) adaptive: the request verified in {backed.spec_verify_steps} of {decode_steps} decode steps "
                  f"({backed.spec_proposed_tokens} proposed tokens: {default_k} in its first verify step, then "
                  f"probes of one); at the row cost its engine measured at start (ρ = {rho_b:.2f}) that is "
                  f"{backed.spec_proposed_tokens * rho_b / decode_steps:.1%} more decode time: the overhead the cost "
                  "model predicts. Row costs measured by the engines of this run at their start: "
                  + ", ".join(f"{r:.2f}" for r in measured) + ". Process CPU time (whole calls), plain / adaptive: "
                  "median {:.3f} (range {:.2f}–{:.2f}); plain / fixed: median {:.3f}.".format(
                      statistics.median(res["adaptive"][3]), min(res["adaptive"][3]), max(res["adaptive"][3]),
                      statistics.median(res["fixed"][3])))

    out += [f"SmolLM2-135M-Instruct Q4_1 (native packed kernels, {model.dtype}), CPU, {torch.get_num_threads()} "
            f"threads; greedy, {args.new_tokens} new tokens, n-gram proposals (n 4 … 2), "
            f"tok/s: medians of {args.rounds} interleaved rounds; speed-up: the median of the per-round ratios "
            "(speculative / the plain run of the same round); outputs checked identical to plain decoding.", "",
            markdown_table(["task", "plain decode tok/s", "speculative decode tok/s", "speed-up (median of rounds)",
                            "per-round range", "accepted"], rows), ""]

    if "c" in args.parts:
        cks = [1, 2, 3, 4, 6, 8]
        cost = cost_table(model, [1, 2, 4, 8], cks, args.reps)
        out += ["(c) Cost model: one decode step with B sequences of k+1 verify rows each, relative to one plain step "
                "of B rows (fused CPU decode step up to 16 rows, per-op decode path above).", "",
                markdown_table(["B", "plain step ms", *[f"k={k}" for k in cks]], cost), ""]
        print(cost, flush=True)
    if b_note:
        out += [b_note, ""]
    if args.gguf7b is not None:
        big = mistral_kernels.LLM(args.gguf7b, num_blocks=64, max_batch=1)
        ks7 = [1, 2, 4, 8]
        cost7 = cost_table(big.model, [1], ks7, max(3, args.reps // 2))
        out += [f"(d) {args.gguf7b.name} (Mistral-7B shapes, {big.model.config.n_layers} layers, random weights): "
                "verify step of k+1 rows vs a plain step, batch 1.", "",
                markdown_table(["B", "plain step ms", *[f"k={k}" for k in ks7]], cost7), ""]
        print(cost7, flush=True)
    if args.llama_bin is not None:
        k = ks[0]
        ids = grounded[0]
        eng = {"plain": engine(None, max_batch=1), f"fixed k={k}": engine(SpeculativeConfig(num_tokens=k, adaptive=False),
                                                                           max_batch=1)}
        rows_e, note = lookup_vs_llamacpp(args.llama_bin, llm, eng, ids, args.new_tokens, k, args.rounds)
        out += [f"(e) llama.cpp's prompt lookup on the same file ({Path(llm.path).name}), copy task passage 1, "
                f"{torch.get_num_threads()} threads both sides, {args.rounds} interleaved rounds (medians); "
                "decode tok/s (llama-lookup: generated tokens / its decode time; ours: the engine's decode steps).",
                "", markdown_table(["", "plain decode tok/s", "lookup / n-gram decode tok/s", "speed-up",
                                    "accepted"], rows_e), "", note, ""]
        print(rows_e, note, flush=True)
    load_after = os.getloadavg()
    out += [f"Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after: the 2-core machine was "
            "shared with other jobs during the run."]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
