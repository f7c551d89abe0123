"""Shard rules of tensor and expert parallelism: which part of every weight a rank holds.

Shape letters: H hidden, I intermediate (per expert for MoE), Hq / Hkv heads, D head_dim, E experts,
tp ranks (the world size), r a rank.

Megatron-style tensor parallelism, one all-reduce after the attention output projection and one after
the FFN (dense or MoE) of every layer; everything else (embedding, norms, router, LM head) is replicated,
so every rank ends a step with the same fp32 logits [N, V] and samples the same tokens (the engine also
broadcasts rank 0's sampled ids, see :meth:`~mistral_kernels.parallel.ParallelContext.broadcast_tokens`).
These are pure functions of a :class:`~mistral_kernels.config.ModelConfig`; the process group is in
:mod:`.context`, the rank's decoder layers in :mod:`.layers`.

===================  ====================  ===========================================================
canonical weight     split                 rank r holds
===================  ====================  ===========================================================
``wq`` [Hq·D, H]     column-parallel        q heads ``r·Hq/tp … (r+1)·Hq/tp - 1`` (their D rows each)
``wk, wv``           column-parallel        kv heads ``r·Hkv/tp …`` — or, when Hkv < tp, the one kv head
                                            ``r·Hkv // tp`` (replicated on tp/Hkv ranks)
``wo`` [H, Hq·D]     row-parallel           the columns of its q heads → partial sums, all-reduced
``w1, w3`` [I, H]    column-parallel        rows ``r·I/tp … (r+1)·I/tp - 1``
``w2`` [H, I]        row-parallel           the same columns → partial sums, all-reduced
experts (default)    expert-parallel        experts ``r·E/tp … (r+1)·E/tp - 1`` whole; tokens are routed
                                            with the full router, each rank computes only its experts'
                                            share of Σ_j w[t, j]·expert_{ids[t,j]}(x[t]), all-reduced
experts (option)     tensor-parallel        all E experts, I/tp rows of w1/w3 and columns of w2 each
===================  ====================  ===========================================================

Worked example (Hq = 4, Hkv = 1, D = 16, tp = 2): rank 0 holds wq rows 0‥31 (heads 0, 1), rank 1 rows
32‥63 (heads 2, 3); both hold wk / wv rows 0‥15 (kv head 0 = 0·1//2 = 1·1//2), and the paged KV cache of
each rank stores 1 kv head. With Hkv = 2 instead, rank 1 holds kv head 1 (wk rows 16‥31) — the kv head of
its q heads 2, 3 (group size Hq/Hkv = 2).

Worked example (Mixtral, E = 8, tp = 4, expert parallel): rank 2 holds experts 4, 5. A token routed to
experts (5, 0) with weights (0.7, 0.3) gets 0.7·expert_5(x) from rank 2 and 0.3·expert_0(x) from rank 0;
the all-reduce adds them (ranks 1 and 3 contribute zeros).
"""

from __future__ import annotations

from ..config import ModelConfig

__all__ = ["MOE_MODES", "check_shardable", "expert_range", "head_range", "kv_head_range", "local_config",
           "parameters_per_rank", "shard_index"]

MOE_MODES = ("expert", "tensor")


def _span(index: int, count: int, parts: int) -> range:
    """The ``index``-th of ``parts`` equal contiguous pieces of ``range(count)`` (count % parts == 0)."""
    size = count // parts
    return range(index * size, (index + 1) * size)


def check_shardable(config: ModelConfig, tp: int, moe: str = "expert") -> None:
    """Raise a ValueError naming the dimension when ``config`` cannot be split over ``tp`` ranks.

    Needs: Hq % tp == 0; Hkv % tp == 0, or tp % Hkv == 0 (kv heads replicated); for dense FFNs and
    tensor-parallel experts I % tp == 0; for expert parallelism E % tp == 0.
    """
    if tp < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
    if moe not in MOE_MODES:
        raise ValueError(f"moe parallel mode must be one of {MOE_MODES}, got {moe!r}")
    c = config
    if c.n_heads % tp:
        raise ValueError(f"tensor parallel size {tp} does not divide the {c.n_heads} attention heads "
                         f"(n_heads); use a tp that divides {c.n_heads}")
    if c.n_kv_heads % tp and tp % c.n_kv_heads:
        raise ValueError(f"tensor parallel size {tp} and the {c.n_kv_heads} kv heads (n_kv_heads): one must "
                         "divide the other (kv heads are split, or replicated when there are fewer than tp)")
    if c.is_moe and moe == "expert":
        if c.num_experts % tp:
            raise ValueError(f"expert parallel size {tp} does not divide the {c.num_experts} experts "
                             f"(num_experts); use a tp that divides {c.num_experts} or moe='tensor'")
    elif c.hidden_dim % tp:
        raise ValueError(f"tensor parallel size {tp} does not divide the intermediate size "
                         f"(hidden_dim={c.hidden_dim})")


