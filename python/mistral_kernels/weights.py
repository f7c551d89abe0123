"""Checkpoint loading: HF directories, Mistral consolidated directories and GGUF files → fused weights.

Formats are detected and their tensors read by :mod:`mistral_kernels.formats` (docs/design.md §6); the
config comes from :func:`mistral_kernels.config.load_config`. The RoPE layout of q/k follows the format
(HF: neox; consolidated and GGUF: interleaved); no format's weights are permuted.

Every format is first renamed to one *canonical* unfused naming (below), checked against the shapes
the config implies (missing / unexpected / mis-shaped / integer-typed tensors are reported together), then
fused without a second copy. A weight stored in the final dtype on the CPU — a fused one too
when its parts lie back to back, as HF's gate_proj | up_proj do — is a private memory map of the file
(:func:`mistral_kernels.tensor_io.map_tensors`: page-cache pages, no copy); any other fused tensor
(``wq|wk|wv → qkv``, dense ``w1|w3 → w13``, MoE experts stacked) is allocated once in the final dtype and
its parts are read straight from the files into their rows (:func:`mistral_kernels.tensor_io.read_into`:
``preadv``; conversions and GGUF dequantization through a bounded scratch buffer). Peak memory is the
weights plus a few tens of MB.

Default dtype (``dtype=None``, like transformers' ``dtype="auto"``): the checkpoint's own —
``dtype`` / ``torch_dtype`` in config.json, else the stored dtype of most of the weights (consolidated
files: bf16 as Mistral publishes them; GGUF: F32 / F16 / BF16, quantized types → fp32 as they dequantize).
On the CPU fp16 becomes bf16 by default (same size; fp16 values with |x| < 2^-14 lose precision, others
keep 8 of their 11 significant bits; an explicit ``dtype=torch.float16`` keeps fp16, computed in fp32) and
fp64 becomes fp32 (:func:`default_dtype`).

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

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import ModelConfig, load_config
from .formats import CheckpointError, Index, TensorInfo, TensorSource, detect_format, open_tensors, read_json
from .packed_load import QUANTIZE_CHOICES, is_native, quantize_fused, read_gguf_packed
from .quant_weight import PackedWeight
from .tensor_io import selected_shape

# CheckpointError and detect_format are defined in errors.py / formats.py and re-exported here.
__all__ = ["CheckpointError", "QuantizedFallbackWarning", "checkpoint_dtype", "default_dtype", "detect_format",
           "expected_shapes", "load_checkpoint", "stored_tensors"]


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
Fill = Callable[[torch.Tensor, "Index | None"], None]  # (out, index) → out holds the tensor or its part


@dataclass
class _Entry:
    """One canonical tensor: its shape (known without reading data) and how to read it.

    ``fill(out, None)`` reads all of it into ``out``; ``fill(out, index)`` only the part ``index`` (one slice
    per dim) selects. ``stored`` are the file tensors it reads (dtypes, byte counts).
    """

    shape: tuple[int, ...]
    fill: Fill
    origin: str  # tensor name(s) in the file, for messages
    stored: tuple[TensorInfo, ...]


# ---------------------------------------------------------------------------------------------- loading
def _rename(source: TensorSource, rules: list[_Rule]) -> tuple[dict[str, _Entry], list[str]]:
    """Map file tensors to canonical entries; per-expert tensors are stacked. Returns (entries, unexpected)."""
    compiled = [(re.compile(pattern), template, split) for pattern, template, split in rules]
    entries: dict[str, _Entry] = {}
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
                entries[targets[0]] = _Entry(shape, lambda out, index, n=name: source.read_into(n, out, index),
                                             name, (info,))
            elif len(shape) == 3 and shape[-2] % 2 == 0:  # [E, 2I, H] → two [E, I, H]
                half = shape[-2] // 2
                for part, target in enumerate(targets):
                    entries[target] = _Entry(
                        (*shape[:-2], half, shape[-1]),
                        lambda out, index, n=name, a=part * half, h=half: source.read_into(
                            n, out, _offset_rows(index or _full_index((), 3), a, h)), name, (info,))
            else:
                unexpected.append(f"{name} {list(shape)} (expected [E, 2·I, H])")
            break
        else:
            if not _IGNORED.fullmatch(name):
                unexpected.append(name)
    for target, by_id in experts.items():
        ids = sorted(by_id)
        names = [by_id[j] for j in ids]
        if ids != list(range(len(ids))):
            raise CheckpointError(f"{target}: expert tensors are not numbered 0..{len(ids) - 1}: have {ids[:20]}")
        shapes = {n: list(source.tensors[n].shape) for n in names}
        if len({tuple(v) for v in shapes.values()}) > 1:
            raise CheckpointError(f"{target}: expert tensors differ in shape: {shapes}")
        entries[target] = _Entry((len(names), *source.tensors[names[0]].shape),
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
    integer = [f"{t.name} ({t.type_name})" for n, e in entries.items() if n in expected for t in e.stored
               if not t.dtype.is_floating_point]
    if missing or extra or bad or integer:
        lines = [f"checkpoint {path} ({fmt} format) does not match its config:"]
        for title, items in (("missing (canonical names, see weights.py)", missing), ("unexpected", extra),
                             ("mis-shaped", bad), ("not floating-point (weights must be F32 / F16 / BF16)", integer)):
            if items:
                shown = items[:25] + ([f"… and {len(items) - 25} more"] if len(items) > 25 else [])
                lines.append(f"  {title}: " + ", ".join(shown))
        raise CheckpointError("\n".join(lines))


def stored_tensors(path: str | Path) -> tuple[ModelConfig, str, dict[str, tuple[TensorInfo, ...]]]:
    """(config, format, canonical name → the file tensors it is read from), checked as :func:`load_checkpoint`
    checks them; reads headers only (``mistral-kernels info``'s formats and bytes)."""
    p = Path(path)
    fmt = detect_format(p)
    config = load_config(p)
    with open_tensors(p, fmt) as source:
        entries, unexpected = _rename(source, _RULES[fmt])
        _check(p, fmt, entries, unexpected, config)
    return config, fmt, {name: entries[name].stored for name in expected_shapes(config)}


# ---------------------------------------------------------------------------------------------- dtype
_CONFIG_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                  "float64": torch.float64}


