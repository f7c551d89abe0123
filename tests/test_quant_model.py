"""Quantized weights in the model: a GGUF's formats computed natively vs the same model dequantized at load,
int8 weight-only vs the dense model, the real SmolLM2 Q4_1 file, and corrupt quantized tensors.

References: the dequantized model (``quantized=False``: every block decoded by the ``gguf`` package, dense
fp32 matmuls) — the native model must give the same logits up to fp32 summation order (|Δlogit| ≤ 1e-3 on
logits of std ≳ 0.1; activations are not quantized) and the same 32 greedy tokens. int8: the model whose dense
weights are exactly the int8 values × scales (same bound), and the original fp32 model within the int8
rounding bound stated in ``test_int8_close_to_dense``.

Shape letters: H hidden, I intermediate, V vocab, Hq / Hkv heads, D head_dim, E experts, T tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mistral_kernels import load_model, ops, reference
from mistral_kernels.config import ModelConfig
from mistral_kernels.model import Model
from mistral_kernels.checkpoint import Checkpoint, CheckpointError, QuantizedFallbackWarning, load_checkpoint
from mistral_kernels.quant_weight import FusedWeight, QuantizedWeight, format_names, quantize_int8, weight_bytes
from mistral_kernels.stats import weight_bytes as step_weight_bytes

from .helpers.model_helpers import greedy_ours
from .helpers.random_checkpoints import write_random_checkpoint

gguf = pytest.importorskip("gguf")
from .helpers.quant_checkpoints import Q4_K_M, uniform, write_quant_gguf  # noqa: E402

NATIVE = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# K-quant rows must be whole 256-element super-blocks: H = I = 256
LLAMA = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=256,
                    rope_is_neox=False, max_position=128)
MIXTRAL = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=256,
                      rope_is_neox=False, max_position=128, num_experts=4, top_k=2)
ATOL = 1e-3
IDS = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(3))


def _formats(model: Model) -> set[str]:
    """The packed formats of the model's matrices (empty when everything is dense)."""
    return {f for name, w in model.named_weights() if name.startswith("layers.") for f in format_names(w)}


def _check_native_matches_dequantized(path: Path) -> Model:
    native = load_model(path, dtype=torch.float32, activations="exact")  # the exact native path
    dense = load_model(path, dtype=torch.float32, quantized=False)
    assert not _formats(dense)
    expected = dense.logits(IDS)
    assert expected.isfinite().all() and expected.std() > 0.1  # a meaningful comparison
    torch.testing.assert_close(native.logits(IDS), expected, atol=ATOL, rtol=0)
    assert greedy_ours(native, IDS, 32) == greedy_ours(dense, IDS, 32)
    return native


