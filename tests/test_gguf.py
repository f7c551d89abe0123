"""GGUF loading on tiny files written here: every supported tensor type vs transformers' GGUF loader,
MoE GGUF (merged and per-expert expert tensors) vs transformers' Mixtral, and error reports.

K-quant types cannot be produced by the ``gguf`` package's quantizer, so those tensors are random
well-formed blocks (random bits, small fp16 scales); their values are whatever ``gguf`` decodes.
Shape letters: H hidden, I intermediate, V vocab, Hq / Hkv heads, D head_dim, E experts, L layers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mistral_kernels import load_model
from mistral_kernels.checkpoint import CheckpointError, UnsupportedCheckpointError, load_checkpoint, load_config
from mistral_kernels.checkpoint.gguf_header import read_gguf_header

from .helpers.model_helpers import greedy_ours, greedy_transformers, hf_to_interleaved, logits_transformers

from .helpers.gguf_helpers import D, H, HKV, HQ, I, L, Q, V, _close, _write_dense, _writer, gguf

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("qtype,tied", [
    (Q.F32, True), (Q.F16, False), (Q.BF16, True), (Q.Q4_0, False), (Q.Q4_1, True), (Q.Q8_0, False),
    (Q.Q2_K, True), (Q.Q3_K, False), (Q.Q4_K, True), (Q.Q5_K, False), (Q.Q6_K, True),
], ids=lambda v: v.name if isinstance(v, Q) else ("tied" if v else "untied"))
def test_tensor_types_match_transformers(tmp_path: Path, qtype: Q, tied: bool) -> None:
    _write_dense(tmp_path / "tiny.gguf", qtype, tied)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    # fp32 parity (docs/design.md §5): the exact activations, not the default int8 inside the packed matmuls
    ours = load_model(tmp_path / "tiny.gguf", dtype=torch.float32, activations="exact")
    assert ours.config.tie_embeddings == tied and not ours.config.rope_is_neox
    ids = torch.randint(0, V, (24,), generator=torch.Generator().manual_seed(3))
    expected = logits_transformers(reference, ids)
    assert expected.isfinite().all() and expected.std() > 0.1  # a meaningful comparison
    torch.testing.assert_close(ours.logits(ids), expected, atol=1e-3, rtol=0)


# ------------------------------------------------------------------------------------------ header and config
def test_header_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    """The fast header reader (config, tokenizer, tensor shapes) vs the gguf package's GGUFReader."""
    path = tmp_path / "tiny.gguf"
    _write_dense(path, Q.Q8_0, tied=False)
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))
    assert header.tensor_shapes == {t.name: tuple(reversed(t.shape.tolist())) for t in reader.tensors}
    assert header.tensor_shapes["token_embd.weight"] == (V, H)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert header.metadata.keys() == fields.keys()
    for key, value in fields.items():
        assert header.metadata[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_load_config_reads_only_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither load_config nor load_checkpoint builds gguf.GGUFReader (its per-element numpy views are slow;
    tensor data is read at the offsets of the fast header reader), and both give the same config."""
    path = tmp_path / "tiny.gguf"
    _write_dense(path, Q.F32, tied=True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("GGUFReader built while reading the config")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    got = load_config(path)
    want, weights = load_checkpoint(path)
    assert got == want and got.tie_embeddings and (got.dim, got.n_layers, got.n_heads, got.n_kv_heads) == (H, L, HQ, HKV)
    assert weights["embed"].shape == (V, H)


# ------------------------------------------------------------------------------------------ MoE
@pytest.mark.parametrize("merged", [True, False], ids=["ffn_exps", "per_expert"])
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_moe_gguf_matches_transformers_mixtral(tmp_path: Path, merged: bool, qtype: Q) -> None:
    """A Mixtral written as GGUF the way llama.cpp does (q/k rows interleaved) vs the HF model whose
    weights are the values the file decodes to."""
    experts = 4
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                                     num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D,
                                     num_local_experts=experts, num_experts_per_tok=2, rope_theta=10000.0,
                                     rms_norm_eps=1e-5, initializer_range=0.05, max_position_embeddings=128)
    hf = transformers.MixtralForCausalLM(cfg).eval()
    rng = np.random.default_rng(0)
    w = _writer(tmp_path / "moe.gguf", experts=experts)
    sd = hf.state_dict()

    def add(name: str, t: torch.Tensor, hf_key: str | None = None, quantize: bool = True) -> torch.Tensor:
        """Write t; return what the file decodes to (so the reference can use exactly those values)."""
        x = t.detach().float().numpy()
        if quantize and qtype != Q.F32:
            data = gguf.quants.quantize(x, qtype)
            w.add_tensor(name, data, raw_dtype=qtype)
            return torch.from_numpy(gguf.quants.dequantize(data, qtype))
        w.add_tensor(name, x)
        return t

    decoded: dict[str, torch.Tensor] = {}
    decoded["model.embed_tokens.weight"] = add("token_embd.weight", sd["model.embed_tokens.weight"])
    decoded["lm_head.weight"] = add("output.weight", sd["lm_head.weight"])
    decoded["model.norm.weight"] = add("output_norm.weight", sd["model.norm.weight"], quantize=False)
    for n in range(L):
        p = f"model.layers.{n}."
        for ours_name, key in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")):
            decoded[p + key + ".weight"] = add(f"blk.{n}.{ours_name}.weight", sd[p + key + ".weight"],
                                               quantize=False)
        for name, key, heads in (("attn_q", "q_proj", HQ), ("attn_k", "k_proj", HKV)):
            interleaved = add(f"blk.{n}.{name}.weight", hf_to_interleaved(sd[p + f"self_attn.{key}.weight"], heads, D))
            decoded[p + f"self_attn.{key}.weight"] = _interleaved_to_hf(interleaved, heads)
        decoded[p + "self_attn.v_proj.weight"] = add(f"blk.{n}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        decoded[p + "self_attn.o_proj.weight"] = add(f"blk.{n}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        decoded[p + "mlp.gate.weight"] = add(f"blk.{n}.ffn_gate_inp.weight", sd[p + "mlp.gate.weight"], quantize=False)
        gate, up = sd[p + "mlp.experts.gate_up_proj"].chunk(2, dim=1)  # [E, I, H] each
        down = sd[p + "mlp.experts.down_proj"]                           # [E, H, I]
        parts = {}
        for name, t in (("gate", gate), ("up", up), ("down", down)):
            if merged:
                parts[name] = add(f"blk.{n}.ffn_{name}_exps.weight", t.contiguous())
            else:
                parts[name] = torch.stack([add(f"blk.{n}.ffn_{name}.{e}.weight", t[e].contiguous())
                                           for e in range(experts)])
        decoded[p + "mlp.experts.gate_up_proj"] = torch.cat([parts["gate"], parts["up"]], dim=1)
        decoded[p + "mlp.experts.down_proj"] = parts["down"]
    _close(w)
    hf.load_state_dict({k: v.float() for k, v in decoded.items()})

    ours = load_model(tmp_path / "moe.gguf", progress=False, activations="exact")  # fp32 parity
    assert ours.config.is_moe and ours.config.num_experts == experts and ours.config.top_k == 2
    ids = torch.randint(0, V, (24,), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(ours.logits(ids), logits_transformers(hf, ids), atol=1e-3, rtol=0)
    assert greedy_ours(ours, ids, 8) == greedy_transformers(hf, ids, 8)


def _interleaved_to_hf(w: torch.Tensor, heads: int) -> torch.Tensor:
    """docs/design.md §6: consolidated / GGUF (interleaved) q/k rows → HF (neox) rows."""
    return w.view(heads, D // 2, 2, w.shape[1]).transpose(1, 2).reshape(heads * D, w.shape[1])


# ------------------------------------------------------------------------------------------ errors
def test_unsupported_architecture(tmp_path: Path) -> None:
    w = _writer(tmp_path / "qwen.gguf", arch="qwen2")
    w.add_tensor("token_embd.weight", np.zeros((V, H), np.float32))
    _close(w)
    with pytest.raises(UnsupportedCheckpointError, match="general.architecture='qwen2'"):
        load_model(tmp_path / "qwen.gguf", progress=False)


def test_missing_gguf_tensor_is_reported(tmp_path: Path) -> None:
    w = _writer(tmp_path / "broken.gguf")
    w.add_tensor("token_embd.weight", np.zeros((V, H), np.float32))
    w.add_tensor("blk.0.attn_qq.weight", np.zeros((4, H), np.float32))
    _close(w)
    with pytest.raises(CheckpointError) as info:
        load_model(tmp_path / "broken.gguf", progress=False)
    assert "layers.0.wq" in str(info.value) and "blk.0.attn_qq.weight" in str(info.value)
