"""Checkpoint loading: HF directories, Mistral consolidated directories and GGUF files → fused weights.

Formats are detected and their tensors read by :mod:`mistral_kernels.formats` (docs/design.md §6); the
config comes from :func:`mistral_kernels.config.load_config`. The RoPE layout of q/k follows the format
(HF: neox; consolidated and GGUF: interleaved); no format's weights are permuted.

Every format is first renamed to one *canonical* unfused naming (below), checked against the shapes
the config implies (missing / unexpected / mis-shaped tensors are reported together), then loaded
tensor by tensor (safetensors memory-mapped, GGUF dequantized with the ``gguf`` package) and fused:
``wq|wk|wv → qkv`` and, for dense FFNs, ``w1|w3 → w13``.

Shape letters: H hidden, I intermediate, V vocab, Hq / Hkv heads, D head_dim, E experts.

Canonical names (per layer ``layers.{i}.``)::

    embed [V, H]   norm [H]   lm_head [V, H] (absent when tied)
    attn_norm [H]  wq [Hq·D, H]  wk [Hkv·D, H]  wv [Hkv·D, H]  wo [H, Hq·D]  ffn_norm [H]
    dense: w1 [I, H] (gate)  w3 [I, H] (up)  w2 [H, I] (down)
    MoE:   gate [E, H]  experts.w1 [E, I, H]  experts.w3 [E, I, H]  experts.w2 [E, H, I]

Fused names returned by :func:`load_checkpoint`: ``embed, norm, lm_head?`` and per layer
``attn_norm, qkv [(Hq+2·Hkv)·D, H], wo, ffn_norm`` plus ``w13 [2I, H], w2`` (dense) or
``gate, w1, w3, w2`` (MoE, stacked over experts as :func:`mistral_kernels.ops.fused_moe` takes them).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import ModelConfig, load_config
from .formats import CheckpointError, Index, TensorSource, detect_format, open_tensors

# CheckpointError and detect_format are defined in formats.py and re-exported here.
__all__ = ["CheckpointError", "detect_format", "expected_shapes", "load_checkpoint"]


# ---------------------------------------------------------------------------------------------- naming
# (pattern over the file's tensor name, canonical template, split) — group \1 is the layer; a group named
# ``expert`` marks one expert's tensor, stacked over experts into the canonical [E, ...] tensor.
# split=2 cuts a fused [E, 2I, H] tensor into two canonical tensors (the templates joined by "|").
_Rule = tuple[str, str, int]
_HF_RULES: list[_Rule] = [
    (r"model\.embed_tokens\.weight", "embed", 1),
    (r"model\.norm\.weight", "norm", 1),
    (r"lm_head\.weight", "lm_head", 1),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.attn_norm", 1),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.ffn_norm", 1),
    (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"layers.\1.w\2", 1),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"layers.\1.w1", 1),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"layers.\1.w3", 1),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"layers.\1.w2", 1),
    (r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.gate\.weight", r"layers.\1.gate", 1),
    (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(?P<expert>\d+)\.(w[123])\.weight", r"layers.\1.experts.\3", 1),
    (r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj", r"layers.\1.experts.w1|layers.\1.experts.w3", 2),
    (r"model\.layers\.(\d+)\.mlp\.experts\.down_proj", r"layers.\1.experts.w2", 1),
]
_CONSOLIDATED_RULES: list[_Rule] = [
    (r"tok_embeddings\.weight", "embed", 1),
    (r"norm\.weight", "norm", 1),
    (r"output\.weight", "lm_head", 1),
    (r"layers\.(\d+)\.attention_norm\.weight", r"layers.\1.attn_norm", 1),
    (r"layers\.(\d+)\.ffn_norm\.weight", r"layers.\1.ffn_norm", 1),
    (r"layers\.(\d+)\.attention\.w([qkvo])\.weight", r"layers.\1.w\2", 1),
    (r"layers\.(\d+)\.feed_forward\.(w[123])\.weight", r"layers.\1.\2", 1),
    (r"layers\.(\d+)\.feed_forward\.gate\.weight", r"layers.\1.gate", 1),
    (r"layers\.(\d+)\.feed_forward\.experts\.(?P<expert>\d+)\.(w[123])\.weight", r"layers.\1.experts.\3", 1),
]
_GGUF_RULES: list[_Rule] = [
    (r"token_embd\.weight", "embed", 1),
    (r"output_norm\.weight", "norm", 1),
    (r"output\.weight", "lm_head", 1),
    (r"blk\.(\d+)\.attn_norm\.weight", r"layers.\1.attn_norm", 1),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"layers.\1.ffn_norm", 1),
    (r"blk\.(\d+)\.attn_([qkv])\.weight", r"layers.\1.w\2", 1),
    (r"blk\.(\d+)\.attn_output\.weight", r"layers.\1.wo", 1),
    (r"blk\.(\d+)\.ffn_gate\.weight", r"layers.\1.w1", 1),
    (r"blk\.(\d+)\.ffn_up\.weight", r"layers.\1.w3", 1),
    (r"blk\.(\d+)\.ffn_down\.weight", r"layers.\1.w2", 1),
    (r"blk\.(\d+)\.ffn_gate_inp\.weight", r"layers.\1.gate", 1),
    (r"blk\.(\d+)\.ffn_gate_exps\.weight", r"layers.\1.experts.w1", 1),
    (r"blk\.(\d+)\.ffn_up_exps\.weight", r"layers.\1.experts.w3", 1),
    (r"blk\.(\d+)\.ffn_down_exps\.weight", r"layers.\1.experts.w2", 1),
    (r"blk\.(\d+)\.ffn_gate\.(?P<expert>\d+)\.weight", r"layers.\1.experts.w1", 1),
    (r"blk\.(\d+)\.ffn_up\.(?P<expert>\d+)\.weight", r"layers.\1.experts.w3", 1),
    (r"blk\.(\d+)\.ffn_down\.(?P<expert>\d+)\.weight", r"layers.\1.experts.w2", 1),
]
_RULES = {"hf": _HF_RULES, "consolidated": _CONSOLIDATED_RULES, "gguf": _GGUF_RULES}
# a buffer some old HF checkpoints saved; the vision encoder of Pixtral / Mistral Small 3.x consolidated
# checkpoints (the text decoder is loaded alone); GGUF RoPE factors (read into the config by load_config)
_IGNORED = re.compile(r".*rotary_emb\.inv_freq|(vision_encoder|vision_language_adapter|patch_merger"
                      r"|pre_mm_projector_norm)\..*|rope_freqs\.weight")


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


@dataclass
class _Entry:
    """One canonical tensor: its shape (known without reading data) and how to read it.

    ``load()`` reads all of it; ``load(index)`` only the part ``index`` (one slice per dim) selects.
    """

    shape: tuple[int, ...]
    load: Callable[..., torch.Tensor]
    origin: str  # tensor name(s) in the file, for messages


# ---------------------------------------------------------------------------------------------- loading
def _rename(source: TensorSource, rules: list[_Rule]) -> tuple[dict[str, _Entry], list[str]]:
    """Map file tensors to canonical entries; per-expert tensors are stacked. Returns (entries, unexpected)."""
    compiled = [(re.compile(pattern), template, split) for pattern, template, split in rules]
    entries: dict[str, _Entry] = {}
    experts: dict[str, dict[int, str]] = {}  # canonical stacked name → {expert id: file name}
    unexpected: list[str] = []
    for name, shape in source.shapes.items():
        for pattern, template, split in compiled:
            m = pattern.fullmatch(name)
            if m is None:
                continue
            targets = m.expand(template).split("|")
            if "expert" in m.groupdict():
                experts.setdefault(targets[0], {})[int(m.group("expert"))] = name
            elif split == 1:
                entries[targets[0]] = _Entry(shape, lambda index=None, n=name: source.read(n, index), name)
            else:  # [E, 2I, H] → two [E, I, H]
                half = shape[-2] // 2
                for part, target in enumerate(targets):
                    entries[target] = _Entry(
                        (*shape[:-2], half, shape[-1]),
                        lambda index=None, n=name, a=part * half, h=half: (
                            source.read(n)[..., a:a + h, :] if index is None
                            else source.read(n, _offset_rows(index, a, h))), name)
            break
        else:
            if not _IGNORED.fullmatch(name):
                unexpected.append(name)
    for target, by_id in experts.items():
        names = [by_id[j] for j in sorted(by_id)]
        ids = sorted(by_id)
        if ids != list(range(len(ids))):
            raise CheckpointError(f"{target}: expert tensors are not numbered 0..{len(ids) - 1}: have {ids}")
        shapes = {n: list(source.shapes[n]) for n in names}
        if len({tuple(v) for v in shapes.values()}) > 1:
            raise CheckpointError(f"{target}: expert tensors differ in shape: {shapes}")
        entries[target] = _Entry((len(names), *source.shapes[names[0]]),
                                 lambda index=None, ns=names: torch.stack(
                                     [source.read(n) for n in ns] if index is None
                                     else [source.read(n, index[1:]) for n in ns[index[0]]]),
                                 f"{names[0]} … {names[-1]}")
    return entries, unexpected


def _offset_rows(index: Index, start: int, size: int) -> Index:
    """Index of the half ``[start, start + size)`` of dim -2 (a fused [E, 2I, H] tensor's w1 / w3 part):
    ``index`` selects inside the half. E.g. w3 = rows 96‥191 of gate_up_proj (I = 96), index rows 48‥95
    → file rows 144‥191."""
    first, last, step = index[-2].indices(size)
    if step != 1:
        raise ValueError(f"_offset_rows: shard slices must be contiguous, got step {step}")
    return (*index[:-2], slice(start + first, start + last), index[-1])


def _full_index(index: tuple[slice, ...], ndim: int) -> Index:
    """Pad ``index`` with whole-dim slices to ``ndim`` entries."""
    return (*index, *(slice(None),) * (ndim - len(index)))


def _check(path: Path, fmt: str, entries: dict[str, _Entry], unexpected: list[str], config: ModelConfig) -> None:
    expected = expected_shapes(config)
    if config.tie_embeddings:
        entries.pop("lm_head", None)  # some tied checkpoints also store the head; tied means it is the embedding
    missing = [n for n in expected if n not in entries]
    extra = unexpected + [f"{e.origin} (as {n})" for n, e in entries.items() if n not in expected]
    bad = [f"{e.origin} (as {n}): {list(e.shape)}, expected {list(expected[n])}"
           for n, e in entries.items() if n in expected and tuple(e.shape) != expected[n]]
    if missing or extra or bad:
        lines = [f"checkpoint {path} ({fmt} format) does not match its config:"]
        for title, items in (("missing (canonical names, see weights.py)", missing), ("unexpected", extra),
                             ("mis-shaped", bad)):
            if items:
                shown = items[:25] + ([f"… and {len(items) - 25} more"] if len(items) > 25 else [])
                lines.append(f"  {title}: " + ", ".join(shown))
        raise CheckpointError("\n".join(lines))


def load_checkpoint(
    path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
    progress: bool = True, shard: ShardFn | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a checkpoint into fused weights (names in the module docstring) of ``dtype`` on ``device``.

    ``shard(config, canonical_name)`` → slices (or None = whole): read only that part of each tensor
    (one tensor-parallel rank, :meth:`mistral_kernels.parallel.ParallelContext.shard`); fusion then joins
    the parts (the rank's q|k|v rows, w1|w3 rows). Safetensors read only the selected bytes; GGUF tensors
    are dequantized whole, then cut.

    Raises
    ------
    CheckpointError
        unknown format, or tensors missing / unexpected / mis-shaped (all listed in one message).
    """
    path = Path(path)
    fmt = detect_format(path)
    config = load_config(path)
    source, rules = open_tensors(path, fmt), _RULES[fmt]
    with contextlib.ExitStack() as stack:
        for closer in source.closers:
            stack.enter_context(closer)
        entries, unexpected = _rename(source, rules)
        _check(path, fmt, entries, unexpected, config)
        raw = {name: entries[name].load for name in expected_shapes(config)}
        if shard is not None:
            for name, entry in entries.items():
                index = shard(config, name) if name in raw else None
                if index is not None:
                    raw[name] = lambda e=entry, i=_full_index(index, len(entry.shape)): e.load(i)
        weights = dict(_fuse(config, raw, device, dtype, progress, desc=f"loading {path.name}"))
    return config, weights


def _fuse(
    config: ModelConfig, raw: dict[str, Callable[[], torch.Tensor]], device: torch.device | str,
    dtype: torch.dtype, progress: bool, desc: str,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield fused weights, reading each canonical tensor once (tqdm bar over the tensors)."""
    bar = tqdm(total=len(raw), desc=desc, unit="tensor", disable=not progress)

    def get(name: str) -> torch.Tensor:
        t = raw[name]().to(device=device, dtype=dtype)
        bar.update(1)
        return t

    try:
        yield "embed", get("embed")
        for n in range(config.n_layers):
            p = f"layers.{n}."
            yield p + "attn_norm", get(p + "attn_norm")
            yield p + "qkv", torch.cat([get(p + "wq"), get(p + "wk"), get(p + "wv")])
            yield p + "wo", get(p + "wo")
            yield p + "ffn_norm", get(p + "ffn_norm")
            if config.is_moe:
                yield p + "gate", get(p + "gate")
                for w in ("w1", "w3", "w2"):
                    yield p + w, get(p + "experts." + w).contiguous()
            else:
                yield p + "w13", torch.cat([get(p + "w1"), get(p + "w3")])
                yield p + "w2", get(p + "w2")
        yield "norm", get("norm")
        if not config.tie_embeddings:
            yield "lm_head", get("lm_head")
    finally:
        bar.close()
