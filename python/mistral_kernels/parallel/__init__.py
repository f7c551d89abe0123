"""Tensor and expert parallelism on ``torch.distributed``, applied from outside the single-process model.

=================  ===========================================================================
module             contents
=================  ===========================================================================
:mod:`.shard`      shard rules (pure functions of the config): which rows / columns / experts a
                   rank holds, per-rank shapes and parameter counts — table and worked examples
:mod:`.context`    :class:`ParallelContext`: the rank, its process group, all-reduce, token broadcast
:mod:`.layers`     :class:`ShardedDecoderLayer`: the base decoder layer on local shapes + all-reduces
:mod:`.model`      :class:`ShardedModel`: a :class:`~mistral_kernels.model.Model` built from those layers
=================  ===========================================================================

Usage: ``ctx, device = ParallelContext.init_from_env(tp, "cuda")`` then
``mistral_kernels.load_model(path, device=device, parallel=ctx)`` or ``LLM(path, device=device,
parallel=ctx)``; every rank makes the same calls.
"""

from __future__ import annotations

from .context import ParallelContext
from .layers import ShardedDecoderLayer
from .model import ShardedModel
from .shard import (MOE_MODES, check_shardable, expert_range, head_range, kv_head_range, local_config,
                    parameters_per_rank, shard_index)

__all__ = ["MOE_MODES", "ParallelContext", "ShardedDecoderLayer", "ShardedModel", "check_shardable", "expert_range",
           "head_range", "kv_head_range", "local_config", "parameters_per_rank", "shard_index"]