def checkpoint_dtype(path: str | Path) -> torch.dtype:
    """The checkpoint's own dtype (module docstring): config.json's ``dtype`` / ``torch_dtype``, else the dtype
    holding most of the stored weight elements (GGUF quantized types count as fp32). Reads headers only."""
    p = Path(path)
    fmt = detect_format(p)
    if fmt == "hf":
        config = read_json(p / "config.json")
        named = str(config.get("dtype") or config.get("torch_dtype") or "").removeprefix("torch.")
        if named in _CONFIG_DTYPES:
            return _CONFIG_DTYPES[named]
    with open_tensors(p, fmt) as source:
        counts: dict[torch.dtype, int] = {}
        for t in source.tensors.values():
            if t.dtype.is_floating_point:
                counts[t.dtype] = counts.get(t.dtype, 0) + math.prod(t.shape)
    if not counts:
        raise CheckpointError(f"{p}: no floating-point tensors to take a dtype from")
    return max(counts, key=lambda d: counts[d])


def default_dtype(path: str | Path, device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype a model loads in when none is asked: :func:`checkpoint_dtype`, with fp64 → fp32 and, on the
    CPU, fp16 → bf16 (an explicit fp16 runs there as well)."""
    dtype = checkpoint_dtype(path)
    if dtype == torch.float64:
        return torch.float32
    if dtype == torch.float16 and torch.device(device).type == "cpu":
        return torch.bfloat16
    return dtype


def load_checkpoint(
    path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
    progress: bool = False, shard: ShardFn | None = None, map_files: bool = True, quantized: bool = True,
    quantize: str | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor | PackedWeight]]:
    """Read a checkpoint into fused weights (names in the module docstring) of ``dtype`` on ``device``.

    ``dtype=None`` loads in the checkpoint's own dtype (:func:`default_dtype`). ``progress`` shows a tqdm
    bar over the bytes read. ``map_files`` (CPU): weights stored in ``dtype`` — fused parts too when they
    lie back to back — are private memory maps of the files, populated from the page cache (no copy; the
    memory is the page cache's; writes stay private); ``False`` copies every weight into process memory
    (then nothing depends on the files after loading).

    ``shard(config, canonical_name)`` → slices (or None = whole): read only that part of each tensor (one
    tensor-parallel rank, :meth:`mistral_kernels.parallel.ParallelContext.shard`); fusion then joins the
    parts (the rank's q|k|v rows, w1|w3 rows). Safetensors read only the selected bytes; GGUF tensors are
    dequantized whole, then cut.

    Quantized weights (:mod:`mistral_kernels.packed_load`): ``quantized`` (default) keeps a GGUF's matrices
    in their stored formats where a native kernel exists (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) as packed
    weights, memory-mapped; ``dtype`` then sets the activations, norms, embedding and KV cache; other formats
    are dequantized with one notice (a :class:`QuantizedFallbackWarning`). ``quantized=False`` (or a
    ``shard``) dequantizes every tensor, as before. ``quantize="int8"`` stores every matrix of any format as
    INT8_ROWWISE (per output row symmetric; a GGUF's blocks are decoded first). The tied LM head of a packed
    embedding is returned as ``lm_head`` (the packed blocks; ``embed`` is dequantized).

    Raises
    ------
    CheckpointError
        unknown format, corrupt files, config fields out of range, or tensors missing / unexpected /
        mis-shaped / integer-typed (all listed in one message).
    """
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"load_checkpoint: quantize must be None or one of {QUANTIZE_CHOICES}, got {quantize!r}")
    if quantize is not None and shard is not None:
        raise ValueError("load_checkpoint: quantize is not supported with tensor parallelism (shard)")
    path = Path(path)
    fmt = detect_format(path)
    config = load_config(path)
    if dtype is None:
        dtype = default_dtype(path, device)
    packed = quantized and quantize is None and shard is None and fmt == "gguf"
    with open_tensors(path, fmt) as source:
        entries, unexpected = _rename(source, _RULES[fmt])
        _check(path, fmt, entries, unexpected, config)
        parts = {name: (entries[name], None if shard is None else shard(config, name))
                 for name in expected_shapes(config)}
        parts = {name: (e, None if index is None else _full_index(index, len(e.shape)))
                 for name, (e, index) in parts.items()}
        plan = _fusion_plan(config)
        total = sum(_bytes_to_read(*parts[p]) for _, names in plan for p in names)
        weights: dict[str, torch.Tensor | PackedWeight] = {}
        fallback: dict[str, int] = {}  # formats dequantized for want of a kernel → tensors
        with tqdm(total=total, desc=f"loading {path.name}", unit="B", unit_scale=True, unit_divisor=1024,
                  disable=not progress) as bar:
            for fused, names in plan:
                fused_parts = [parts[n] for n in names]
                stored = [t for e, _ in fused_parts for t in e.stored]
                matrix = _is_matrix(fused)
                if matrix and quantize is not None:
                    dense = _read_fused(fused_parts, "cpu", _stored_dtype(stored), bar.update,
                                        source if map_files else None)
                    weights[fused] = quantize_fused(dense, device)
                    continue
                if matrix and packed:
                    shape = (sum(e.shape[0] for e, _ in fused_parts), *fused_parts[0][0].shape[1:])
                    weight = read_gguf_packed(stored, shape, source, device)
                    if weight is not None:
                        bar.update(sum(t.nbytes for t in stored))
                        weights[fused] = weight
                        continue
                    for t in stored:
                        if t.ggml_type is not None and not is_native(t):
                            fallback[t.type_name] = fallback.get(t.type_name, 0) + 1
                weights[fused] = _read_fused(fused_parts, device, dtype, bar.update, source if map_files else None)
            if packed and config.tie_embeddings:
                embed = entries["embed"]
                head = read_gguf_packed(embed.stored, embed.shape, source, device)
                if head is not None:
                    weights["lm_head"] = head
    if fallback:
        kinds = ", ".join(f"{k} ({n} tensors)" for k, n in sorted(fallback.items()))
        warnings.warn(f"{path.name}: {kinds} have no native kernel: dequantized to "
                      f"{str(dtype).removeprefix('torch.')} at load, with the matrices fused with them",
                      QuantizedFallbackWarning, stacklevel=2)
    return config, weights


class QuantizedFallbackWarning(UserWarning):
    """Some quantized tensors of a GGUF were dequantized at load (no native kernel for their format)."""


_MATRIX_SUFFIXES = (".qkv", ".wo", ".w13", ".w2", ".w1", ".w3")


def _is_matrix(fused: str) -> bool:
    """A fused weight that the decoder multiplies by (``ops.linear`` / the MoE experts): packable."""
    return fused == "lm_head" or fused.endswith(_MATRIX_SUFFIXES)


def _stored_dtype(stored: list[TensorInfo]) -> torch.dtype:
    """The dtype to read parts in before int8 quantization: their stored one if they share it, else fp32."""
    kinds = {t.dtype for t in stored if t.ggml_type is None}
    return kinds.pop() if len(kinds) == 1 and all(t.ggml_type is None for t in stored) else torch.float32


def _fusion_plan(config: ModelConfig) -> list[tuple[str, list[str]]]:
    """Fused name → the canonical tensors joined along dim 0 to make it, in reading (= file) order."""
    plan = [("embed", ["embed"])]
    for n in range(config.n_layers):
        p = f"layers.{n}."
        plan += [(p + "attn_norm", [p + "attn_norm"]), (p + "qkv", [p + "wq", p + "wk", p + "wv"]),
                 (p + "wo", [p + "wo"]), (p + "ffn_norm", [p + "ffn_norm"])]
        if config.is_moe:
            plan += [(p + "gate", [p + "gate"])] + [(p + w, [p + "experts." + w]) for w in ("w1", "w3", "w2")]
        else:
            plan += [(p + "w13", [p + "w1", p + "w3"]), (p + "w2", [p + "w2"])]
    plan.append(("norm", ["norm"]))
    if not config.tie_embeddings:
        plan.append(("lm_head", ["lm_head"]))
    return plan


def _bytes_to_read(entry: _Entry, index: Index | None) -> int:
    """File bytes behind ``entry[index]`` (the stored bytes per element × the elements selected)."""
    stored = sum(t.nbytes for t in entry.stored)
    elements = sum(math.prod(t.shape) for t in entry.stored)
    return stored * math.prod(selected_shape(entry.shape, index)) // max(1, elements)


def _read_fused(parts: list[tuple[_Entry, Index | None]], device: torch.device | str, dtype: torch.dtype,
                advance: Callable[[int], object], source: TensorSource | None) -> torch.Tensor:
    """The fused tensor: a view of the file when ``source`` allows it (whole parts stored back to back in
    ``dtype``, CPU), else allocated once with each part read straight into its rows (no concatenation copy)."""
    shapes = [selected_shape(e.shape, index) for e, index in parts]
    if len({s[1:] for s in shapes}) > 1:
        raise CheckpointError(f"cannot fuse {[e.origin for e, _ in parts]}: shapes {shapes} differ past dim 0")
    shape = (sum(s[0] for s in shapes), *shapes[0][1:])
    whole = all(index is None and math.prod(e.shape) == sum(math.prod(t.shape) for t in e.stored)
                for e, index in parts)
    if source is not None and whole and torch.device(device).type == "cpu":
        mapped = source.map([t.name for e, _ in parts for t in e.stored], dtype)
        if mapped is not None:
            advance(sum(_bytes_to_read(e, None) for e, _ in parts))
            return mapped.view(shape)
    out = torch.empty(shape, dtype=dtype, device=device)
    row = 0
    for (entry, index), shape in zip(parts, shapes):
        entry.fill(out[row:row + shape[0]], index)
        advance(_bytes_to_read(entry, index))
        row += shape[0]
    return out
