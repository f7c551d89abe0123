"""The decoder of one tensor-parallel rank, built from the outside of :mod:`mistral_kernels.model`.

:class:`ShardedModel` is a :class:`~mistral_kernels.model.Model` whose layers are
:class:`~.layers.ShardedDecoderLayer` (local heads / experts, two all-reduces per layer) and whose sampled
token ids are rank 0's. The model module itself knows nothing of parallelism: it takes prebuilt layers,
and sizes the KV cache by the config those layers compute with (the rank's local kv heads).
"""

from __future__ import annotations

from types import ModuleType

import torch

from .. import ops
from ..config import ModelConfig
from ..model import Model
from .context import ParallelContext
from .layers import ShardedDecoderLayer

__all__ = ["ShardedModel"]


class ShardedModel(Model):
    """One rank's decoder over its shards of the weights.

    Parameters
    ----------
    config : the *global* model config
    weights : this rank's fused shards (``load_checkpoint(..., shard=ctx.shard)``); full tensors are
        rejected with a ValueError naming the layer and the mis-shaped weights
    ctx : the rank and its process group
    kernels : op namespace (as for :class:`~mistral_kernels.model.Model`)
    """

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], ctx: ParallelContext,
                 kernels: ModuleType = ops) -> None:
        layers = [ShardedDecoderLayer(config, weights, n, kernels, ctx) for n in range(config.n_layers)]
        super().__init__(config, weights, kernels, layers=layers)
        self.ctx = ctx

    def broadcast_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Sampled ids [N] made identical on all ranks (rank 0's): the engine calls it once per step."""
        return self.ctx.broadcast_tokens(ids)
