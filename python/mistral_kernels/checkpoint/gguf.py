"""GGUF checkpoints (llama.cpp): one file starting with the bytes ``GGUF``.

Detection: the magic. The file is opened once: its header (:mod:`.gguf_header`) gives the config
(:func:`config_from_metadata`), the tensor infos (:func:`~mistral_kernels.checkpoint.tensor_io.gguf_tensors`)
and the tokenizer (its ``tokenizer.ggml.*`` metadata); the same descriptor then reads and maps the data.
Tensors: llama.cpp names (below); q/k rows in the interleaved RoPE layout. Dtype: the stored one of most
weights (quantized types count as fp32, as they dequantize).

Packed reading (:meth:`GGUFFormat.read_packed`): the parts of a fused matrix in block formats with a native
kernel (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) become one
:class:`~mistral_kernels.quant_weight.QuantizedWeight` per run of consecutive parts of one format — a memory
map of the file when the run's tensors lie back to back, else one uint8 buffer read straight from the file —
and a :class:`~mistral_kernels.quant_weight.FusedWeight` when the runs differ in format (Q4_K_M: wq | wk in
Q4_K, wv in Q6_K). Every block's fp16 scales are checked finite at load (:mod:`.finite`, the same check
as for blocks that are dequantized): a corrupt block is a :class:`CheckpointError`, not NaN logits. Which matrices stay packed is :mod:`.packing`'s decision.

Shape letters: N out features (rows), K in features, R packed row bytes, E experts.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import CheckpointError, UnsupportedCheckpointError
from ..ops.quant import QFORMAT_BY_CODE, QFormat
from ..quant_weight import FusedWeight, PackedWeight, QuantizedWeight
from ..rope_scaling import RopeScaling
from .fields import Fields, as_tuple, build, token_id
from .finite import check_block_scales
from .format import Contents, Format
from .gguf_header import GGUF_MAGIC, read_gguf_header_fd
from .naming import Rule
from .source import Probe, TensorSource
from .tensor_io import TensorInfo, gguf_tensors

__all__ = ["GGUF", "ROPE_FREQS", "config_from_metadata"]

ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-pair RoPE frequency divisors [R/2]

class GGUFFormat(Format):
    name = "gguf"
    expects = "a GGUF file (first bytes b'GGUF')"
    is_file = True
    rules: list[Rule] = [
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
    ignored = re.compile(re.escape(ROPE_FREQS))  # RoPE factors: read into the config

    def detect(self, probe: Probe) -> bool:
        return probe.is_file and probe.magic[:4] == GGUF_MAGIC

    def read(self, probe: Probe) -> Contents:
        p, fd = probe.path, probe.take_fd()
        source = TensorSource({}, {p: fd})  # owns fd from here: closed with the source
        try:
            header = read_gguf_header_fd(fd, p)
            factors = None
            if ROPE_FREQS in header.tensor_shapes:  # a tensor read only for files that have it (Llama 3.x)
                source.tensors = gguf_tensors(p, header, os.fstat(fd).st_size)
                factors = tuple(float(f) for f in source.read(ROPE_FREQS).flatten().tolist())
            config = config_from_metadata(header.metadata, header.tensor_shapes.keys(), factors, str(p))
            if not source.tensors:
                source.tensors = gguf_tensors(p, header, os.fstat(fd).st_size)
        except BaseException:
            source.close()
            raise
        return Contents(config, source, tokenizer=header.metadata)

    def read_packed(self, stored: Sequence[TensorInfo], shape: tuple[int, ...], source: TensorSource,
                    device: torch.device | str) -> PackedWeight:
        runs: list[list[TensorInfo]] = []
        for t in stored:
            if runs and runs[-1][0].ggml_type == t.ggml_type:
                runs[-1].append(t)
            else:
                runs.append([t])
        k = shape[-1]
        parts = []
        for run in runs:
            f = QFORMAT_BY_CODE[run[0].ggml_type]  # type: ignore[index]
            rows = sum(math.prod(t.shape[:-1]) for t in run)
            run_shape = (rows, k) if len(shape) == 2 else shape
            data = _packed_bytes(run, source)
            _check_scales(run, f, data)
            qweight = data.view(*run_shape[:-1], f.row_bytes(k))
            parts.append(QuantizedWeight(qweight.to(device), f.qtype, run_shape))
        return parts[0] if len(parts) == 1 else FusedWeight(tuple(parts))


GGUF = GGUFFormat()


def _packed_bytes(run: list[TensorInfo], source: TensorSource) -> torch.Tensor:
    """uint8 [bytes] of the run's blocks: a private map of the file when they lie back to back, else read."""
    mapped = source.map_packed([t.name for t in run])
    if mapped is not None:
        return mapped
    out = torch.empty(sum(t.nbytes for t in run), dtype=torch.uint8)
    at = 0
    for t in run:
        source.read_packed(t.name, out[at:at + t.nbytes])
        at += t.nbytes
    return out


