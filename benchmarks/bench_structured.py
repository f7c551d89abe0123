"""Cost of constrained decoding (mistral_kernels.structured) on the CPU: decode tok/s with and without a JSON
schema at batch 1 and 16, the grammar masks' share of a step, grammar compile time per schema, and the first
constrained request's latency (vocabulary build + compile).

    python benchmarks/bench_structured.py [--rounds 3] [--steps 32] [--batches 1,16] [--threads 2]
        [--out benchmarks/results/cpu_structured.md]

Model: SmolLM2-135M-Instruct (the default GGUF, Q4_1, default dtype), chat prompts, greedy. Modes:

============  ============================================================================================
mode          request
============  ============================================================================================
free          no constraint, ``ignore_eos`` (runs the full ``--steps`` tokens)
json-string   JSON schema ``{"story": string, minLength 4000}``: every token inside one JSON string
json-objects  JSON schema: an array (minItems 200) of objects {name ≤ 12 chars, age 0-120, colour enum}:
              keys, numbers, enums and punctuation all the way
============  ============================================================================================

Neither constrained schema can complete within ``--steps`` tokens, so every request decodes the same number
of tokens in every mode. Decode tok/s = tokens / wall time of one decode-only step (``Engine.step`` whole:
forward, mask fill + apply, sampling, output processing with the matcher's ``accept``), the median over the
steps of a run, then over rounds (the mean over a run's steps is listed per round too). Modes and batches
are interleaved in each round (the order rotates per round). The masks' own time is
timed too: ``fill_bitmask`` (llguidance, host), ``apply_bitmask`` (torch), ``GrammarState.accept``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser, command_line  # noqa: E402

STRING_SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 4000}},
                 "required": ["story"]}
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "colour": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "colour"], "additionalProperties": False}
OBJECTS_SCHEMA = {"type": "array", "items": PERSON, "minItems": 200}
NESTED_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                               "required": ["city", "zip"]},
                   "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}}},
    "required": ["name", "age", "address", "colors"]}
WIDE_SCHEMA = {"type": "object", "required": [f"field_{i}" for i in range(40)],
               "properties": {f"field_{i}": ({"type": "integer"} if i % 3 == 0 else
                                             {"enum": [f"v{i}_{j}" for j in range(8)]} if i % 3 == 1 else
                                             {"type": "array", "items": {"type": "string", "format": "date"}})
                              for i in range(40)}}
PROMPTS = ["Write a long story about a lighthouse keeper, as JSON.", "List many people with their ages as JSON.",
           "Describe a city in detail.", "Invent characters for a novel."]


def _params(mode: str, steps: int) -> Any:
    from mistral_kernels import SamplingParams
    from mistral_kernels.structured import JsonSchema

    if mode == "free":
        return SamplingParams(max_new_tokens=steps + 1, ignore_eos=True)
    schema = STRING_SCHEMA if mode == "json-string" else OBJECTS_SCHEMA
    return SamplingParams(max_new_tokens=steps + 1, structured=JsonSchema(schema))


class _Timers:
    """Wraps the mask functions and the matcher's accept to add up their wall time."""

    def __init__(self) -> None:
        import mistral_kernels.structured.bitmask as bm
        from mistral_kernels.structured.matcher import GrammarState

        self.t: dict[str, float] = {"fill": 0.0, "apply": 0.0, "accept": 0.0}
        for name, owner, attr in (("fill", bm, "fill_bitmask"), ("apply", bm, "apply_bitmask"),
                                  ("accept", GrammarState, "accept")):
            setattr(owner, attr, self._wrap(name, getattr(owner, attr)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[name] += time.perf_counter() - t0
        return timed

    def reset(self) -> None:
        for k in self.t:
            self.t[k] = 0.0


def _decode_run(llm: Any, mode: str, batch: int, steps: int, timers: _Timers) -> dict[str, float]:
    """One generate call of ``batch`` requests: per decode-only step its tok/s and mask times; the medians over
    the steps (robust to the time slices a loaded machine takes away now and then) and the mean tok/s."""
    eng = llm.engine
    params = _params(mode, steps)
    ids = [llm.prompt_ids(PROMPTS[i % len(PROMPTS)] + f" (#{i})", chat=True) for i in range(batch)]
    rids = [eng.add_request(p, params) for p in ids]
    rows: list[dict[str, float]] = []
    while eng.has_unfinished():
        before = (eng.stats.prompt_tokens, eng.stats.decode_tokens, dict(timers.t))
        t0 = time.perf_counter()
        eng.step()
        dt = time.perf_counter() - t0
        if eng.stats.prompt_tokens == before[0] and eng.stats.decode_tokens > before[1]:
            rows.append({"tokens": eng.stats.decode_tokens - before[1], "dt": dt,
                         **{f"{k}_ms": 1e3 * (timers.t[k] - before[2][k]) for k in timers.t}})
    assert not any(eng.has_request(r) for r in rids)
    med = statistics.median
    return {"tok_s": med(r["tokens"] / r["dt"] for r in rows),
            "mean_tok_s": sum(r["tokens"] for r in rows) / sum(r["dt"] for r in rows), "steps": len(rows),
            **{f"{k}_ms": med(r[f"{k}_ms"] for r in rows) for k in timers.t}}


def _compile_times(llm: Any, repeats: int) -> list[tuple[str, float, float]]:
    """(schema, median compile ms on a cold cache, first-mask ms) per schema; the vocabulary is already built."""
    from mistral_kernels.structured import JsonObject, JsonSchema
    from mistral_kernels.structured.grammar import GrammarCompiler, grammar_text
    import torch

    out = []
    for name, spec in (("json_object", JsonObject()), ("string (story)", JsonSchema(STRING_SCHEMA)),
                       ("nested (objects, array, enums)", JsonSchema(NESTED_SCHEMA)),
                       ("array of objects", JsonSchema(OBJECTS_SCHEMA)),
                       ("wide (40 fields, enums, dates)", JsonSchema(WIDE_SCHEMA))):
        comp, first = [], []
        for _ in range(repeats):
            grammar_text.cache_clear()
            c = GrammarCompiler(llm.tokenizer, llm.model.config.vocab_size, llm.engine.eos_ids)
            t0 = time.perf_counter()
            c.compile(spec)
            comp.append(time.perf_counter() - t0)
            state = c.state(spec)
            row = torch.empty(state.words, dtype=torch.int32)
            t0 = time.perf_counter()
            state.fill(row)
            first.append(time.perf_counter() - t0)
        out.append((name, 1e3 * statistics.median(comp), 1e3 * statistics.median(first)))
    return out


def _first_request(repeats: int) -> list[tuple[str, float]]:
    """Vocabulary build on a fresh tokenizer object, and the first constrained request's time to first token
    against an unconstrained one's, on a fresh engine each (same model)."""
    from mistral_kernels import SamplingParams
    from mistral_kernels.default_model import default_model_path
    from mistral_kernels.engine import Engine
    from mistral_kernels.loading import load_model
    from mistral_kernels.structured import JsonSchema
    from mistral_kernels.structured.vocab import grammar_vocabulary
    from mistral_kernels.tokenization import load_tokenizer

    path = default_model_path()
    model = load_model(path, progress=False)
    vocab, ttft_free, ttft_json = [], [], []
    for _ in range(repeats):
        tok = load_tokenizer(path)
        t0 = time.perf_counter()
        grammar_vocabulary(tok, model.config.vocab_size, sorted(tok.eos_ids))
        vocab.append(time.perf_counter() - t0)
        for spec, acc in ((None, ttft_free), (JsonSchema(NESTED_SCHEMA), ttft_json)):
            tok = load_tokenizer(path)  # a fresh tokenizer object: nothing cached
            eng = Engine(model, tok, num_blocks=64, block_size=16, max_batch=1)
            ids = tok.apply_chat_template([{"role": "user", "content": "A person as JSON."}])
            t0 = time.perf_counter()
            rid = eng.add_request(ids, SamplingParams(max_new_tokens=1, structured=spec))
            eng.run([rid])
            acc.append(time.perf_counter() - t0)
    med = statistics.median
    return [("vocabulary build (49152 tokens, fresh tokenizer object)", 1e3 * med(vocab)),
            ("first request, unconstrained: admission + prefill + 1 token", 1e3 * med(ttft_free)),
            ("first request, nested JSON schema: + vocabulary + compile + mask", 1e3 * med(ttft_json))]


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batches", default="1,16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the markdown result here")
    args = p.parse_args()

    import torch

    import mistral_kernels

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    load0 = os.getloadavg()
    first = _first_request(3)
    llm = mistral_kernels.LLM(max_batch=max(batches), num_blocks=max(batches) * 8)
    timers = _Timers()
    modes = ["free", "json-string", "json-objects"]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    _decode_run(llm, "json-objects", 2, 4, timers)  # warm-up: allocator, compiled grammars
    _decode_run(llm, "json-string", 2, 4, timers)
    for r in range(args.rounds):
        order = [(m, b) for b in batches for m in modes]
        order = order[r % len(order):] + order[:r % len(order)]
        for m, b in order:
            runs.setdefault((m, b), []).append(_decode_run(llm, m, b, args.steps, timers))
            print(f"round {r} {m} batch {b}: {runs[(m, b)][-1]['tok_s']:.1f} tok/s", flush=True)
    compile_rows = _compile_times(llm, 5)
    load1 = os.getloadavg()

    med = statistics.median
    lines = [
        "# Structured outputs: cost on the CPU", "",
        command_line(__file__), "",
        f"**Loaded machine**: the 2-core development VM shared with other workers; load average "
        f"{load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} at the start, {load1[0]:.1f} / {load1[1]:.1f} / "
        f"{load1[2]:.1f} at the end (1 / 5 / 15 min). Absolute figures are several times an idle machine's; "
        "the with / without comparison is interleaved in one process so the load affects both alike.",
        f"SmolLM2-135M-Instruct Q4_1 (default GGUF), {args.threads} threads, greedy, {args.steps} decode tokens "
        f"per request, {args.rounds} rounds, medians. torch {torch.__version__}.", "",
        "## Decode throughput", "",
        "| batch | mode | decode tok/s | vs free | fill ms/step | apply ms/step | accept ms/step |",
        "|---|---|---|---|---|---|---|"]
    for b in batches:
        base = med(x["tok_s"] for x in runs[("free", b)])
        for m in modes:
            xs = runs[(m, b)]
            tps = med(x["tok_s"] for x in xs)
            lines.append(f"| {b} | {m} | {tps:.1f} | {100 * (tps / base - 1):+.1f} % | "
                         f"{med(x['fill_ms'] for x in xs):.2f} | {med(x['apply_ms'] for x in xs):.2f} | "
                         f"{med(x['accept_ms'] for x in xs):.2f} |")
    lines += ["", "Per round, median / mean tok/s over the run's decode steps (free ; json-string ; json-objects):", ""]
    for b in batches:
        per = " | ".join(" ; ".join(f"{runs[(m, b)][r]['tok_s']:.1f} / {runs[(m, b)][r]['mean_tok_s']:.1f}"
                                    for m in modes) for r in range(args.rounds))
        lines.append(f"- batch {b}: {per}")
    lines += ["", "## Grammar compile time (vocabulary already built; cold grammar cache)", "",
              "| schema | compile ms | first mask ms |", "|---|---|---|"]
    lines += [f"| {n} | {c:.2f} | {f:.2f} |" for n, c, f in compile_rows]
    lines += ["", "## First-request latency", "", "| what | ms |", "|---|---|"]
    lines += [f"| {n} | {v:.0f} |" for n, v in first]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
