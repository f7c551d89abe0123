"""Helpers shared by the model tests: greedy decoding through the paged cache, transformers references,
HF → Mistral consolidated conversion.

Shape letters: T tokens, V vocab, H hidden, D head_dim.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.model import Model


def greedy_ours(model: Model, prompt: torch.Tensor, n: int, block_size: int = 8) -> list[int]:
    """Prefill ``prompt`` then decode ``n`` tokens one at a time through the paged cache (argmax)."""
    total = prompt.shape[0] + n
    num_blocks = (total + block_size - 1) // block_size
    table = list(range(num_blocks))[::-1]  # blocks in reverse physical order: the block table matters
    cache = model.new_cache(num_blocks, block_size)
    batch = AttentionBatch.build([table], [0], [prompt.shape[0]], block_size, logits_sequences=[0])
    logits = model.forward(prompt, batch, cache)  # [1, V]
    tokens: list[int] = []
    for i in range(n):
        token = logits[-1].argmax()
        tokens.append(int(token))
        if i + 1 < n:
            batch = AttentionBatch.build([table], [prompt.shape[0] + i], [1], block_size)
            logits = model.forward(token.view(1), batch, cache)
    return tokens


@torch.no_grad()
def greedy_transformers(hf_model: torch.nn.Module, prompt: torch.Tensor, n: int) -> list[int]:
    """Greedy continuation by transformers with its own KV cache, never stopping at EOS."""
    out = hf_model(prompt[None], use_cache=True)
    tokens: list[int] = []
    for i in range(n):
        token = out.logits[0, -1].argmax()
        tokens.append(int(token))
        if i + 1 < n:
            out = hf_model(token.view(1, 1), past_key_values=out.past_key_values, use_cache=True)
    return tokens


@torch.no_grad()
def logits_transformers(hf_model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits [T, V] of one sequence."""
    return hf_model(ids[None], use_cache=False).logits[0].float()


def hf_to_interleaved(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Inverse of docs/design.md §6: HF (neox) q/k rows → consolidated (interleaved) rows."""
    dim = w.shape[1]
    return w.view(n_heads, 2, head_dim // 2, dim).transpose(1, 2).reshape(n_heads * head_dim, dim)


def save_consolidated(hf_dir: Path, out_dir: Path) -> None:
    """Convert a saved HF Mistral / Mixtral checkpoint into a Mistral consolidated directory."""
    from safetensors import safe_open

    cfg = json.loads((hf_dir / "config.json").read_text())
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // hq
    renames = {
        "model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight",
    }
    parts = {
        "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
        "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
        "mlp.down_proj": "feed_forward.w2", "block_sparse_moe.gate": "feed_forward.gate",
    }
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            w = f.get_tensor(name)
            if name in renames:
                out[renames[name]] = w
                continue
            _, _, layer, rest = name.split(".", 3)  # model.layers.N.<rest>
            rest = rest.removesuffix(".weight")
            if rest.startswith("block_sparse_moe.experts."):
                new = rest.replace("block_sparse_moe.experts.", "feed_forward.experts.")
            else:
                new = parts[rest]
            if rest == "self_attn.q_proj":
                w = hf_to_interleaved(w, hq, hd)
            elif rest == "self_attn.k_proj":
                w = hf_to_interleaved(w, hkv, hd)
            out[f"layers.{layer}.{new}.weight"] = w.contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "consolidated.safetensors"))
    params = {
        "dim": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"], "head_dim": hd,
        "hidden_dim": cfg["intermediate_size"], "n_heads": hq, "n_kv_heads": hkv, "norm_eps": cfg["rms_norm_eps"],
        "vocab_size": cfg["vocab_size"], "rope_theta": (cfg.get("rope_parameters") or cfg)["rope_theta"],
        "max_seq_len": cfg["max_position_embeddings"],
    }
    if cfg.get("sliding_window"):
        params["sliding_window"] = cfg["sliding_window"]
    if cfg.get("tie_word_embeddings"):
        params["tied_embeddings"] = True
    if cfg["model_type"] == "mixtral":
        params["moe"] = {"num_experts": cfg["num_local_experts"], "num_experts_per_tok": cfg["num_experts_per_tok"]}
    (out_dir / "params.json").write_text(json.dumps(params))


def random_model(config: ModelConfig, *, device: str = "cpu", kernels: object = None, seed: int = 0,
                 dtype: torch.dtype = torch.float32, **model_args: object) -> Model:
    """A :class:`Model` with random fused weights (names and shapes of mistral_kernels.checkpoint.fusion), fp32 unless
    ``dtype``; ``model_args`` go to :class:`Model`."""
    from mistral_kernels import ops

    g = torch.Generator().manual_seed(seed)
    c = config

    def rnd(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    w: dict[str, torch.Tensor] = {"embed": rnd(c.vocab_size, c.dim, scale=1.0), "norm": 1 + rnd(c.dim),
                                  "lm_head": rnd(c.vocab_size, c.dim)}
    qkv_rows = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
    for n in range(c.n_layers):
        p = f"layers.{n}."
        w |= {p + "attn_norm": 1 + rnd(c.dim), p + "ffn_norm": 1 + rnd(c.dim), p + "qkv": rnd(qkv_rows, c.dim),
              p + "wo": rnd(c.dim, c.n_heads * c.head_dim)}
        if c.is_moe:
            w |= {p + "gate": rnd(c.num_experts, c.dim), p + "w1": rnd(c.num_experts, c.hidden_dim, c.dim),
                  p + "w3": rnd(c.num_experts, c.hidden_dim, c.dim), p + "w2": rnd(c.num_experts, c.dim, c.hidden_dim)}
        else:
            w |= {p + "w13": rnd(2 * c.hidden_dim, c.dim), p + "w2": rnd(c.dim, c.hidden_dim)}
    return Model(c, w, kernels if kernels is not None else ops, **model_args)


def prefilled_caches(model: Model, tables: list[list[int]], lengths: list[int], block_size: int, num_blocks: int,
                     g: torch.Generator, copies: int = 2) -> list:
    """``copies`` KV caches of ``model`` holding the same prefill of random prompts of ``lengths`` tokens
    (drawn from ``g``) over block tables ``tables``; every slot the prefill does not write is NaN, so a kernel
    that reads an unwritten slot poisons its output."""
    caches = [model.new_cache(num_blocks, block_size) for _ in range(copies)]
    for cache in caches:
        for t in cache.k + cache.v:
            t.fill_(float("nan"))
    prompt = torch.randint(0, model.config.vocab_size, (sum(lengths),), generator=g)
    batch = AttentionBatch.build(tables, [0] * len(lengths), lengths, block_size)
    for cache in caches:
        model.forward(prompt, batch, cache)  # prefill: per-op layers
    return caches


def fused_and_per_op_step(model: Model, tokens: torch.Tensor, tables: list[list[int]], lens: list[int],
                          rows: list[int], block_size: int, caches: list) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of the sequences ``rows`` (tokens[rows], contexts ``lens``) through the model's fused CPU
    decode step on caches[0] and through its per-op layers on caches[1]: (fused logits, per-op logits). The
    model keeps its fused step afterwards."""
    fused = model.cpu_decode
    batch = AttentionBatch.build([tables[b] for b in rows], [lens[b] for b in rows], [1] * len(rows), block_size)
    assert batch.decode_only and fused.accepts(tokens[rows], batch)
    got = model.forward(tokens[rows], batch, caches[0])
    model.cpu_decode = None
    try:
        want = model.forward(tokens[rows], batch, caches[1])
    finally:
        model.cpu_decode = fused
    return got, want
