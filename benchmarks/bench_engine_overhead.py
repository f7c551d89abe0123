"""Per-step engine overhead around the forward of a batch-1 greedy decode: where the time outside
``Model.forward`` goes, for two Python trees (e.g. main's and a branch's) measured alternately.

    python benchmarks/bench_engine_overhead.py [--trees base=/work/main/python,new=python] [--rounds 3]
        [--steps 64] [--dtype bf16,fp32] [--quantized 1,0] [--path generate,stream] [--wait-policy ""]
        [--threads 2] [--profile] [--ops]

Each measurement is one worker process (``--worker``) that loads SmolLM2-135M-Instruct (the default GGUF)
with the given tree first on ``sys.path``, prefills a 42-token prompt, then decodes ``--steps`` greedy tokens
(ignore EOS) through ``Engine.step`` (``generate``: the loop of ``LLM.generate``) or ``LLM.stream`` (``stream``:
the CLI's loop: pieces written to a text sink). Timers wrap the engine's parts on the instance (they exist in
every tree): ``Scheduler.schedule``/``commit``, ``ModelRunner.execute``, ``Model.forward`` and its layers
(the fused native call or the per-op ``_layers``), the runner's ``sample``, ``OutputProcessor.process``,
``EngineStats.record_step``. Per decode step (medians over the steps of a run, then the median over the
rounds of each tree):

=============  ===========================================================================
column         what
=============  ===========================================================================
step           one iteration of the loop (``Engine.step`` + for ``stream`` draining the text)
forward        ``Model.forward``
layers         the decoder layers inside it (fused call or per-op)
head           forward − layers: embedding, final norm, LM head, ``.float()``
runner         ``ModelRunner.execute`` − forward − sample: batch build, index tensors, ``.tolist()``
sample         the runner's ``sample`` call
engine         step − execute: scheduler, commit, output (detokenize, stops), stats, drain
overhead       step − forward
=============  ===========================================================================

Trees are run alternately (base, new, base, new, ...) so a loaded machine affects both alike; compare
only the numbers of one run. ``--wait-policy PASSIVE`` sets ``OMP_WAIT_POLICY`` in the workers. ``--ops``
times instead, in the current tree, each op a decode step runs outside the decoder layers (embedding, final
norm, LM head, the logits' fp32 cast, argmax) under ``OMP_WAIT_POLICY`` ACTIVE and PASSIVE alternately.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DTYPES, bench_parser  # noqa: E402

PROMPT = ("You are a helpful assistant. Explain in a few sentences why the sky is blue and why sunsets "
          "are red, for a curious child.")


def _add(acc: dict[str, float], name: str, t0: float, c0: float) -> None:
    """Add the wall time and the main thread's CPU time since (t0, c0) to acc[name] and acc[name + "@cpu"]."""
    acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
    acc[name + "@cpu"] = acc.get(name + "@cpu", 0.0) + time.thread_time() - c0


