"""Model-family features vs transformers: RoPE scaling, explicit head_dim, no / per-layer windows, presets.

Each case is a tiny random checkpoint (2 layers, hidden 64) with one real model's distinguishing config
features, saved by transformers' ``save_pretrained`` (Mistral models also converted to the consolidated
format). Checks (docs/design.md §5): |Δlogit| ≤ 1e-3 vs transformers (fp32, eager) over a prompt longer
than the smallest window, 32 equal greedy tokens, incremental decode through the paged cache ≤ 1e-4 from
full prefill. Shape letters: T tokens, V vocab.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mistral_kernels import load_model
from mistral_kernels.batch import AttentionBatch
from mistral_kernels.checkpoint import UnsupportedCheckpointError, load_config
from mistral_kernels.checkpoint.hf import config_from_json
from mistral_kernels.config import ModelConfig
from mistral_kernels.model import Model

from .helpers.model_helpers import greedy_ours, greedy_transformers, logits_transformers, save_consolidated

transformers = pytest.importorskip("transformers")

SEQ, WINDOW, NEW = 40, 16, 32
COMMON: dict[str, Any] = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
                              rms_norm_eps=1e-5, attn_implementation="eager")
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 5e5}

# name → (transformers class, config class, config kwargs, also test the consolidated format)
CASES: dict[str, tuple[str, str, dict[str, Any], bool]] = {
    # Llama 3.1 / 3.2 / 3.3: llama3 frequency scaling (the original context is shrunk so all three bands occur)
    "llama3": ("LlamaForCausalLM", "LlamaConfig", dict(vocab_size=512, head_dim=16, rope_parameters=LLAMA3), False),
    "linear": ("LlamaForCausalLM", "LlamaConfig",
               dict(vocab_size=128, head_dim=16, rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                   "rope_theta": 1e4}), False),
    "yarn": ("LlamaForCausalLM", "LlamaConfig",
             dict(vocab_size=128, head_dim=16, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                                 "original_max_position_embeddings": 64}), False),
    "dynamic": ("LlamaForCausalLM", "LlamaConfig",
                dict(vocab_size=128, head_dim=16, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                    "rope_theta": 1e4}), False),
    # Mistral Nemo / Small 3.x: head_dim 32 ≠ 64 / 4, no window, θ 1e6 (Small: 1e8), large vocab (rounded down)
    "nemo": ("MistralForCausalLM", "MistralConfig",
             dict(vocab_size=1024, head_dim=32, sliding_window=None, rope_theta=1e6), True),
    "small3": ("MistralForCausalLM", "MistralConfig",
               dict(vocab_size=1024, head_dim=32, sliding_window=None, rope_theta=1e8), True),
    # Ministral 8B: interleaved windows (sliding, full), head_dim given, θ 1e8
    "ministral": ("MinistralForCausalLM", "MinistralConfig",
                  dict(vocab_size=1024, head_dim=32, sliding_window=WINDOW, rope_theta=1e8,
                       layer_types=["sliding_attention", "full_attention"]), True),
    # Mixtral 8x22B: 8 experts top-2, 6:1 GQA (48 / 8), vocab 32768 (rounded down), no window
    "mixtral8x22b": ("MixtralForCausalLM", "MixtralConfig",
                     dict(vocab_size=256, head_dim=16, num_attention_heads=6, num_key_value_heads=1, hidden_size=96,
                          num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6, sliding_window=None), True),
    # Mistral 7B v0.2 / v0.3: sliding_window null, θ 1e6
    "mistral_v03": ("MistralForCausalLM", "MistralConfig",
                    dict(vocab_size=768, head_dim=16, sliding_window=None, rope_theta=1e6), True),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return _build(request.param, tmp_path_factory.mktemp(request.param))


def _build(name: str, root: Path) -> tuple[str, list[Path], Any, torch.Tensor]:
    """(name, checkpoint dirs [HF, consolidated?], transformers model, prompt) of one case."""
    model_cls, config_cls, kwargs, consolidated = CASES[name]
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**COMMON, **kwargs})).eval()
    hf.save_pretrained(root / "hf")
    dirs = [root / "hf"]
    if consolidated:
        save_consolidated(root / "hf", root / "consolidated")
        if name == "ministral":  # the interleaved pattern in params.json spelling: one window per layer, repeated
            params = json.loads((root / "consolidated" / "params.json").read_text())
            params["sliding_window"] = [WINDOW, None]
            (root / "consolidated" / "params.json").write_text(json.dumps(params))
        dirs.append(root / "consolidated")
    prompt = torch.randint(0, kwargs["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(1))
    return name, dirs, hf, prompt


def _incremental_logits(model: Model, prompt: torch.Tensor, block_size: int = 8) -> torch.Tensor:
    """fp32 [T, V]: prefill the first 3 tokens, then decode one token at a time through the paged cache."""
    t = prompt.shape[0]
    num_blocks = (t + block_size - 1) // block_size
    table = list(range(num_blocks))[::-1]
    cache = model.new_cache(num_blocks, block_size)
    rows = [model.forward(prompt[:3], AttentionBatch.build([table], [0], [3], block_size), cache)]
    for p in range(3, t):
        rows.append(model.forward(prompt[p:p + 1], AttentionBatch.build([table], [p], [1], block_size), cache))
    return torch.cat(rows)


def test_matches_transformers(case) -> None:
    name, dirs, hf, prompt = case
    want = logits_transformers(hf, prompt)
    want_tokens = greedy_transformers(hf, prompt, NEW)
    for path in dirs:
        model = load_model(path, progress=False)
        got = model.logits(prompt)
        err = (got - want).abs().max().item()
        assert err <= 1e-3, f"{name} ({path.name}): max |Δlogit| {err:.2e} > 1e-3"
        assert greedy_ours(model, prompt, NEW) == want_tokens, f"{name} ({path.name}): greedy tokens differ"
        step = (_incremental_logits(model, prompt) - got).abs().max().item()
        assert step <= 1e-4, f"{name} ({path.name}): incremental vs prefill {step:.2e} > 1e-4"


def test_case_configs_carry_the_features(case) -> None:
    """The loaded configs state what makes each case distinct (a case that lost its feature would pass trivially)."""
    name, dirs, _, _ = case
    configs = [load_config(p) for p in dirs]
    c = configs[0]
    if name in ("llama3", "linear", "yarn", "dynamic"):
        assert c.rope_scaling is not None and c.rope_scaling.kind == name
    if name == "yarn":
        assert c.rope_scaling.attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    if name in ("nemo", "small3", "ministral"):
        assert all(x.head_dim == 32 != x.dim // x.n_heads for x in configs)
    if name == "ministral":
        assert all(x.layer_windows == (WINDOW, None) and x.sliding_window is None for x in configs)
    if name in ("nemo", "small3", "mistral_v03", "mixtral8x22b"):
        assert all(x.sliding_window is None and x.layer_windows is None for x in configs)


def test_transformers_v4_and_v5_rope_spellings_agree() -> None:
    v4 = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 256, "rope_theta": 5e5,
          "rope_scaling": {k: v for k, v in LLAMA3.items() if k != "rope_theta"}}
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_scaling")} | {"rope_parameters": LLAMA3}
    a, b = config_from_json(v4), config_from_json(v5)
    assert a == b and a.rope_theta == 5e5 and a.rope_scaling.factor == 8.0
    old_key = dict(v4, rope_scaling={"type": "linear", "factor": 2.0})  # transformers < 4.45 wrote "type"
    assert config_from_json(old_key).rope_scaling.kind == "linear"


def test_unsupported_rope_and_layer_types_are_named() -> None:
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 96, "vocab_size": 128}
    with pytest.raises(UnsupportedCheckpointError, match="longrope"):
        config_from_json(base | {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}})
    with pytest.raises(UnsupportedCheckpointError, match="chunked_attention"):
        config_from_json(base | {"model_type": "mistral", "sliding_window": 8,
                                           "layer_types": ["sliding_attention", "chunked_attention"]})


def test_layer_windows_must_agree_with_sliding_window() -> None:
    c = ModelConfig.tiny_mistral()
    with pytest.raises(ValueError, match="with_layer_windows"):
        c.replace(layer_windows=(16, None))  # sliding_window=16 would let the cache free blocks layer 1 reads
    assert c.with_layer_windows([16, None]).sliding_window is None
    assert c.with_layer_windows([8, 16]).sliding_window == 16
    assert c.with_layer_windows([8, 8]).layer_windows is None


def test_flops_count_each_layers_window() -> None:
    c = ModelConfig.tiny_mistral().with_layer_windows([16, None])
    per_context = 4 * c.n_heads * c.head_dim
    assert c.flops_per_token(100) - c.flops_per_token(1) == per_context * ((16 - 1) + (100 - 1))


# name → (preset, published total parameters, relative tolerance, published active parameters or None)
PUBLISHED = {
    "mistral_7b_v03": (ModelConfig.mistral_7b_v03, 7.25e9, 0.005, None),
    "mistral_nemo_12b": (ModelConfig.mistral_nemo_12b, 12.2e9, 0.01, None),
    "mistral_small_24b": (ModelConfig.mistral_small_24b, 23.6e9, 0.005, None),
    "ministral_8b": (ModelConfig.ministral_8b, 8.0e9, 0.01, None),
    "mixtral_8x22b": (ModelConfig.mixtral_8x22b, 140.6e9, 0.002, 39e9),
    "llama_31_8b": (ModelConfig.llama_31_8b, 8.03e9, 0.002, None),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_parameter_counts(name: str) -> None:
    preset, total, rel, active = PUBLISHED[name]
    c = preset()
    assert c.num_parameters() == pytest.approx(total, rel=rel)
    if active is not None:
        assert c.num_parameters(active_only=True) == pytest.approx(active, rel=0.01)


def test_preset_features() -> None:
    assert ModelConfig.mistral_nemo_12b().head_dim * ModelConfig.mistral_nemo_12b().n_heads == 4096 != 5120
    assert ModelConfig.mistral_7b_v03().sliding_window is None and ModelConfig.mistral_7b_v03().vocab_size == 32768
    m = ModelConfig.ministral_8b()
    assert m.window_of(0) == 32768 and m.window_of(3) is None and m.sliding_window is None
    assert ModelConfig.llama_31_8b().rope_scaling.kind == "llama3"


def test_pixtral_style_consolidated_loads_the_text_decoder(tmp_path: Path) -> None:
    """A consolidated checkpoint with a vision encoder (Pixtral / Mistral Small 3.x) loads its text decoder."""
    from safetensors.torch import load_file, save_file

    _, dirs, hf, prompt = _build("small3", tmp_path / "small3")
    src = dirs[1]
    tensors = load_file(str(src / "consolidated.safetensors"))
    tensors |= {"vision_encoder.transformer.layers.0.attention.wq.weight": torch.zeros(8, 8),
                "vision_language_adapter.w_in.weight": torch.zeros(8, 8),
                "patch_merger.merging_layer.weight": torch.zeros(8, 8), "pre_mm_projector_norm.weight": torch.zeros(8)}
    out = tmp_path / "pixtral_style"
    out.mkdir()
    save_file(tensors, str(out / "consolidated.safetensors"))
    params = json.loads((src / "params.json").read_text()) | {"vision_encoder": {"hidden_size": 8, "num_channels": 3}}
    (out / "params.json").write_text(json.dumps(params))
    got = load_model(out, progress=False).logits(prompt)
    assert (got - logits_transformers(hf, prompt)).abs().max().item() <= 1e-3


def test_rope_table_without_scaling_is_the_plain_table_across_chunks() -> None:
    from mistral_kernels.ops import rope_cos_sin_cache
    from mistral_kernels.rope_scaling import rope_table

    assert torch.equal(rope_table(70_000, 8, 1e6, None), rope_cos_sin_cache(70_000, 8, 1e6))  # 2 chunks


def test_llama3_gguf_with_rope_freqs_matches_transformers(tmp_path: Path) -> None:
    """A Llama 3.1 GGUF as llama.cpp writes it: interleaved q/k and a ``rope_freqs.weight`` tensor of
    per-pair divisors (llama.cpp's converter formula, restated here) — vs transformers on the HF model."""
    import math

    gguf = pytest.importorskip("gguf")
    from .helpers.model_helpers import hf_to_interleaved

    _, _, hf, prompt = _build("llama3", tmp_path / "llama3")
    c, rope = hf.config, LLAMA3
    d = c.head_dim
    divisors = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / d)
        old, low, high, factor = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                                  rope["high_freq_factor"], rope["factor"])
        if wavelen < old / high:
            divisors.append(1.0)
        elif wavelen > old / low:
            divisors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    w = gguf.GGUFWriter(str(tmp_path / "llama31.gguf"), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_key_length(d)
    w.add_rope_dimension_count(d)
    w.add_vocab_size(c.vocab_size)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.add_tensor("rope_freqs.weight", torch.tensor(divisors, dtype=torch.float32).numpy())
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for n in range(c.num_hidden_layers):
        for hf_name, g_name in names.items():
            t = hf.state_dict()[f"model.layers.{n}.{hf_name}.weight"].detach().float()
            if g_name in ("attn_q", "attn_k"):
                heads = c.num_attention_heads if g_name == "attn_q" else c.num_key_value_heads
                t = hf_to_interleaved(t, heads, d)
            w.add_tensor(f"blk.{n}.{g_name}.weight", t.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    config = load_config(tmp_path / "llama31.gguf")
    assert config.rope_scaling is not None and config.rope_scaling.kind == "freq_factors"
    assert len(set(config.rope_scaling.freq_factors)) > 2  # all three bands present
    got = load_model(tmp_path / "llama31.gguf", progress=False).logits(prompt)
    assert (got - logits_transformers(hf, prompt)).abs().max().item() <= 1e-3
