"""Where one batch-1 decode step's wall time goes, through the engine (the path of ``LLM.generate``).

Shape letters: V vocab.

:func:`profile_decode` runs one request through ``engine.step`` (greedy, EOS ignored) with timers around
the engine's own calls — instance attributes shadowing ``engine.step``, ``runner.execute``,
``model.forward``, the decoder layers (``model.cpu_decode``, the fused ``ops.decode_layers`` call, or
``model._layers``, op by op) and the runner's ``sample`` — removed again afterwards; nothing of the package
is edited. Per decode step (the prefill step is left out) the wall time splits into:

===========================  =================================================================================
part                         what
===========================  =================================================================================
decoder layers               ``ops.decode_layers`` (one native call, all layers) or the per-op layers
final norm + LM head         the rest of ``model.forward`` after the layers (norm, head GEMV, logits ``.float()``)
embedding + RoPE table       ``model.forward`` before the layers (embedding row, residual zeros, cos/sin table)
sampling                     ``mistral_kernels.sampling.sample`` on the [1, V] logits
runner, outside the forward  batch tensors (``AttentionBatch.build``), token ids, the sampled-id readback
engine, outside the runner   scheduling, commit, detokenising + stop checks, stats
===========================  =================================================================================

Each part's time is the median over the steps; the table shows the median whole step too (the medians of
the parts need not add up to it exactly). Each part gets the bytes it reads (:mod:`roofline`) and the % of
its own roofline: bytes / copy bandwidth / its time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mistral_kernels.runner as runner_module
from mistral_kernels.sampling import SamplingParams

from roofline import step_bytes

__all__ = ["DecodeProfile", "profile_decode"]

Spans = dict[str, tuple[float, float]]


class _Timed:
    """Calls ``inner`` and records its (start, end) under ``label``; other attributes pass through."""

    def __init__(self, inner: Any, spans: Spans, label: str) -> None:
        self._inner = inner
        self._spans = spans
        self._label = label

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self._spans[self._label] = (t0, time.perf_counter())


@dataclass
class DecodeProfile:
    """Median seconds per part of a batch-1 decode step, bytes per part, and how the layers ran."""

    seconds: dict[str, float]
    nbytes: dict[str, int]
    layers_kind: str
    steps: int
    context: float

    def rows(self, bandwidth_gbs: float) -> list[list[object]]:
        """Table rows: part, ms, % of the step, MB read, GB/s, % of its roofline at ``bandwidth_gbs``."""
        step = self.seconds["whole step"]
        out: list[list[object]] = []
        for part, sec in self.seconds.items():
            nbytes = self.nbytes.get(part, 0)
            gbs = nbytes / sec / 1e9 if sec > 0 and nbytes else float("nan")
            pct = f"{100 * gbs / bandwidth_gbs:.0f}%" if nbytes else "—"
            out.append([part, 1e3 * sec, f"{100 * sec / step:.0f}%", nbytes / 1e6, gbs, pct])
        return out


def _install(obj: Any, name: str, spans: Spans, label: str, undo: list[Callable[[], None]]) -> None:
    """Shadow ``obj.name`` with a timed wrapper (an instance attribute), undone by ``undo``."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, _Timed(getattr(obj, name), spans, label))
    undo.append((lambda: setattr(obj, name, old)) if had else (lambda: delattr(obj, name)))


def profile_decode(llm: Any, prompt_ids: list[int], steps: int) -> DecodeProfile:
    """Profile ``steps`` batch-1 decode steps of ``llm`` (a :class:`mistral_kernels.LLM`) after ``prompt_ids``."""
    if steps < 1:
        raise ValueError(f"profile_decode: steps must be >= 1, got {steps}")
    engine, model = llm.engine, llm.model
    spans: Spans = {}
    undo: list[Callable[[], None]] = []
    fused = model.cpu_decode is not None
    try:
        _install(engine, "step", spans, "step", undo)
        _install(engine.runner, "execute", spans, "execute", undo)
        _install(model, "forward", spans, "forward", undo)
        _install(model, "_layers", spans, "layers", undo)
        if fused:
            _install(model, "cpu_decode", spans, "fused layers", undo)
        sample = runner_module.sample
        runner_module.sample = _Timed(sample, spans, "sample")
        undo.append(lambda: setattr(runner_module, "sample", sample))

        engine.add_request(prompt_ids, SamplingParams(max_new_tokens=steps + 1, ignore_eos=True))
        per_step: list[Spans] = []
        while engine.has_unfinished():
            spans.clear()
            engine.step()  # the request's completion comes with its last output (not needed here)
            per_step.append(dict(spans))
    finally:
        for fn in reversed(undo):
            fn()
    decode = per_step[1:]  # the first step is the prefill
    fused_steps = sum("fused layers" in s for s in decode)
    for s in decode:
        if "fused layers" in s:
            s["layers"] = s.pop("fused layers")

    def med(fn: Callable[[Spans], float]) -> float:
        return statistics.median(fn(s) for s in decode)

    seconds = {
        "decoder layers": med(lambda s: s["layers"][1] - s["layers"][0]),
        "final norm + LM head": med(lambda s: s["forward"][1] - s["layers"][1]),
        "embedding + RoPE table": med(lambda s: s["layers"][0] - s["forward"][0]),
        "sampling": med(lambda s: s["sample"][1] - s["sample"][0]),
        "runner, outside the forward": med(lambda s: (s["execute"][1] - s["execute"][0])
                                           - (s["forward"][1] - s["forward"][0]) - (s["sample"][1] - s["sample"][0])),
        "engine, outside the runner": med(lambda s: (s["step"][1] - s["step"][0])
                                          - (s["execute"][1] - s["execute"][0])),
        "forward (model.forward)": med(lambda s: s["forward"][1] - s["forward"][0]),
        "whole step": med(lambda s: s["step"][1] - s["step"][0]),
    }
    context = len(prompt_ids) + (steps + 1) / 2  # mean keys of the decode steps
    b = step_bytes(model, context)
    nbytes = {"decoder layers": b.layers + b.kv, "final norm + LM head": b.head,
              "sampling": 4 * model.config.vocab_size, "forward (model.forward)": b.total, "whole step": b.total}
    kind = {0: "op by op", len(decode): "fused (ops.decode_layers)"}.get(
        fused_steps, f"fused in {fused_steps} of {len(decode)} steps")
    return DecodeProfile(seconds, nbytes, kind, len(decode), context)
