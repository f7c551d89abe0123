"""Pins the sliding-window semantic of paged prefill / decode attention against transformers' Mistral
(the arbiter): a 1-layer MistralModel with eager attention and sliding_window W smaller than the
sequence; its q/k/v (after RoPE) go through our paged ops and must reproduce the attention output
transformers feeds into o_proj — for every position, including those beyond W.

Shape letters: T tokens, Hq / Hkv heads, D head_dim, S block_size, W sliding window.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import Backend

transformers = pytest.importorskip("transformers")
from transformers.models.mistral import modeling_mistral  # noqa: E402

T, HQ, HKV, D, S, W = 19, 4, 2, 64, 8, 5


def _mistral_attention_io() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k, v [T, Hkv, D] after RoPE, and transformers' attention output [T, Hq, D]."""
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=1, num_attention_heads=HQ,
        num_key_value_heads=HKV, head_dim=D, sliding_window=W, max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    model = transformers.MistralModel(cfg).eval()
    attn = model.layers[0].self_attn
    captured: dict[str, torch.Tensor] = {}

    def grab_inputs(_m: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        captured["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        captured["cos"], captured["sin"] = kwargs["position_embeddings"]

    def grab_output(_m: torch.nn.Module, args: tuple) -> None:
        captured["attn_out"] = args[0]

    h1 = attn.register_forward_pre_hook(grab_inputs, with_kwargs=True)
    h2 = attn.o_proj.register_forward_pre_hook(grab_output)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 64, (1, T)))
        hs = captured["hidden"]
        q = attn.q_proj(hs).view(1, T, HQ, D).transpose(1, 2)
        k = attn.k_proj(hs).view(1, T, HKV, D).transpose(1, 2)
        v = attn.v_proj(hs).view(1, T, HKV, D).transpose(1, 2)
        q, k = modeling_mistral.apply_rotary_pos_emb(q, k, captured["cos"], captured["sin"])
    h1.remove()
    h2.remove()
    out = captured["attn_out"].view(T, HQ, D)
    return q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous(), out


def test_sliding_window_matches_transformers(backend_one_schedule: Backend) -> None:
    ops, dev = backend_one_schedule.ops, backend_one_schedule.device
    q, k, v, expect = _mistral_attention_io()
    n_blocks = (T + S - 1) // S + 2
    table = torch.tensor([[3, 0, 2]], dtype=torch.int32)  # non-contiguous physical blocks
    kc = torch.full((n_blocks, S, HKV, D), float("nan"))
    vc = torch.full_like(kc, float("nan"))
    j = torch.arange(T)
    slots = table[0].long()[j // S] * S + j % S
    kc, vc, table = kc.to(dev), vc.to(dev), table.to(dev)
    ops.reshape_and_cache(k.to(dev), v.to(dev), kc, vc, slots.to(dev))
    scale = D**-0.5
    # prefill of the whole sequence
    cu = torch.tensor([0, T], dtype=torch.int32, device=dev)
    lens = torch.tensor([T], dtype=torch.int32, device=dev)
    got = ops.paged_prefill_attention(q.to(dev), kc, vc, table, cu, lens, scale, W).cpu()
    torch.testing.assert_close(got, expect, atol=1e-4, rtol=1e-4)
    # decode: the query at position t (one sequence per t sharing the block table), incl. t >= W
    tables = table.expand(T, -1).contiguous()
    got_dec = ops.paged_decode_attention(q.to(dev), kc, vc, tables,
                                         torch.arange(1, T + 1, dtype=torch.int32, device=dev), scale, W).cpu()
    torch.testing.assert_close(got_dec, expect, atol=1e-4, rtol=1e-4)
    # the window is not vacuous: full causal attention differs beyond position W
    full = ops.paged_prefill_attention(q.to(dev), kc, vc, table, cu, lens, scale, None).cpu()
    assert not torch.allclose(full[W:], expect[W:], atol=1e-3)
    torch.testing.assert_close(full[:W], expect[:W], atol=1e-4, rtol=1e-4)