def _check_scales(run: list[TensorInfo], f: QFormat, data: torch.Tensor) -> None:
    """CheckpointError naming the tensor and block when a block's fp16 scale is inf / NaN (:mod:`.finite`)."""
    at = 0
    for t in run:
        check_block_scales(t, data[at:at + t.nbytes], f.bytes)
        at += t.nbytes


def config_from_metadata(metadata: Mapping[str, Any], tensor_names: Collection[str],
                         rope_freq_factors: tuple[float, ...] | None = None,
                         source: str = "GGUF metadata") -> ModelConfig:
    """From a GGUF file's metadata and tensor names (llama architecture: Llama, Mistral, Mixtral).

    Both come from the header (:mod:`.gguf_header`). GGUF q/k weights are stored in the interleaved layout
    by llama.cpp → interleaved RoPE. Tied embeddings ⇔ the file has no ``output.weight`` tensor. A
    ``rope_freqs.weight`` tensor (llama.cpp's form of Llama 3.1's RoPE scaling) is data, not metadata:
    :meth:`GGUFFormat.read` reads it and passes ``rope_freq_factors``.
    """
    f = Fields(metadata, source)
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise UnsupportedCheckpointError(f"{source}: general.architecture={arch!r} is not supported (llama)")
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedCheckpointError(f"{source}: RoPE scaling {scaling!r} is not supported")
    dim = f.int(f"{arch}.embedding_length", "dim")
    heads = f.int(f"{arch}.attention.head_count", "n_heads")
    head_dim = f.int(f"{arch}.attention.key_length", "head_dim", dim // heads)
    rot = f.int(f"{arch}.rope.dimension_count", "rotary_dim", head_dim)
    vocab = f.int(f"{arch}.vocab_size", "vocab_size", None)
    if vocab is None:
        tokens = f.raw("tokenizer.ggml.tokens")
        vocab = Fields({"vocab": len(tokens) if isinstance(tokens, list) else tokens}, source).int(
            "vocab", "vocab_size")
    experts = f.int(f"{arch}.expert_count", "num_experts", 0)
    return build(source, lambda: ModelConfig(
        dim=dim,
        n_layers=f.int(f"{arch}.block_count", "n_layers"),
        n_heads=heads,
        n_kv_heads=f.int(f"{arch}.attention.head_count_kv", "n_kv_heads", heads),
        head_dim=head_dim,
        hidden_dim=f.int(f"{arch}.feed_forward_length", "hidden_dim"),
        vocab_size=vocab,
        norm_eps=f.float(f"{arch}.attention.layer_norm_rms_epsilon", "norm_eps", 1e-5),
        rope_theta=f.float(f"{arch}.rope.freq_base", "rope_theta", 10000.0),
        rope_is_neox=False,
        rotary_dim=rot if rot != head_dim else None,
        rope_scaling=None if rope_freq_factors is None else RopeScaling("freq_factors", 1.0,
                                                                        freq_factors=rope_freq_factors),
        tie_embeddings="output.weight" not in tensor_names,
        num_experts=experts,
        top_k=f.int(f"{arch}.expert_used_count", "top_k", 0) if experts else 0,
        max_position=f.int(f"{arch}.context_length", "max_position", 32768),
        bos_token_id=token_id(metadata.get("tokenizer.ggml.bos_token_id"), source),
        eos_token_ids=as_tuple(metadata.get("tokenizer.ggml.eos_token_id"), source),
    ))
