"""Random GGUF checkpoints with quantized matrices, one format per tensor (Llama or Mixtral layout), written
tensor by tensor with ``gguf.GGUFWriter`` (memory stays one tensor: benchmarks/bench_quant_model.py writes a
Mistral-7B-shaped Q4_K_M-like file with it).

Q4_0 / Q4_1 / Q5_0 / Q8_0 tensors are random normal values quantized by the ``gguf`` package; the K-quants
(which its quantizer cannot write) are random bytes with small finite fp16 super-block scales, as in
tests/test_gguf.py. Norms are F32 ones.

Shape letters: H hidden, I intermediate, V vocab, Hq / Hkv heads, D head_dim, E experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np

from mistral_kernels.config import ModelConfig

from .random_checkpoints import gguf_llama_writer

__all__ = ["K_QUANT_SCALES", "Q4_K_M", "gguf_tensors_of", "uniform", "write_quant_gguf"]

Q = gguf.GGMLQuantizationType
TypeOf = Callable[[str, tuple[int, ...]], str]  # (GGUF tensor name, shape) → type name for a matrix

# K-quant block: byte offsets of its fp16 super-block scales and a value that keeps decoded weights ≲ 0.05.
K_QUANT_SCALES = {"Q4_K": ((0, 2), 4e-5), "Q5_K": ((0, 2), 2e-5), "Q6_K": ((208,), 1e-5)}


def uniform(kind: str) -> TypeOf:
    """Every matrix in ``kind`` (the embedding too)."""
    return lambda name, shape: kind


def Q4_K_M(name: str, shape: tuple[int, ...]) -> str:  # noqa: N802 (llama.cpp's name for the mix)
    """llama.cpp's Q4_K_M mix, simplified: attn_v, ffn_down and the output head in Q6_K, the rest Q4_K."""
    return "Q6_K" if any(k in name for k in ("attn_v", "ffn_down", "output.weight")) else "Q4_K"


def gguf_tensors_of(c: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape) of every tensor of ``c`` in llama.cpp's order (MoE: merged ``ffn_*_exps``)."""
    h, d, i, e = c.dim, c.head_dim, c.hidden_dim, c.num_experts
    yield "token_embd.weight", (c.vocab_size, h)
    for n in range(c.n_layers):
        p = f"blk.{n}."
        yield p + "attn_norm.weight", (h,)
        yield p + "attn_q.weight", (c.n_heads * d, h)
        yield p + "attn_k.weight", (c.n_kv_heads * d, h)
        yield p + "attn_v.weight", (c.n_kv_heads * d, h)
        yield p + "attn_output.weight", (h, c.n_heads * d)
        yield p + "ffn_norm.weight", (h,)
        if e:
            yield p + "ffn_gate_inp.weight", (e, h)
            yield p + "ffn_gate_exps.weight", (e, i, h)
            yield p + "ffn_up_exps.weight", (e, i, h)
            yield p + "ffn_down_exps.weight", (e, h, i)
        else:
            yield p + "ffn_gate.weight", (i, h)
            yield p + "ffn_up.weight", (i, h)
            yield p + "ffn_down.weight", (h, i)
    yield "output_norm.weight", (h,)
    if not c.tie_embeddings:
        yield "output.weight", (c.vocab_size, h)


def write_quant_gguf(path: Path, c: ModelConfig, type_of: TypeOf, *, seed: int = 0, scale: float = 0.05,
                     metadata: Callable[[gguf.GGUFWriter], None] | None = None) -> int:
    """Write a random GGUF of ``c`` with each matrix in ``type_of(name, shape)`` (the router F32); returns the
    bytes of tensor data. Values: normal × ``scale`` (the embedding × 10). ``metadata(writer)`` adds keys
    (e.g. a tokenizer) before the header is written."""
    rng = np.random.default_rng(seed)
    w = gguf_llama_writer(path, c)
    if metadata is not None:
        metadata(w)
    w.add_rope_dimension_count(c.head_dim)
    if c.num_experts:
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.top_k)
    tensors = list(gguf_tensors_of(c))

    def kind(name: str, shape: tuple[int, ...]) -> str:
        return "F32" if len(shape) == 1 or "ffn_gate_inp" in name else type_of(name, shape)

    total = 0
    for name, shape in tensors:
        block, size = gguf.GGML_QUANT_SIZES[Q[kind(name, shape)]]
        nbytes = math.prod(shape) // block * size
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=Q[kind(name, shape)])
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in tensors:
        w.write_tensor_data(_encode(shape, kind(name, shape), rng, scale * (10 if "token_embd" in name else 1)))
    w.close()
    return total


def _encode(shape: tuple[int, ...], kind: str, rng: np.random.Generator, scale: float) -> np.ndarray:
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    if kind in K_QUANT_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[Q[kind]]
        rows = math.prod(shape[:-1])
        raw = rng.integers(0, 256, (rows, shape[-1] // block, size), dtype=np.uint8)
        offsets, value = K_QUANT_SCALES[kind]
        for offset in offsets:
            raw[..., offset:offset + 2] = np.full((rows, shape[-1] // block, 1), value, np.float16).view(np.uint8)
        return raw.reshape(*shape[:-1], -1)
    x = (rng.standard_normal(shape, dtype=np.float32) * scale)
    if kind == "F32":
        return x
    return gguf.quants.quantize(x, Q[kind])
