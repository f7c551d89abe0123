"""Decoders vs transformers on tiny random checkpoints (HF and consolidated), incremental decode, sizes.

Reference: transformers' MistralForCausalLM / MixtralForCausalLM (eager attention) on the very
checkpoint we load. Tolerances (docs/design.md §5): |Δlogit| ≤ 1e-3 vs transformers in fp32, equal greedy
tokens; incremental decode vs full prefill ≤ 1e-4.
Shape letters: T tokens, V vocab, L layers, Hq heads, D head_dim, W sliding window.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import mistral_kernels
from mistral_kernels import load_model
from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.model import Model
from mistral_kernels.checkpoint import CheckpointError, expected_shapes, load_checkpoint, load_config
from mistral_kernels.checkpoint.consolidated import config_from_params
from mistral_kernels.checkpoint.hf import config_from_json

from .helpers.model_helpers import greedy_ours, greedy_transformers, logits_transformers, save_consolidated

from .helpers.model_parity import COMMON, SEQ, VOCAB, WINDOW

transformers = pytest.importorskip("transformers")


def _hf_config(kind: str, **extra: object) -> transformers.PretrainedConfig:
    if kind == "mistral":
        return transformers.MistralConfig(sliding_window=WINDOW, **COMMON, **extra)
    if kind == "llama":  # Llama-family with a tied LM head (like SmolLM2)
        return transformers.LlamaConfig(tie_word_embeddings=True, rope_theta=1e5, **COMMON, **extra)
    return transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6, **COMMON, **extra)


MODEL_CLASSES = {"mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM", "llama": "LlamaForCausalLM"}


@pytest.fixture(scope="module", params=list(MODEL_CLASSES))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(kind, HF dir, consolidated dir, transformers model) for a random tiny model saved with save_pretrained."""
    kind = request.param
    torch.manual_seed(0)
    hf = getattr(transformers, MODEL_CLASSES[kind])(_hf_config(kind)).eval()
    root = tmp_path_factory.mktemp(kind)
    hf.save_pretrained(root / "hf")
    save_consolidated(root / "hf", root / "consolidated")
    return kind, root / "hf", root / "consolidated", hf


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("layout", ["hf", "consolidated"])
def test_logits_and_greedy_match_transformers(checkpoint, prompt: torch.Tensor, layout: str) -> None:
    kind, hf_dir, consolidated_dir, hf = checkpoint
    ours = load_model(hf_dir if layout == "hf" else consolidated_dir, progress=False)
    assert ours.config.rope_is_neox == (layout == "hf")
    assert ours.config.sliding_window == (WINDOW if kind == "mistral" else None)
    assert ours.config.is_moe == (kind == "mixtral")
    assert ours.config.tie_embeddings == (kind == "llama")
    expected = logits_transformers(hf, prompt)
    got = ours.logits(prompt)
    assert got.dtype == torch.float32 and got.shape == (SEQ, VOCAB)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)
    assert greedy_ours(ours, prompt, 32) == greedy_transformers(hf, prompt, 32)


def test_sharded_checkpoint(checkpoint, prompt: torch.Tensor, tmp_path: Path) -> None:
    """save_pretrained with small shards writes model.safetensors.index.json + several files."""
    _, _, _, hf = checkpoint
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 2
    torch.testing.assert_close(load_model(tmp_path, progress=False).logits(prompt), logits_transformers(hf, prompt),
                               atol=1e-3, rtol=0)


def test_in_memory_naming_checkpoint(checkpoint, prompt: torch.Tensor, tmp_path: Path) -> None:
    """transformers 5 keeps Mixtral experts fused in memory (mlp.experts.gate_up_proj [E, 2I, H], down_proj);
    a checkpoint written straight from that state dict loads too (tied models: with a copy of the head)."""
    kind, hf_dir, _, hf = checkpoint
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    if kind == "mixtral":
        assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    torch.testing.assert_close(load_model(tmp_path, progress=False).logits(prompt), logits_transformers(hf, prompt),
                               atol=1e-3, rtol=0)


def test_sliding_window_is_exercised(prompt: torch.Tensor) -> None:
    """With W=16 and 40 tokens, the windowed reference differs from full causal attention past the window,
    so the parity tests above do check the window."""
    torch.manual_seed(0)
    windowed = transformers.MistralForCausalLM(_hf_config("mistral")).eval()
    causal = transformers.MistralForCausalLM(transformers.MistralConfig(**{**COMMON, "sliding_window": None})).eval()
    causal.load_state_dict(windowed.state_dict())
    a, b = logits_transformers(windowed, prompt), logits_transformers(causal, prompt)
    torch.testing.assert_close(a[:WINDOW], b[:WINDOW], atol=1e-5, rtol=0)
    assert (a[WINDOW:] - b[WINDOW:]).abs().max() > 1e-2


