"""Helpers of tests/test_gguf.py that other tests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


gguf = pytest.importorskip("gguf")


Q = gguf.GGMLQuantizationType

H, L, HQ, HKV, D, I, V = 256, 2, 4, 2, 64, 256, 256  # K-quants need rows that are multiples of 256
# K-quant block: byte offsets of its fp16 super-block scales (d, dmin) and a value for them that keeps
# decoded weights around ±0.05 (|w| ≲ d · max sub-scale · max quant).
K_QUANT_SCALES = {Q.Q2_K: ((80, 82), 1e-3), Q.Q3_K: ((108,), 3e-4), Q.Q4_K: ((0, 2), 4e-5),
                  Q.Q5_K: ((0, 2), 2e-5), Q.Q6_K: ((208,), 1e-5)}


def _encode(x: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Bytes (or a float array) of tensor x [..., K] in qtype; K-quants: random blocks, x only gives the shape."""
    if qtype == Q.F32:
        return x
    if qtype in K_QUANT_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (*x.shape[:-1], x.shape[-1] // block, size), dtype=np.uint8)
        offsets, scale = K_QUANT_SCALES[qtype]
        for offset in offsets:  # small positive fp16 scales instead of random bits
            raw[..., offset:offset + 2] = np.full((*raw.shape[:-1], 1), scale, np.float16).view(np.uint8)
        return raw.reshape(*x.shape[:-1], -1)
    return gguf.quants.quantize(x, qtype)


def _writer(path: Path, arch: str = "llama", experts: int = 0) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(HQ)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    return w


def _close(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_dense(path: Path, qtype: Q, tied: bool, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    w = _writer(path)

    def add(name: str, shape: tuple[int, ...], tensor_type: Q = qtype, scale: float = 0.05) -> None:
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        data = _encode(x, tensor_type, rng)
        w.add_tensor(name, data, raw_dtype=None if tensor_type == Q.F32 else tensor_type)

    add("token_embd.weight", (V, H), scale=0.5)
    add("output_norm.weight", (H,), Q.F32, 1.0)
    if not tied:
        add("output.weight", (V, H))
    for n in range(L):
        add(f"blk.{n}.attn_norm.weight", (H,), Q.F32, 1.0)
        add(f"blk.{n}.ffn_norm.weight", (H,), Q.F32, 1.0)
        for name, rows in (("attn_q", HQ * D), ("attn_k", HKV * D), ("attn_v", HKV * D)):
            add(f"blk.{n}.{name}.weight", (rows, H))
        add(f"blk.{n}.attn_output.weight", (H, HQ * D))
        add(f"blk.{n}.ffn_gate.weight", (I, H))
        add(f"blk.{n}.ffn_up.weight", (I, H))
        add(f"blk.{n}.ffn_down.weight", (H, I))
    _close(w)
