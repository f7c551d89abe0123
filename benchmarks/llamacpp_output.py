"""Parse what llama.cpp's tools print: ``llama-bench -o jsonl`` results and the timing lines of
``llama-completion`` (its ``prompt eval time`` and ``eval time`` lines on stderr).

A ``llama-completion`` timing line looks like::

    llama_perf_context_print: prompt eval time =  51.20 ms /  42 tokens ( 1.22 ms per token, 820.31 tokens per second)
    llama_perf_context_print:        eval time = 412.97 ms /  63 runs   ( 6.56 ms per token, 152.55 tokens per second)

(padded with more spaces; the ``common_perf_print`` lines of the sampler print the same numbers); the last of each kind counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["BenchResult", "CompletionTimings", "parse_bench_jsonl", "parse_completion_timings"]

_PROMPT = re.compile(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([0-9.]+) ms /\s*(\d+) runs")


@dataclass(frozen=True)
class BenchResult:
    """One llama-bench test: n_prompt tokens of prompt (pp) or n_gen generated tokens (tg) after n_depth."""

    n_prompt: int
    n_gen: int
    n_depth: int
    n_threads: int
    avg_ts: float          # tokens per second, mean over the repetitions
    samples_ts: list[float]
    model_type: str
    build_commit: str
    cpu_info: str


@dataclass(frozen=True)
class CompletionTimings:
    """``llama-completion``'s prompt and generation timings."""

    prompt_tokens: int
    prompt_ms: float
    eval_runs: int
    eval_ms: float

    @property
    def prompt_tok_s(self) -> float:
        return 1e3 * self.prompt_tokens / self.prompt_ms

    @property
    def eval_tok_s(self) -> float:
        return 1e3 * self.eval_runs / self.eval_ms


def parse_bench_jsonl(text: str) -> list[BenchResult]:
    """The tests of a ``llama-bench -o jsonl`` stdout (one JSON object per line; other lines ignored)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        out.append(BenchResult(int(d["n_prompt"]), int(d["n_gen"]), int(d.get("n_depth", 0)), int(d["n_threads"]),
                               float(d["avg_ts"]), [float(x) for x in d.get("samples_ts", [])],
                               str(d.get("model_type", "")), str(d.get("build_commit", "")),
                               str(d.get("cpu_info", ""))))
    if not out:
        raise ValueError(f"llama-bench printed no jsonl result; its output was:\n{text[-2000:]}")
    return out


def parse_completion_timings(text: str) -> CompletionTimings:
    """The last ``prompt eval time`` and ``eval time`` lines of a ``llama-completion`` run."""
    prompts = _PROMPT.findall(text)
    evals = _EVAL.findall(text)
    if not prompts or not evals:
        raise ValueError(f"llama-completion printed no timing lines; its output ended with:\n{text[-2000:]}")
    (p_ms, p_n), (e_ms, e_n) = prompts[-1], evals[-1]
    return CompletionTimings(int(p_n), float(p_ms), int(e_n), float(e_ms))