@pytest.mark.parametrize("prefix", [1, 7, 20])
def test_incremental_decode_matches_prefill(checkpoint, prompt: torch.Tensor, prefix: int) -> None:
    """Prefill `prefix` tokens, then one token at a time (beyond W=16 too): logits equal full prefill."""
    _, hf_dir, _, _ = checkpoint
    ours = load_model(hf_dir, progress=False)
    full = ours.logits(prompt)
    block_size = 4
    table = [9, 2, 7, 0, 5, 1, 8, 3, 6, 4]  # 10 blocks × 4 = 40 slots, scattered physical order
    cache = ours.new_cache(12, block_size)
    steps = [ours.forward(prompt[:prefix], AttentionBatch.build([table], [0], [prefix], block_size), cache)]
    for p in range(prefix, SEQ):
        batch = AttentionBatch.build([table], [p], [1], block_size)
        assert batch.decode_only
        steps.append(ours.forward(prompt[p:p + 1], batch, cache))
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-4, rtol=0)


def test_batched_chunked_prefill_and_decode(checkpoint, prompt: torch.Tensor) -> None:
    """Two sequences in one batch: a chunk after a cached prefix + a fresh prefill, then a joint decode step."""
    _, hf_dir, _, _ = checkpoint
    ours = load_model(hf_dir, progress=False)
    a, b = prompt[:30], prompt[10:35]
    full_a, full_b = ours.logits(a), ours.logits(b)
    bs = 8
    table_a, table_b = [3, 0, 6, 1], [5, 2, 7, 4]
    cache = ours.new_cache(8, bs)
    ours.forward(a[:12], AttentionBatch.build([table_a], [0], [12], bs), cache)  # cached prefix of a
    step = AttentionBatch.build([table_a, table_b], [12, 0], [17, 24], bs, logits_sequences=[0, 1])
    last = ours.forward(torch.cat([a[12:29], b[:24]]), step, cache)  # [2, V]: a's row 28, b's row 23
    torch.testing.assert_close(last, torch.stack([full_a[28], full_b[23]]), atol=1e-4, rtol=0)
    step = AttentionBatch.build([table_a, table_b], [29, 24], [1, 1], bs)
    last = ours.forward(torch.stack([a[29], b[24]]), step, cache)
    torch.testing.assert_close(last, torch.stack([full_a[29], full_b[24]]), atol=1e-4, rtol=0)


def test_bf16_close_to_fp32(checkpoint, prompt: torch.Tensor) -> None:
    _, hf_dir, _, _ = checkpoint
    fp32 = load_model(hf_dir, progress=False).logits(prompt)
    bf16 = load_model(hf_dir, dtype=torch.bfloat16, progress=False).logits(prompt)
    assert bf16.dtype == torch.float32
    scale = fp32.abs().max()
    assert (bf16 - fp32).abs().max() < 0.05 * scale


def test_config_sources_agree(checkpoint) -> None:
    """config.json and params.json of the same model give the same config up to the RoPE layout;
    load_config picks each by format and gives the config load_checkpoint uses."""
    _, hf_dir, consolidated_dir, hf = checkpoint
    from_hf = config_from_json(json.loads((hf_dir / "config.json").read_text()))
    from_params = config_from_params(json.loads((consolidated_dir / "params.json").read_text()))
    assert from_hf.replace(rope_is_neox=False, bos_token_id=None, eos_token_ids=()) == from_params
    assert from_hf.num_parameters() == hf.num_parameters()
    assert load_config(hf_dir) == from_hf and load_config(consolidated_dir) == from_params
    assert load_checkpoint(consolidated_dir, progress=False)[0] == from_params


def test_kv_bytes_per_token() -> None:
    """2 (k and v) · L · Hkv · D · element size."""
    assert ModelConfig.mistral_7b_v01().kv_bytes_per_token(torch.bfloat16) == 2 * 32 * 8 * 128 * 2 == 131072
    assert ModelConfig.tiny_mistral().kv_bytes_per_token(torch.float32) == 2 * 2 * 2 * 16 * 4


# ------------------------------------------------------------------------------------------ emulated CUDA kernels
@pytest.mark.parametrize("kind", ["mistral", "mixtral"])
def test_emulated_cuda_kernels_end_to_end(kind: str, tmp_path: Path) -> None:
    """The whole decoder on the CUDA kernels run by the SIMT emulator (D=64, a CUDA head size; W=8 < 20
    tokens): prefill logits vs transformers, then decode steps through the emulated decode kernel."""
    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    import mistral_kernels.emulated as emulated

    torch.manual_seed(0)
    small = {**COMMON, "hidden_size": 128, "head_dim": 64, "intermediate_size": 64, "num_attention_heads": 2,
             "num_key_value_heads": 1}
    if kind == "mistral":
        hf = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=8, **small)).eval()
    else:
        hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                                        **small)).eval()
    hf.save_pretrained(tmp_path)
    config, weights = load_checkpoint(tmp_path, progress=False)
    model = Model(config, weights, kernels=emulated)
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(2))
    expected = logits_transformers(hf, ids)
    prefix, block_size = 14, 8
    cache = model.new_cache(4, block_size)
    table = [3, 1, 2]
    steps = [model.forward(ids[:prefix], AttentionBatch.build([table], [0], [prefix], block_size), cache)]
    for p in range(prefix, ids.shape[0]):
        steps.append(model.forward(ids[p:p + 1], AttentionBatch.build([table], [p], [1], block_size), cache))
    torch.testing.assert_close(torch.cat(steps), expected, atol=1e-3, rtol=0)


