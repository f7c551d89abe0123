"""Bytes a decode step reads, per part of the step: the numerator of the decode roofline.

Shape letters: L layers, E experts (k of them active per token), V vocab, H hidden.

The weights are the model's :meth:`~mistral_kernels.model.Model.step_weights` counted by
:func:`mistral_kernels.quant_weight.weight_bytes` (the stats line's rule): every matrix once, the input
embedding table only by rows (not counted), packed (quantized) matrices by their packed bytes. Here it is
split into the decoder layers and the head (final norm + LM head), and a MoE layer counts only the k of E
experts one token goes through (batch 1). The KV cache adds ``kv_bytes_per_token × context`` (the keys and
values every layer reads, at most a sliding window of them). Roofline tok/s at batch 1 = copy bandwidth /
(layers + head + KV bytes).

Example: SmolLM2-135M (tied head) dequantized to bf16: layers 30 × 3.5 MB + head 49152 × 576 × 2 = 57 MB;
natively packed: Q4_1 layers (0.625 bytes / weight) + the Q8_0 head (1.0625 bytes / weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mistral_kernels.quant_weight import weight_bytes

__all__ = ["StepBytes", "batch_step_bytes", "expected_experts", "step_bytes"]

_EXPERTS = ("w1", "w2", "w3")


@dataclass(frozen=True)
class StepBytes:
    """Bytes one batch-1 decode step reads at a given context."""

    layers: int  # decoder-layer weights (k of E experts)
    head: int    # final norm + LM head
    kv: int      # K and V of every layer at the context

    @property
    def total(self) -> int:
        return self.layers + self.head + self.kv

    @property
    def weights(self) -> int:
        return self.layers + self.head


def _split(model: Any) -> tuple[dict[str, list[Any]], dict[str, list[Any]], list[Any]]:
    """``model.step_weights()`` by where they sit: per layer its dense weights, per layer its expert stacks
    (MoE), and the head (final norm + LM head)."""
    layers: dict[str, list[Any]] = {}
    experts: dict[str, list[Any]] = {}
    head: list[Any] = []
    for name, w in model.step_weights():
        if not name.startswith("layers."):
            head.append(w)
            continue
        prefix, leaf = name.rsplit(".", 1)
        (experts if model.config.is_moe and leaf in _EXPERTS else layers).setdefault(prefix, []).append(w)
    return layers, experts, head


def _layers_bytes(model: Any, batch: int = 1) -> int:
    """The decoder layers' weight bytes, expert stacks [E, ..] scaled to the experts ``batch`` tokens use (k of
    E for one token; :func:`expected_experts` for more)."""
    c = model.config
    layers, experts, _ = _split(model)
    total = sum(weight_bytes(ws) for ws in layers.values())
    for ws in experts.values():
        e = weight_bytes(ws)
        total += e * c.top_k // c.num_experts if batch == 1 else \
            round(e * expected_experts(c.num_experts, c.top_k, batch) / c.num_experts)
    return total


def expected_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Distinct experts ``batch`` tokens touch on average when each picks ``top_k`` of ``num_experts``
    uniformly: E · (1 − (1 − k/E)^B) (7.98 of 8 at B = 32, k = 2)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** batch)


def step_bytes(model: Any, context: float) -> StepBytes:
    """The bytes of one batch-1 decode step of ``model`` (a :class:`mistral_kernels.model.Model`) attending
    to ``context`` keys (mean over the steps measured)."""
    c = model.config
    keys = min(context, c.sliding_window) if c.sliding_window else context
    kv = round(keys * c.kv_bytes_per_token(model.dtype))
    return StepBytes(layers=_layers_bytes(model), head=weight_bytes(_split(model)[2]), kv=kv)


def batch_step_bytes(model: Any, context: float, batch: int) -> StepBytes:
    """The bytes of one decode step of ``batch`` sequences, each at ``context`` keys: the weights once (a MoE
    layer: the experts the batch is expected to touch) + every sequence's KV. Roofline tok/s = batch ·
    bandwidth / total."""
    one = step_bytes(model, context)
    return StepBytes(layers=_layers_bytes(model, batch), head=one.head, kv=one.kv * batch)
