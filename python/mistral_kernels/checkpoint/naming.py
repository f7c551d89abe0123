"""Canonical tensor names: every format renamed to one unfused naming, then checked against the config.

Each format states its renaming rules (``RULES`` of :mod:`.hf`, :mod:`.consolidated`, :mod:`.gguf`): a
pattern over the file's tensor name, the canonical template, and a split. :func:`rename` applies them
(per-expert tensors are stacked, a fused ``gate_up_proj`` is cut in two); :func:`check` then compares the
result with the shapes the config implies (missing / unexpected / mis-shaped / integer-typed tensors are
reported together). No data is read here: each :class:`Entry` knows its shape and how to fill a
destination (:mod:`.fusion` joins entries into the fused weights the model takes).

Shape letters: H hidden, I intermediate, V vocab, Hq / Hkv heads, D head_dim, E experts.

Canonical names (per layer ``layers.{i}.``)::

    embed [V, H]   norm [H]   lm_head [V, H] (absent when tied)
    attn_norm [H]  wq [Hq·D, H]  wk [Hkv·D, H]  wv [Hkv·D, H]  wo [H, Hq·D]  ffn_norm [H]
    dense: w1 [I, H] (gate)  w3 [I, H] (up)  w2 [H, I] (down)
    MoE:   gate [E, H]  experts.w1 [E, I, H]  experts.w3 [E, I, H]  experts.w2 [E, H, I]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import CheckpointError
from .source import TensorSource
from .tensor_io import Index, TensorInfo

__all__ = ["Entry", "Rule", "ShardFn", "check", "expected_shapes", "full_index", "rename"]

# ---------------------------------------------------------------------------------------------- naming
# A rule: (pattern over the file's tensor name, canonical template, split) — group \1 is the layer; a group
# named ``expert`` marks one expert's tensor, stacked over experts into the canonical [E, ...] tensor.
# split=2 cuts a fused [E, 2I, H] tensor into two canonical tensors (the templates joined by "|").
Rule = tuple[str, str, int]


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name → shape for every tensor a checkpoint of ``config`` must hold."""
    c = config
    h, d, i, e = c.dim, c.head_dim, c.hidden_dim, c.num_experts
    shapes: dict[str, tuple[int, ...]] = {"embed": (c.vocab_size, h), "norm": (h,)}
    if not c.tie_embeddings:
        shapes["lm_head"] = (c.vocab_size, h)
    for n in range(c.n_layers):
        p = f"layers.{n}."
        shapes |= {p + "attn_norm": (h,), p + "ffn_norm": (h,), p + "wq": (c.n_heads * d, h),
                   p + "wk": (c.n_kv_heads * d, h), p + "wv": (c.n_kv_heads * d, h), p + "wo": (h, c.n_heads * d)}
        if c.is_moe:
            shapes |= {p + "gate": (e, h), p + "experts.w1": (e, i, h), p + "experts.w3": (e, i, h),
                       p + "experts.w2": (e, h, i)}
        else:
            shapes |= {p + "w1": (i, h), p + "w3": (i, h), p + "w2": (h, i)}
    return shapes


# ---------------------------------------------------------------------------------------------- entries
ShardFn = Callable[[ModelConfig, str], "tuple[slice, ...] | None"]  # (config, canonical name) → part to read
Fill = Callable[[torch.Tensor, "Index | None"], None]  # (out, index) → out holds the tensor or its part


@dataclass
class Entry:
    """One canonical tensor: its shape (known without reading data) and how to read it.

    ``fill(out, None)`` reads all of it into ``out``; ``fill(out, index)`` only the part ``index`` (one slice
    per dim) selects. ``stored`` are the file tensors it reads (dtypes, byte counts).
    """

    shape: tuple[int, ...]
    fill: Fill
    origin: str  # tensor name(s) in the file, for messages
    stored: tuple[TensorInfo, ...]