def _timed(acc: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            _add(acc, name, t0, c0)
    return wrapper


class _TimedFused:
    """Stands in for ``model.cpu_decode`` (called as an object) and times its call."""

    def __init__(self, inner: Any, acc: dict[str, float]) -> None:
        self._inner, self._acc = inner, acc

    def accepts(self, *a: Any) -> bool:
        return self._inner.accepts(*a)

    def __call__(self, *a: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self._inner(*a)
        finally:
            _add(self._acc, "layers", t0, c0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def worker(args: argparse.Namespace) -> None:
    import torch

    import mistral_kernels
    import mistral_kernels.runner as runner_mod

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    llm = mistral_kernels.LLM(dtype=dtype, quantized=args.quantized == "1", max_batch=8)
    eng, model = llm.engine, llm.model
    acc: dict[str, float] = {}
    sch = eng.scheduler
    sch.schedule = _timed(acc, "schedule", sch.schedule)
    sch.commit = _timed(acc, "commit", sch.commit)
    eng.runner.execute = _timed(acc, "execute", eng.runner.execute)
    model.forward = _timed(acc, "forward", model.forward)
    if getattr(model, "cpu_decode", None) is not None:
        model.cpu_decode = _TimedFused(model.cpu_decode, acc)
    model._layers = _timed(acc, "layers", model._layers)
    runner_mod.sample = _timed(acc, "sample", runner_mod.sample)
    eng.output.process = _timed(acc, "process", eng.output.process)
    eng.stats.record_step = _timed(acc, "stats", eng.stats.record_step)
    rows: list[dict[str, float]] = []
    last: list[float] = []  # (wall, main-thread CPU) at the end of the previous step; none before the prefill

    def timed_step(step: Callable[[], list[int]] = eng.step) -> list[int]:
        out = step()
        now, cpu = time.perf_counter(), time.thread_time()
        if last:  # one loop iteration: from the end of the previous step to the end of this one
            row = dict(acc)
            row["step"], row["step@cpu"] = now - last[0], cpu - last[1]
            rows.append(row)
        last[:] = [now, cpu]
        acc.clear()
        return out

    eng.step = timed_step
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
    kw = dict(max_new_tokens=args.steps + 1, ignore_eos=True, chat=True)
    for rep in range(2):  # the first run warms up (allocator, lazy tables); the second is measured
        rows.clear()
        last.clear()
        if prof is not None and rep:
            prof.enable()
        if args.path == "generate":
            llm.generate([PROMPT], **kw)
        else:  # the CLI's loop (cli._generate_on): write each piece to a text sink
            sink = open(os.devnull, "w")
            for piece in llm.stream(PROMPT, **kw):
                sink.write(piece)
                sink.flush()
            sink.close()
        if prof is not None and rep:
            prof.disable()
    def derived(r: dict[str, float], x: str) -> dict[str, float]:
        g = {n: r.get(n + x, 0.0) * 1e3 for n in ("step", "forward", "layers", "execute", "sample", "schedule",
                                                 "commit", "process", "stats")}
        return {k + x: v for k, v in {
            "step": g["step"], "forward": g["forward"], "layers": g["layers"], "head": g["forward"] - g["layers"],
            "runner": g["execute"] - g["forward"] - g["sample"], "sample": g["sample"],
            "engine": g["step"] - g["execute"], "overhead": g["step"] - g["forward"], "schedule": g["schedule"],
            "commit": g["commit"], "process": g["process"], "stats": g["stats"]}.items()}

    per_step = [derived(r, "") | derived(r, "@cpu") for r in rows]  # medians of per-step values
    out: dict[str, Any] = {k: statistics.median(d[k] for d in per_step) for k in per_step[0]}
    out["steps"] = len(rows)
    if prof is not None:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
    print("RESULT " + json.dumps(out))


COLUMNS = ("step", "forward", "layers", "head", "runner", "sample", "engine", "overhead", "runner@cpu",
           "sample@cpu", "engine@cpu", "overhead@cpu")
OPS = ("layers", "embed", "final_norm", "lm_head", "float", "argmax", "argmax_raw")


def ops_worker(args: argparse.Namespace) -> None:
    """The ops of a decode step outside the decoder layers, each timed on its own, in step order after the
    layers (so the thread pool is in the state a real step leaves it in): one sequence at a fixed position."""
    import torch
    import torch.nn.functional as F

    import mistral_kernels
    from mistral_kernels import ops
    from mistral_kernels.batch import AttentionBatch

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    llm = mistral_kernels.LLM(dtype=dtype, quantized=args.quantized == "1", max_batch=8)
    model, cache = llm.model, llm.engine.cache
    pos = 48
    batch = AttentionBatch.build([list(range(1, 5))], [pos], [1], cache.block_size)
    ids = torch.tensor([1234])
    for kv in cache.k + cache.v:
        kv[1:5].normal_()  # the keys the step attends to (the pool is uninitialised)
    cos_sin = model.rope.covering(batch.block_tables.shape[1] * cache.block_size)
    acc: dict[str, list[float]] = {k: [] for k in OPS}
    with torch.no_grad():
        for i in range(args.steps + 8):
            t = [time.perf_counter()]
            x = F.embedding(ids, model.embed)
            residual = torch.zeros_like(x)
            t.append(time.perf_counter())
            if model.cpu_decode is not None:
                model.cpu_decode(x, residual, batch, cos_sin, cache.k, cache.v)
            else:
                x = model._layers(x, residual, batch, cos_sin, cache)
            t.append(time.perf_counter())
            model.kernels.fused_add_rms_norm(x, residual, model.norm, model.config.norm_eps)
            t.append(time.perf_counter())
            raw = ops.linear(x, model.lm_head)
            t.append(time.perf_counter())
            logits = raw.float()
            t.append(time.perf_counter())
            logits.argmax(dim=-1)
            t.append(time.perf_counter())
            raw.argmax(dim=-1)
            t.append(time.perf_counter())
            if i >= 8:
                d = [b - a for a, b in zip(t, t[1:])]
                for k, v in zip(("embed", "layers", "final_norm", "lm_head", "float", "argmax", "argmax_raw"), d):
                    acc[k].append(v)
    print("RESULT " + json.dumps({k: statistics.median(v) * 1e3 for k, v in acc.items()}))


def ops_driver(args: argparse.Namespace) -> None:
    env0 = dict(os.environ)
    policies = args.wait_policy.split(",") if args.wait_policy else ["ACTIVE", "PASSIVE"]
    print(f"# ops outside the decoder layers per decode step (ms, median of {args.steps} steps, median of "
          f"{args.rounds} alternating rounds), threads {args.threads}")
    print("| dtype | weights | OMP_WAIT_POLICY | " + " | ".join(OPS) + " |")
    print("|" + "---|" * (3 + len(OPS)))
    for dtype in args.dtype.split(","):
        for q in args.quantized.split(","):
            res: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
            for _ in range(args.rounds):
                for policy in policies:
                    cmd = [sys.executable, __file__, "--worker", "--ops", "--dtype", dtype, "--quantized", q,
                           "--steps", str(args.steps), "--threads", str(args.threads)]
                    p = subprocess.run(cmd, env=dict(env0, OMP_WAIT_POLICY=policy), capture_output=True, text=True)
                    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                    if p.returncode or not line:
                        raise SystemExit(f"worker failed ({policy}): {p.stderr[-3000:]}")
                    res[policy].append(json.loads(line[0][7:]))
            for policy in policies:
                cells = [statistics.median(r[c] for r in res[policy]) for c in OPS]
                print(f"| {dtype} | {'quantized' if q == '1' else 'dense'} | {policy} | "
                      + " | ".join(f"{v:.3f}" for v in cells) + " |", flush=True)


def driver(args: argparse.Namespace) -> None:
    trees = [t.split("=", 1) for t in args.trees.split(",")]
    root = Path(__file__).resolve().parent.parent
    env0 = dict(os.environ)
    if args.wait_policy:
        env0["OMP_WAIT_POLICY"] = args.wait_policy
    print(f"# engine overhead per decode step (ms), {args.steps} steps, {args.rounds} alternating rounds, "
          f"threads {args.threads}, OMP_WAIT_POLICY={args.wait_policy or 'default'}")
    print("| dtype | weights | path | tree | " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * (4 + len(COLUMNS)))
    for dtype in args.dtype.split(","):
        for q in args.quantized.split(","):
            for path in args.path.split(","):
                res: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
                for _ in range(args.rounds):
                    for name, tree in trees:
                        env = dict(env0, PYTHONPATH=str((root / tree).resolve() if not Path(tree).is_absolute()
                                                        else tree))
                        cmd = [sys.executable, __file__, "--worker", "--dtype", dtype, "--quantized", q,
                               "--path", path, "--steps", str(args.steps), "--threads", str(args.threads)]
                        if args.profile:
                            cmd.append("--profile")
                        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                        if p.returncode or not line:
                            raise SystemExit(f"worker failed ({name}): {p.stderr[-3000:]}")
                        r = json.loads(line[0][7:])
                        if args.profile:
                            print(f"<!-- {name} {dtype} q={q} {path}\n{r.pop('profile')}\n-->", file=sys.stderr)
                        res[name].append(r)
                for name, _ in trees:
                    cells = [statistics.median(r[c] for r in res[name]) for c in COLUMNS]
                    print(f"| {dtype} | {'quantized' if q == '1' else 'dense'} | {path} | {name} | "
                          + " | ".join(f"{v:.2f}" for v in cells) + " |", flush=True)


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--trees", default="base=/work/main/python,new=python")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--dtype", default="bf16,fp32")
    ap.add_argument("--quantized", default="1,0")
    ap.add_argument("--path", default="generate,stream")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--wait-policy", default="")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the measured decode (stderr)")
    ap.add_argument("--ops", action="store_true",
                    help="time the ops outside the decoder layers one by one under OMP_WAIT_POLICY ACTIVE and "
                         "PASSIVE (or --wait-policy's list) instead of comparing trees")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        ops_worker(args) if args.ops else worker(args)
    else:
        ops_driver(args) if args.ops else driver(args)


if __name__ == "__main__":
    main()
