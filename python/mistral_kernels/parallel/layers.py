"""The decoder layer of one tensor-parallel rank (shard rules and worked examples in :mod:`.shard`).

Shape letters: T tokens, H hidden, I intermediate (local: I/tp unless experts are split whole), E experts
(El = E/tp local experts), k top-k, M = T·k permuted rows.

The base :class:`~mistral_kernels.model.DecoderLayer` runs unchanged on the local shapes (a local config:
Hq/tp heads, the local kv heads, I/tp); this subclass adds the two all-reduces per layer and the
expert-parallel MoE block.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ..batch import AttentionBatch
from ..config import ModelConfig
from ..model import DecoderLayer
from .context import ParallelContext
from .shard import expert_range

__all__ = ["ShardedDecoderLayer"]


class ShardedDecoderLayer(DecoderLayer):
    """A decoder layer holding one rank's shards; its outputs are complete (all-reduced) [T, H].

    Parameters
    ----------
    config : the *global* model config (routing, expert ids)
    weights : this rank's fused shards (``load_checkpoint(..., shard=ctx.shard)``)
    index : layer number
    kernels : op namespace (as for :class:`DecoderLayer`)
    ctx : the rank and its process group
    """

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], index: int, kernels: ModuleType,
                 ctx: ParallelContext) -> None:
        super().__init__(ctx.local_config(config), weights, index, kernels)
        self.ctx = ctx
        self.expert_parallel = config.is_moe and ctx.moe == "expert"
        if self.expert_parallel:
            experts = expert_range(config, ctx.rank, ctx.world_size)
            self.first_expert = experts.start
            self.num_local_experts = len(experts)
        self._check_shapes(index)

    def _check_shapes(self, index: int) -> None:
        """The weights must be this rank's shards (``load_checkpoint(..., shard=ctx.shard)``), not the
        full tensors."""
        c, h, d = self.config, self.config.dim, self.config.head_dim  # local config
        i = c.hidden_dim
        want = {"qkv": (self.qkv, ((c.n_heads + 2 * c.n_kv_heads) * d, h)), "wo": (self.wo, (h, c.n_heads * d))}
        if c.is_moe:
            e = self.num_local_experts if self.expert_parallel else c.num_experts
            want |= {"w1": (self.w1, (e, i, h)), "w3": (self.w3, (e, i, h)), "w2": (self.w2, (e, h, i))}
        else:
            want |= {"w13": (self.w13, (2 * i, h)), "w2": (self.w2, (h, i))}
        bad = [f"{name} {tuple(t.shape)} (expected {shape})" for name, (t, shape) in want.items()
               if tuple(t.shape) != shape]
        if bad:
            raise ValueError(f"layer {index}, rank {self.ctx.rank} of {self.ctx.world_size}: weights are not this "
                             f"rank's shards: {', '.join(bad)}; load them with load_checkpoint(..., "
                             "shard=ctx.shard) or load_model(..., parallel=ctx)")

    def attention(self, x: torch.Tensor, batch: AttentionBatch, cos_sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Local heads → row-parallel O projection → all-reduce."""
        return self.ctx.all_reduce(super().attention(x, batch, cos_sin, k_cache, v_cache))

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        """Dense / tensor-parallel experts: the base FFN on I/tp → all-reduce. Expert parallel: see
        :meth:`_local_experts`."""
        if self.expert_parallel:
            return self.ctx.all_reduce(self._local_experts(x))
        return self.ctx.all_reduce(super().ffn(x))

    def _local_experts(self, x: torch.Tensor) -> torch.Tensor:
        """Σ over the top-k choices that fall on this rank's experts of w[t, j]·expert(x[t]); [T, H].

        Routing uses the full router (every rank computes the same top-k). Choices of other ranks' experts
        go to a null bucket (local id El) whose rows stay zero. Example (E=4, tp=2, rank 1 owns experts
        2, 3): ids [[2, 0], [0, 3]] → local ids [[0, 2], [2, 1]] over El + 1 = 3 buckets; rows of bucket 2
        are zero, so out[0] = w[0, 0]·expert_2(x[0]) and out[1] = w[1, 1]·expert_3(x[1]).
        """
        c, kern = self.config, self.kernels
        logits = kern.linear(x, self.gate)                                        # [T, E]
        weights, ids = kern.topk_softmax(logits, c.top_k, True)                   # fp32 [T, k], int32 [T, k]
        local = ids - self.first_expert
        null = torch.full_like(local, self.num_local_experts)
        local = torch.where((local >= 0) & (local < self.num_local_experts), local, null)
        permuted, offsets, inv_perm = kern.moe_permute(x, local, self.num_local_experts + 1)  # [M, H]
        # The local experts over their segments; the null bucket's rows come out 0. Offsets stay on the
        # device: no host sync in the decode loop.
        expert_out = kern.moe_expert_ffn(permuted, offsets, self.w1, self.w2, self.w3)  # [M, H]
        return kern.moe_unpermute(expert_out, weights, inv_perm)                  # [T, H]