# ------------------------------------------------------------------------------------------ errors
def test_checkpoint_errors_list_every_problem(checkpoint, tmp_path: Path) -> None:
    kind, hf_dir, _, _ = checkpoint
    tensors = load_file(str(hf_dir / "model.safetensors"))
    del tensors["model.layers.1.self_attn.q_proj.weight"]
    del tensors["model.norm.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:8]
    tensors["model.layers.0.self_attn.q_bias"] = torch.zeros(4)
    needles = ["missing", "layers.1.wq", "norm", "unexpected", "model.layers.0.self_attn.q_bias", "mis-shaped",
               "model.layers.0.self_attn.k_proj.weight", "[8, 64], expected [32, 64]"]
    if kind == "mixtral":  # a missing last expert: the stacked tensor has 3 of 4 experts
        del tensors["model.layers.1.block_sparse_moe.experts.3.w1.weight"]
        needles += ["layers.1.experts.w1", "[3, 96, 64], expected [4, 96, 64]"]
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, str(bad / "model.safetensors"))
    (bad / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(CheckpointError) as info:
        load_model(bad, progress=False)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)


def test_format_detection_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.gguf").write_bytes(b"NOTGGUF")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_checkpoint(tmp_path / "model.gguf")


def test_unsupported_hf_configs_raise() -> None:
    base = json.loads(transformers.MistralConfig(**COMMON).to_json_string())
    with pytest.raises(ValueError, match="model_type='qwen2'"):
        config_from_json({**base, "model_type": "qwen2"})
    with pytest.raises(ValueError, match="attention_bias"):
        config_from_json({**base, "model_type": "llama", "attention_bias": True})
    with pytest.raises(ValueError, match="RoPE scaling"):
        config_from_json({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}})


def test_presets_equal_the_published_configs() -> None:
    """Mistral-7B-v0.1's HF config.json and Mixtral-8x7B's params.json (as published) give the presets."""
    mistral_hf = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
                  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
                  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                  "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000}
    assert config_from_json(mistral_hf) == ModelConfig.mistral_7b_v01().replace(rope_is_neox=True)
    mixtral_params = {"dim": 4096, "n_layers": 32, "head_dim": 128, "hidden_dim": 14336, "n_heads": 32,
                      "n_kv_heads": 8, "norm_eps": 1e-05, "vocab_size": 32000,
                      "moe": {"num_experts_per_tok": 2, "num_experts": 8}}
    assert config_from_params(mixtral_params) == ModelConfig.mixtral_8x7b().replace(
        bos_token_id=None, eos_token_ids=())


# ------------------------------------------------------------------------------------------ sizes
def test_mixtral_8x7b_parameter_counts() -> None:
    config = ModelConfig.mixtral_8x7b()
    total, active = config.num_parameters(), config.num_parameters(active_only=True)
    assert round(total / 1e9, 1) == 46.7
    assert round(active / 1e9, 1) == 12.9
    assert total == sum(torch.Size(s).numel() for s in expected_shapes(config).values())
    assert round(ModelConfig.mistral_7b_v01().num_parameters() / 1e9, 2) == 7.24


@pytest.mark.parametrize("config", [ModelConfig.mixtral_8x7b(), ModelConfig.mistral_7b_v01(),
                                    ModelConfig.tiny_mistral().replace(tie_embeddings=True)])
def test_flops_per_token(config: ModelConfig) -> None:
    """2 FLOPs per active matmul weight + 4·L·C·Hq·D for attention over C = min(seq_len, W) keys."""
    shapes = expected_shapes(config)
    per_expert = config.top_k / config.num_experts if config.is_moe else 1.0
    matmul = 0.0
    for name, shape in shapes.items():
        if name.endswith(("norm", "embed")):
            continue
        matmul += torch.Size(shape).numel() * (per_expert if ".experts." in name else 1.0)
    if config.tie_embeddings:
        matmul += torch.Size(shapes["embed"]).numel()  # the tied LM head
    for seq_len in (1, 100, 5000):
        keys = min(seq_len, config.sliding_window or seq_len)
        attention = 4 * config.n_layers * keys * config.n_heads * config.head_dim
        assert config.flops_per_token(seq_len) == pytest.approx(2 * matmul + attention, rel=1e-12)
