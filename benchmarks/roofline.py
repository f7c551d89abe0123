"""Bytes a decode step reads, per part of the step: the numerator of the decode roofline.

Shape letters: L layers, E experts (k of them active per token), V vocab, H hidden.

The rule for weights is :func:`mistral_kernels.stats.weight_bytes` (the stats line's): every matrix once, the
input embedding table only by rows (not counted), packed (quantized) matrices by their packed bytes. Here
it is split into the decoder layers and the head (final norm + LM head), and a MoE layer counts only the k of
E experts one token goes through (batch 1). The KV cache adds ``kv_bytes_per_token × context`` (the keys and
values every layer reads, at most a sliding window of them). Roofline tok/s at batch 1 = copy bandwidth /
(layers + head + KV bytes).

Example: SmolLM2-135M (tied head) dequantized to bf16: layers 30 × 3.5 MB + head 49152 × 576 × 2 = 57 MB;
natively packed: Q4_1 layers (0.625 bytes / weight) + the Q8_0 head (1.0625 bytes / weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from mistral_kernels.stats import weight_bytes

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


def _layer_bytes(layer: Any, top_k: int, num_experts: int, batch: int = 1) -> int:
    """One layer's weight bytes, its expert stacks [E, ..] scaled to the experts ``batch`` tokens use (k of E
    for one token; :func:`expected_experts` for more)."""
    total = weight_bytes(SimpleNamespace(layers=[layer]))
    if not num_experts:
        return total
    experts = weight_bytes(SimpleNamespace(layers=[SimpleNamespace(**{n: getattr(layer, n) for n in _EXPERTS})]))
    if batch == 1:
        return total - experts + experts * top_k // num_experts
    return total - experts + round(experts * expected_experts(num_experts, top_k, batch) / num_experts)


def expected_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Distinct experts ``batch`` tokens touch on average when each picks ``top_k`` of ``num_experts``
    uniformly: E · (1 − (1 − k/E)^B) (7.98 of 8 at B = 32, k = 2)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** batch)


def step_bytes(model: Any, context: float) -> StepBytes:
    """The bytes of one batch-1 decode step of ``model`` (a :class:`mistral_kernels.model.Model`) attending
    to ``context`` keys (mean over the steps measured)."""
    c = model.config
    experts = c.num_experts if c.is_moe else 0
    layers = sum(_layer_bytes(ly, c.top_k, experts) for ly in model.layers)
    head = weight_bytes(SimpleNamespace(norm=model.norm, lm_head=model.lm_head))
    keys = min(context, c.sliding_window) if c.sliding_window else context
    kv = round(keys * c.kv_bytes_per_token(model.dtype))
    return StepBytes(layers=layers, head=head, kv=kv)


def batch_step_bytes(model: Any, context: float, batch: int) -> StepBytes:
    """The bytes of one decode step of ``batch`` sequences, each at ``context`` keys: the weights once (a MoE
    layer: the experts the batch is expected to touch) + every sequence's KV. Roofline tok/s = batch ·
    bandwidth / total."""
    c = model.config
    experts = c.num_experts if c.is_moe else 0
    one = step_bytes(model, context)
    layers = sum(_layer_bytes(ly, c.top_k, experts, batch) for ly in model.layers)
    return StepBytes(layers=layers, head=one.head, kv=one.kv * batch)
