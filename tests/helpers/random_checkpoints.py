"""Random checkpoints of any :class:`ModelConfig` in the three formats, written tensor by tensor (memory stays
one tensor however large the model: benchmarks/bench_load.py writes 7B-shaped ones with it).

HF and consolidated directories are written with our own streaming safetensors writer (a JSON header, then
the raw bytes, as the safetensors format specifies); GGUF files with ``gguf.GGUFWriter``'s tensor-info /
tensor-data calls. Values: random normal × 0.02 (norms 1), in the dtype asked; GGUF Q8_0 blocks are random
int8 with a small fp16 scale.

Shape letters: H hidden, I intermediate, V vocab, Hq / Hkv heads, D head_dim, E experts.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from mistral_kernels.config import ModelConfig

__all__ = ["file_tensors", "write_random_checkpoint"]

_ST_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def file_tensors(config: ModelConfig, fmt: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of ``config`` under ``fmt``'s naming (hf, consolidated, gguf), in file order."""
    c = config
    h, d, i = c.dim, c.head_dim, c.hidden_dim
    names = {
        "hf": ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.{n}.",
               "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.{x}_proj.weight",
               "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"),
        "consolidated": ("tok_embeddings.weight", "norm.weight", "output.weight", "layers.{n}.",
                         "attention_norm.weight", "ffn_norm.weight", "attention.w{x}.weight",
                         "feed_forward.w1.weight", "feed_forward.w3.weight", "feed_forward.w2.weight"),
        "gguf": ("token_embd.weight", "output_norm.weight", "output.weight", "blk.{n}.", "attn_norm.weight",
                 "ffn_norm.weight", "attn_{x}.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"),
    }[fmt]
    embed, norm, head, layer, attn_norm, ffn_norm, proj, gate, up, down = names
    if c.is_moe:
        raise ValueError("file_tensors: dense configs only")
    yield embed, (c.vocab_size, h)
    for n in range(c.n_layers):
        p = layer.format(n=n)
        yield p + attn_norm, (h,)
        for x, rows in (("q", c.n_heads * d), ("k", c.n_kv_heads * d), ("v", c.n_kv_heads * d)):
            yield p + proj.format(x=x), (rows, h)
        o = {"hf": "o", "consolidated": "o", "gguf": "output"}[fmt]
        yield p + proj.format(x=o), (h, c.n_heads * d)
        yield p + ffn_norm, (h,)
        yield p + gate, (i, h)
        yield p + up, (i, h)
        yield p + down, (h, i)
    yield norm, (h,)
    if not c.tie_embeddings:
        yield head, (c.vocab_size, h)


def _values(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator | None) -> torch.Tensor:
    """Norms 1; matrices random normal × 0.02, or (``gen`` None: fast, for memory tests) uniform ±0.02 rows."""
    if len(shape) == 1:
        return torch.ones(shape, dtype=dtype)
    if gen is None:
        row = torch.linspace(-0.02, 0.02, shape[-1], dtype=dtype)
        return row.expand(shape).contiguous()
    return (torch.randn(shape, generator=gen) * 0.02).to(dtype)