def head_range(config: ModelConfig, rank: int, tp: int) -> range:
    """Query heads of ``rank``: ``r·Hq/tp … (r+1)·Hq/tp - 1``. Hq=32, tp=4, r=1 → heads 8‥15."""
    return _span(rank, config.n_heads, tp)


def kv_head_range(config: ModelConfig, rank: int, tp: int) -> range:
    """KV heads of ``rank``: its share of Hkv, or the single head ``r·Hkv // tp`` when Hkv < tp.

    Hkv=8, tp=4, r=1 → heads 2, 3.  Hkv=2, tp=8, r=5 → head 5·2//8 = 1 (ranks 4‥7 share head 1), which
    is the kv head of its q heads (Hq=32: heads 20‥23, group size 16 → 20//16 = 1).
    """
    if config.n_kv_heads >= tp:
        return _span(rank, config.n_kv_heads, tp)
    head = rank * config.n_kv_heads // tp
    return range(head, head + 1)


def expert_range(config: ModelConfig, rank: int, tp: int) -> range:
    """Experts owned by ``rank`` under expert parallelism: E=8, tp=4, r=2 → experts 4, 5."""
    return _span(rank, config.num_experts, tp)


def local_config(config: ModelConfig, rank: int, tp: int, moe: str = "expert") -> ModelConfig:
    """The per-rank shapes the decoder layers and the KV cache see: local Hq, Hkv and (unless experts are
    split whole) local I. ``num_experts`` stays E: the router scores all experts on every rank."""
    check_shardable(config, tp, moe)
    split_i = not config.is_moe or moe == "tensor"
    return config.replace(n_heads=config.n_heads // tp, n_kv_heads=len(kv_head_range(config, rank, tp)),
                          hidden_dim=config.hidden_dim // tp if split_i else config.hidden_dim)


def parameters_per_rank(config: ModelConfig, tp: int, moe: str = "expert") -> int:
    """Parameters one rank holds (the same on every rank): split attention / FFN / experts plus the
    replicated embedding, LM head, router and norms. tp = 1 gives :meth:`ModelConfig.num_parameters`.

    Mixtral-8x7B, tp = 2: experts 45.10B / 2 + attention 1.34B / 2 + replicated 0.26B = 23.48B.
    """
    c, lc = config, local_config(config, 0, tp, moe)
    h, d = c.dim, c.head_dim
    replicated = (2 * c.n_layers + 1) * h + (1 if c.tie_embeddings else 2) * c.vocab_size * h
    attention = h * (lc.n_heads + 2 * lc.n_kv_heads) * d + lc.n_heads * d * h
    if c.is_moe:
        replicated += c.n_layers * c.num_experts * h  # router
        experts = c.num_experts // tp if moe == "expert" else c.num_experts
        ffn = experts * 3 * h * lc.hidden_dim
    else:
        ffn = 3 * h * lc.hidden_dim
    return replicated + c.n_layers * (attention + ffn)


def _rows(r: range, width: int) -> slice:
    return slice(r.start * width, r.stop * width)


def shard_index(config: ModelConfig, name: str, rank: int, tp: int,
                moe: str = "expert") -> tuple[slice, ...] | None:
    """Which part of canonical tensor ``name`` (see checkpoint/naming.py) rank ``rank`` reads; None = all of it.

    Returns one slice per leading dim (trailing dims whole). Examples (Mistral-7B: Hq=32, Hkv=8, D=128,
    I=14336, tp=4, rank 1): ``layers.0.wq`` → (rows 1024‥2047,), ``layers.0.wk`` → (rows 256‥511,),
    ``layers.0.wo`` → (all rows, columns 1024‥2047), ``layers.0.w1`` → (rows 3584‥7167,), ``layers.0.w2``
    → (all rows, columns 3584‥7167); Mixtral expert parallel ``layers.0.experts.w2`` → (experts 2‥3,).
    """
    check_shardable(config, tp, moe)
    if tp == 1:
        return None
    d, whole = config.head_dim, slice(None)
    kind = name.rsplit(".", 1)[-1] if name.startswith("layers.") else name
    is_expert = ".experts." in name
    if kind == "wq":
        return (_rows(head_range(config, rank, tp), d),)
    if kind in ("wk", "wv"):
        return (_rows(kv_head_range(config, rank, tp), d),)
    if kind == "wo":
        return (whole, _rows(head_range(config, rank, tp), d))
    if kind in ("w1", "w3", "w2"):
        if is_expert and moe == "expert":
            return (_rows(expert_range(config, rank, tp), 1),)
        cols = _rows(_span(rank, config.hidden_dim, tp), 1)
        lead = (whole,) if is_expert else ()
        return (*lead, cols) if kind != "w2" else (*lead, whole, cols)
    return None  # embed, norms, router gate, lm_head: replicated