@pytest.mark.parametrize("kind", NATIVE)
def test_each_format_native_matches_dequantized(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.gguf"
    write_quant_gguf(path, LLAMA, uniform(kind))
    native = _check_native_matches_dequantized(path)
    assert _formats(native) == {kind}
    assert isinstance(native.lm_head, QuantizedWeight) and native.lm_head.format.name == kind
    assert native.embed.dtype == torch.float32  # the embedding is dequantized at load (a gather, not a matmul)


def test_q4_k_m_mix_keeps_parts_of_each_format(tmp_path: Path) -> None:
    """qkv = wq | wk (Q4_K) + wv (Q6_K): a FusedWeight of two runs; w13 one Q4_K run; w2 Q6_K; tied head."""
    path = tmp_path / "q4km.gguf"
    tied = ModelConfig(**{**vars(LLAMA), "tie_embeddings": True})
    write_quant_gguf(path, tied, Q4_K_M)
    native = _check_native_matches_dequantized(path)
    layer = native.layers[0]
    assert isinstance(layer.qkv, FusedWeight)
    assert [(p.format.name, p.shape) for p in layer.qkv.parts] == [("Q4_K", (384, 256)), ("Q6_K", (128, 256))]
    assert isinstance(layer.w13, QuantizedWeight) and layer.w13.format.name == "Q4_K"
    assert layer.w13.shape == (512, 256) and layer.w2.format.name == "Q6_K"
    assert native.lm_head.format.name == "Q4_K"  # tied: the packed token_embd


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_mixtral_packed_experts_match_dequantized(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "moe.gguf"
    write_quant_gguf(path, MIXTRAL, uniform(kind))
    calls: list[bool] = []  # the experts run as grouped quantized GEMMs: (gate | up fused, down) per layer
    moe_qgemm = ops.moe_qgemm
    monkeypatch.setattr(ops, "moe_qgemm", lambda *a, **kw: calls.append(len(a) > 5) or moe_qgemm(*a, **kw))
    native = _check_native_matches_dequantized(path)
    layer = native.layers[0]
    assert isinstance(layer.w1, QuantizedWeight) and layer.w1.shape == (4, 256, 256)
    assert not isinstance(layer.gate, QuantizedWeight)  # the router stays dense
    assert calls and calls[:2 * MIXTRAL.n_layers] == [True, False] * MIXTRAL.n_layers


def test_other_formats_dequantize_with_one_notice(tmp_path: Path) -> None:
    path = tmp_path / "q5_0.gguf"
    write_quant_gguf(path, LLAMA, lambda name, shape: "Q5_0" if "attn_v" in name else "Q8_0")
    with pytest.warns(QuantizedFallbackWarning, match=r": Q5_0 \(2 tensors\) have no native kernel: dequantized") as record:
        native = _check_native_matches_dequantized(path)
    assert len([w for w in record if w.category is QuantizedFallbackWarning]) == 1
    assert isinstance(native.layers[0].qkv, torch.Tensor)  # wv Q5_0: the whole fused qkv is dequantized
    assert isinstance(native.layers[0].w13, QuantizedWeight)


# ------------------------------------------------------------------------------------------ int8
def test_quantize_int8_formula() -> None:
    w = torch.tensor([[0.5, -1.27, 0.0], [0.0, 0.0, 0.0], [2.54, 1.0, -0.01]])
    q = quantize_int8(w)
    torch.testing.assert_close(q.scales, torch.tensor([0.01, 0.0, 0.02]))
    assert q.qweight.tolist() == [[50, -127, 0], [0, 0, 0], [127, 50, -0]]


def _hf(tmp_path: Path) -> Path:
    path = tmp_path / "hf"
    write_random_checkpoint(ModelConfig(**{**vars(LLAMA), "rope_is_neox": True}), path, "hf", torch.float32)
    return path


def test_int8_matches_its_dequantized_weights(tmp_path: Path) -> None:
    """The int8 model vs a dense model built from the very int8 values × scales (exact up to fp32 order)."""
    path = _hf(tmp_path)
    config, weights = load_checkpoint(path, dtype=torch.float32, quantize="int8")
    assert all(isinstance(weights[f"layers.0.{n}"], QuantizedWeight) for n in ("qkv", "wo", "w13", "w2"))
    assert isinstance(weights["lm_head"], QuantizedWeight) and weights["embed"].dtype == torch.float32
    dense = {k: v.dequantize() if isinstance(v, QuantizedWeight) else v for k, v in weights.items()}
    torch.testing.assert_close(Model(config, weights).logits(IDS), Model(config, dense).logits(IDS), atol=ATOL,
                               rtol=0)


def test_int8_close_to_dense(tmp_path: Path) -> None:
    """int8 vs the original fp32 model. Per weight |Δw| ≤ max|w_row| / 254; through 2 layers and the int8 head
    this model's logits (std ≈ 0.32) move by ≈ 0.06 std at most (measured 0.0195): bound 0.1 std. (Its logits
    are nearly flat, so greedy tokens are compared in the native-vs-dequantized tests, not here.)"""
    path = _hf(tmp_path)
    dense = load_model(path, dtype=torch.float32, activations="exact")
    int8 = load_model(path, dtype=torch.float32, quantize="int8", activations="exact")
    expected = dense.logits(IDS)
    got = int8.logits(IDS)
    torch.testing.assert_close(got, expected, atol=0.1 * expected.std().item(), rtol=0)
    assert (got - expected).abs().max() > 0  # the weights were quantized


def test_int8_mixtral_experts(tmp_path: Path) -> None:
    """quantize='int8' on a Mixtral GGUF (its blocks decoded, then requantized per row): experts int8."""
    path = tmp_path / "moe.gguf"
    write_quant_gguf(path, MIXTRAL, uniform("Q8_0"))
    config, weights = load_checkpoint(path, dtype=torch.float32, quantize="int8")
    assert weights["layers.1.w2"].format.name == "INT8_ROWWISE" and weights["layers.1.w2"].shape == (4, 256, 256)
    dense = {k: v.dequantize() if isinstance(v, QuantizedWeight) else v for k, v in weights.items()}
    torch.testing.assert_close(Model(config, weights).logits(IDS), Model(config, dense).logits(IDS), atol=ATOL,
                               rtol=0)


# ------------------------------------------------------------------------------------------ bad files
def _tensor_offset(path: Path, name: str) -> int:
    from mistral_kernels.checkpoint.gguf_header import read_gguf_header

    header = read_gguf_header(path)
    return header.tensor_offsets[name]


# the first fp16 scale of a block (d), by format (GGML layouts, csrc/kernels/quant_blocks.h)
_D_OFFSET = {"Q4_0": 0, "Q4_1": 0, "Q8_0": 0, "Q4_K": 0, "Q5_K": 0, "Q6_K": 208}


@pytest.mark.parametrize("kind", NATIVE)
def test_corrupt_block_scale_is_a_checkpoint_error(tmp_path: Path, kind: str) -> None:
    """A block whose scale is fp16 NaN (gguf decodes it to NaN weights) → CheckpointError naming tensor and block."""
    path = tmp_path / "bad.gguf"
    write_quant_gguf(path, LLAMA, uniform(kind))
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]
    block = _tensor_offset(path, "blk.1.ffn_up.weight") + size * 5  # block 5
    data = bytearray(path.read_bytes())
    data[block + _D_OFFSET[kind]:block + _D_OFFSET[kind] + 2] = b"\xff\x7f"
    decoded = gguf.quants.dequantize(np.frombuffer(bytes(data[block:block + size]), "uint8"),
                                     gguf.GGMLQuantizationType[kind])
    assert not np.isfinite(decoded).all()  # the corruption is real
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"'blk.1.ffn_up.weight' \({kind} \[256, 256\]\): block 5 .*non-finite"):
        load_model(path)