def write_random_checkpoint(config: ModelConfig, path: Path, fmt: str, dtype: torch.dtype = torch.bfloat16, *,
                            shards: int = 1, seed: int | None = 0, gguf_type: str = "F16") -> int:
    """Write a random checkpoint of ``config`` at ``path`` (a directory for hf / consolidated, a file for gguf).

    hf: config.json (``torch_dtype`` = ``dtype``) + ``shards`` safetensors files (+ index when > 1);
    consolidated: params.json + consolidated.safetensors; gguf: ``gguf_type`` F32 / F16 / BF16 / Q8_0
    matrices with F32 norms. ``seed=None`` writes a fixed pattern instead of random values (fast). Returns
    the bytes of tensor data written.
    """
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    tensors = list(file_tensors(config, fmt))
    if fmt == "gguf":
        return _write_gguf(config, path, tensors, gguf_type, gen)
    path.mkdir(parents=True, exist_ok=True)
    c = config
    if fmt == "hf":
        (path / "config.json").write_text(json.dumps({
            "model_type": "mistral", "hidden_size": c.dim, "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
            "intermediate_size": c.hidden_dim, "vocab_size": c.vocab_size, "rms_norm_eps": c.norm_eps,
            "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position, "sliding_window": c.sliding_window,
            "tie_word_embeddings": c.tie_embeddings, "torch_dtype": str(dtype).removeprefix("torch."),
            "bos_token_id": 1, "eos_token_id": 2}))
    else:
        (path / "params.json").write_text(json.dumps({
            "dim": c.dim, "n_layers": c.n_layers, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim, "hidden_dim": c.hidden_dim, "vocab_size": c.vocab_size,
            "norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "max_seq_len": c.max_position,
            "tied_embeddings": c.tie_embeddings}))
        shards = 1
    per = math.ceil(len(tensors) / shards)
    groups = [tensors[k:k + per] for k in range(0, len(tensors), per)]
    files = ([f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
             if fmt == "hf" else ["consolidated.safetensors"])
    if fmt == "hf" and len(groups) == 1:
        files = ["model.safetensors"]
    total = 0
    for file, group in zip(files, groups):
        total += _write_safetensors(path / file, group, dtype, gen)
    if len(groups) > 1:
        (path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total},
             "weight_map": {n: f for f, g in zip(files, groups) for n, _ in g}}))
    return total


def _write_safetensors(file: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
                       gen: torch.Generator | None) -> int:
    """Tensors sorted by name, as ``safetensors.torch.save_file`` (hence ``save_pretrained``) lays them out."""
    tensors = sorted(tensors)
    header, offset = {}, 0
    for name, shape in tensors:
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": _ST_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shape in tensors:
            f.write(_values(shape, dtype, gen).view(torch.uint8).numpy().data)
    return offset


def gguf_llama_writer(path: Path, c: ModelConfig) -> "gguf.GGUFWriter":
    """A GGUFWriter for a "llama"-architecture file with ``c``'s hyper-parameters written (no tensors yet)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_position)
    w.add_embedding_length(c.dim)
    w.add_feed_forward_length(c.hidden_dim)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_vocab_size(c.vocab_size)
    return w


def _write_gguf(config: ModelConfig, path: Path, tensors: list[tuple[str, tuple[int, ...]]], kind: str,
                gen: torch.Generator | None) -> int:
    import gguf

    c = config
    q = gguf.GGMLQuantizationType[kind]
    w = gguf_llama_writer(path, c)

    def encode(shape: tuple[int, ...]) -> np.ndarray:
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        if q == gguf.GGMLQuantizationType.Q8_0:  # random blocks: fp16 scale, 32 int8
            rng = np.random.default_rng(None if gen is None else int(torch.randint(0, 2**31, (1,), generator=gen)))
            blocks = rng.integers(-127, 128, (*shape[:-1], shape[-1] // 32, 34), dtype=np.int8).view(np.uint8)
            blocks[..., :2] = np.array([2e-4], np.float16).view(np.uint8)
            return blocks.reshape(*shape[:-1], -1)
        values = _values(shape, {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[kind], gen)
        return values.view(torch.int16).numpy() if kind == "BF16" else values.numpy()

    def raw_type(shape: tuple[int, ...]) -> gguf.GGMLQuantizationType:
        return gguf.GGMLQuantizationType.F32 if len(shape) == 1 else q

    total = 0
    for name, shape in tensors:
        block, size = gguf.GGML_QUANT_SIZES[raw_type(shape)]
        nbytes = math.prod(shape) // block * size
        # a non-uint8 dtype: ``shape`` is taken as the element shape, not bytes
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=raw_type(shape))
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in tensors:
        w.write_tensor_data(encode(shape))
    w.close()
    return total
