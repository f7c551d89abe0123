"""Bytes a decode step reads, per part of the step: the numerator of the decode roofline.

Shape letters: L layers, E experts (k of them active per token), V vocab, H hidden.

The weights are the model's :meth:`~mistral_kernels.model.Model.step_weights` counted by
:func:`mistral_kernels.quant_weight.weight_bytes` (the stats line's rule): every matrix once, the input
embedding table only by rows (not counted), packed (quantized) matrices by their packed bytes. Here it is split into the decoder layers and the head (final norm + LM head), and a MoE layer counts only the k of
E experts one token goes through (batch 1). The KV cache adds ``kv_bytes_per_token × context`` (the keys and
values every layer reads, at most a sliding window of them). Roofline tok/s at batch 1 = copy bandwidth /
(layers + head + KV bytes).

Example: SmolLM2-135M (tied head) dequantized to bf16: layers 30 × 3.5 MB + head 49152 × 576 × 2 = 57 MB;
natively packed: Q4_1 layers (0.625 bytes / weight) + the Q8_0 head (1.0625 bytes / weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mistral_kernels.quant_weight import weight_bytes

__all__ = ["StepBytes", "step_bytes"]

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


def step_bytes(model: Any, context: float) -> StepBytes:
    """The bytes of one batch-1 decode step of ``model`` (a :class:`mistral_kernels.model.Model`) attending
    to ``context`` keys (mean over the steps measured)."""
    c = model.config
    layers: dict[str, list[Any]] = {}  # layer prefix → its weights (expert stacks apart)
    experts: dict[str, list[Any]] = {}
    head: list[Any] = []
    for name, w in model.step_weights():
        if not name.startswith("layers."):
            head.append(w)
            continue
        prefix, leaf = name.rsplit(".", 1)
        (experts if c.is_moe and leaf in _EXPERTS else layers).setdefault(prefix, []).append(w)
    # per layer: its dense weights + its expert stacks [E, ..] scaled to the k experts a token uses
    layer_bytes = sum(weight_bytes(ws) for ws in layers.values())
    layer_bytes += sum(weight_bytes(ws) * c.top_k // c.num_experts for ws in experts.values())
    keys = min(context, c.sliding_window) if c.sliding_window else context
    kv = round(keys * c.kv_bytes_per_token(model.dtype))
    return StepBytes(layers=layer_bytes, head=weight_bytes(head), kv=kv)