# ---------------------------------------------------------------------------------------------- renaming
def rename(source: TensorSource, rules: Sequence[Rule], ignored: re.Pattern[str]
           ) -> tuple[dict[str, Entry], list[str]]:
    """Map file tensors to canonical entries; per-expert tensors are stacked; names ``ignored`` matches are
    skipped. Returns (entries, unexpected)."""
    compiled = [(re.compile(pattern), template, split) for pattern, template, split in rules]
    entries: dict[str, Entry] = {}
    experts: dict[str, dict[int, str]] = {}  # canonical stacked name → {expert id: file name}
    unexpected: list[str] = []
    for name, info in source.tensors.items():
        shape = info.shape
        for pattern, template, split in compiled:
            m = pattern.fullmatch(name)
            if m is None:
                continue
            targets = m.expand(template).split("|")
            if "expert" in m.groupdict():
                experts.setdefault(targets[0], {})[int(m.group("expert"))] = name
            elif split == 1:
                entries[targets[0]] = Entry(shape, lambda out, index, n=name: source.read_into(n, out, index),
                                            name, (info,))
            elif len(shape) == 3 and shape[-2] % 2 == 0:  # [E, 2I, H] → two [E, I, H]
                half = shape[-2] // 2
                for part, target in enumerate(targets):
                    entries[target] = Entry(
                        (*shape[:-2], half, shape[-1]),
                        lambda out, index, n=name, a=part * half, h=half: source.read_into(
                            n, out, _offset_rows(index or full_index((), 3), a, h)), name, (info,))
            else:
                unexpected.append(f"{name} {list(shape)} (expected [E, 2·I, H])")
            break
        else:
            if not ignored.fullmatch(name):
                unexpected.append(name)
    for target, by_id in experts.items():
        ids = sorted(by_id)
        names = [by_id[j] for j in ids]
        if ids != list(range(len(ids))):
            raise CheckpointError(f"{target}: expert tensors are not numbered 0..{len(ids) - 1}: have {ids[:20]}")
        shapes = {n: list(source.tensors[n].shape) for n in names}
        if len({tuple(v) for v in shapes.values()}) > 1:
            raise CheckpointError(f"{target}: expert tensors differ in shape: {shapes}")
        entries[target] = Entry((len(names), *source.tensors[names[0]].shape),
                                lambda out, index, ns=names: _fill_experts(source, ns, out, index),
                                f"{names[0]} … {names[-1]}", tuple(source.tensors[n] for n in names))
    return entries, unexpected


def _fill_experts(source: TensorSource, names: list[str], out: torch.Tensor, index: Index | None) -> None:
    """Stacked experts [E, ...]: expert e's file tensor straight into ``out[e]`` (or the selected experts)."""
    chosen = range(len(names)) if index is None else range(*index[0].indices(len(names)))
    for k, e in enumerate(chosen):
        source.read_into(names[e], out[k], None if index is None else index[1:])


def _offset_rows(index: Index, start: int, size: int) -> Index:
    """Index of the half ``[start, start + size)`` of dim -2 (a fused [E, 2I, H] tensor's w1 / w3 part):
    ``index`` selects inside the half. E.g. w3 = rows 96‥191 of gate_up_proj (I = 96), index rows 48‥95
    → file rows 144‥191."""
    first, last, step = index[-2].indices(size)
    if step != 1:
        raise ValueError(f"_offset_rows: shard slices must be contiguous, got step {step}")
    return (*index[:-2], slice(start + first, start + last), index[-1])


def full_index(index: tuple[slice, ...], ndim: int) -> Index:
    """Pad ``index`` with whole-dim slices to ``ndim`` entries."""
    return (*index, *(slice(None),) * (ndim - len(index)))


def check(path: Path, fmt: str, entries: dict[str, Entry], unexpected: list[str], config: ModelConfig) -> None:
    expected = expected_shapes(config)
    if config.tie_embeddings:
        entries.pop("lm_head", None)  # some tied checkpoints also store the head; tied means it is the embedding
    missing = [n for n in expected if n not in entries]
    extra = unexpected + [f"{e.origin} (as {n})" for n, e in entries.items() if n not in expected]
    bad = [f"{e.origin} (as {n}): {list(e.shape)}, expected {list(expected[n])}"
           for n, e in entries.items() if n in expected and tuple(e.shape) != expected[n]]
    integer = [f"{t.name} ({t.type_name})" for n, e in entries.items() if n in expected for t in e.stored
               if not t.dtype.is_floating_point]
    if missing or extra or bad or integer:
        lines = [f"checkpoint {path} ({fmt} format) does not match its config:"]
        for title, items in (("missing (canonical names, see checkpoint/naming.py)", missing), ("unexpected", extra),
                             ("mis-shaped", bad), ("not floating-point (weights must be F32 / F16 / BF16)", integer)):
            if items:
                shown = items[:25] + ([f"… and {len(items) - 25} more"] if len(items) > 25 else [])
                lines.append(f"  {title}: " + ", ".join(shown))
        raise CheckpointError("\n".join(lines))