def test_truncated_quantized_tensor_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    write_quant_gguf(path, LLAMA, uniform("Q6_K"))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 1000])
    with pytest.raises(CheckpointError, match="past the end of the file"):
        load_model(path)


def test_rows_not_whole_blocks_is_a_checkpoint_error(tmp_path: Path) -> None:
    """K = 128 is not a multiple of Q4_K's 256-element super-block."""
    path = tmp_path / "k128.gguf"
    small = ModelConfig(**{**vars(LLAMA), "dim": 128, "n_heads": 2, "n_kv_heads": 1})
    write_quant_gguf(path, small, lambda name, shape: "Q4_K" if shape[-1] % 256 == 0 else "Q8_0")
    # every K = 128 matrix is Q8_0 here (valid); rewrite one tensor's type in the header to Q4_K
    data = bytearray(path.read_bytes())
    needle = b"blk.0.attn_q.weight"
    at = data.index(needle) + len(needle) + 4 + 2 * 8  # after the name: n_dims u32, 2 dims u64, then the type
    assert int.from_bytes(data[at:at + 4], "little") == gguf.GGMLQuantizationType.Q8_0
    data[at:at + 4] = int(gguf.GGMLQuantizationType.Q4_K).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="not whole Q4_K blocks of 256"):
        load_model(path)


# ------------------------------------------------------------------------------------------ footprint (info)
@pytest.mark.parametrize("kw", [{}, {"quantized": False}, {"quantize": "int8"}], ids=["native", "dequantized", "int8"])
def test_footprint_is_what_loads(tmp_path: Path, kw: dict[str, object]) -> None:
    """``info``'s weights-as-loaded bytes (headers only) equal the bytes of the weights the loader returns."""
    path = tmp_path / "q4km.gguf"
    write_quant_gguf(path, ModelConfig(**{**vars(LLAMA), "tie_embeddings": True}), Q4_K_M)
    _, weights = load_checkpoint(path, dtype=torch.float32, **kw)
    loaded = sum(w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes for w in weights.values())
    with Checkpoint.open(path) as ckpt:
        assert ckpt.footprint(torch.float32, **kw).bytes == loaded
    model = Model(*load_checkpoint(path, dtype=torch.float32, **kw))
    names = [name for name, _ in model.named_weights()]
    assert len(names) == len(set(names)) == len(weights)  # every weight once (the tied head is the embedding)
    assert weight_bytes(w for _, w in model.named_weights()) == loaded
    # a decode step reads the embedding by rows only, unless it is the (tied, dense) head as well
    embed = 0 if "lm_head" not in weights else weights["embed"].numel() * weights["embed"].element_size()
    assert step_weight_bytes(model) == loaded - embed


class _CountingKernels:
    """An op namespace that counts the calls it forwards to ``inner``."""

    def __init__(self, inner: object) -> None:
        self.inner, self.calls = inner, {}

    def __getattr__(self, name: str) -> object:
        fn = getattr(self.inner, name)

        def counted(*args: object, **kwargs: object) -> object:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name == "linear" and not isinstance(args[1], torch.Tensor):
                self.calls["linear on packed"] = self.calls.get("linear on packed", 0) + 1
            return fn(*args, **kwargs)

        return counted


@pytest.mark.parametrize("config", [LLAMA, MIXTRAL], ids=["dense-ffn", "moe"])
def test_matmuls_go_through_the_model_kernels(tmp_path: Path, config: ModelConfig) -> None:
    """Every matmul of the per-op model is a call of its kernel namespace — packed weights included (their own
    qlinear, inside the namespace's linear); packed experts run their block inside the namespace's fused_moe —
    so the reference namespace computes the whole model."""
    path = tmp_path / "q4km.gguf"
    write_quant_gguf(path, config, Q4_K_M)
    cfg, weights = load_checkpoint(path, dtype=torch.float32)
    spy = _CountingKernels(ops)
    got = Model(cfg, weights, kernels=spy).logits(IDS)  # type: ignore[arg-type]
    matmuls = (2 if cfg.is_moe else 4) * cfg.n_layers + 1  # qkv, wo (, w13, w2) per layer; the head
    assert spy.calls["linear"] == matmuls
    assert spy.calls["linear on packed"] == matmuls  # Q4_K_M: every matrix packed, the head too
    assert spy.calls.get("fused_moe", 0) == (cfg.n_layers if cfg.is_moe else 0)
    want = Model(cfg, weights, kernels=reference).logits(IDS)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
