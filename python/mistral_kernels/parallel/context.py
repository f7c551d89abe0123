"""One rank's view of the tensor-parallel process group (``torch.distributed``): all-reduce, token broadcast,
and the rank's shard rules (:mod:`.shard`).

Shape letters: N sampled sequences of a step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ModelConfig
from .shard import MOE_MODES, local_config, shard_index

__all__ = ["ParallelContext"]


@dataclass(frozen=True)
class ParallelContext:
    """One rank's view of the tensor-parallel group.

    Attributes
    ----------
    rank, world_size : this rank and tp
    group : the ``torch.distributed`` process group (None = the default group)
    moe : ``"expert"`` (default: each rank owns E/tp whole experts) or ``"tensor"`` (I/tp of every expert)
    """

    rank: int
    world_size: int
    group: Any = None
    moe: str = "expert"

    def __post_init__(self) -> None:
        if self.moe not in MOE_MODES:
            raise ValueError(f"ParallelContext.moe must be one of {MOE_MODES}, got {self.moe!r}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"ParallelContext: rank {self.rank} outside [0, world_size={self.world_size})")

    @property
    def is_first(self) -> bool:
        """Rank 0: the one that prints."""
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks in place (returns it)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, group=self.group)
        return t

    def broadcast_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Rank 0's sampled token ids on every rank, so all ranks' sequences stay identical even when
        sampling draws from per-rank random generators."""
        if self.world_size > 1:
            import torch.distributed as dist

            ids = ids.contiguous()
            dist.broadcast(ids, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0,
                           group=self.group)
        return ids

    def shard(self, config: ModelConfig, name: str) -> tuple[slice, ...] | None:
        """:func:`shard_index` for this rank."""
        return shard_index(config, name, self.rank, self.world_size, self.moe)

    def local_config(self, config: ModelConfig) -> ModelConfig:
        return local_config(config, self.rank, self.world_size, self.moe)

    @classmethod
    def init_from_env(cls, tp: int, device: str = "cpu", moe: str = "expert") -> tuple[ParallelContext, str]:
        """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

        Backend NCCL for ``device`` cuda (each rank on ``cuda:LOCAL_RANK``), gloo for cpu. Returns the
        context and the rank's device. Raises ValueError when WORLD_SIZE is not ``tp``.
        """
        import torch.distributed as dist

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != tp:
            raise ValueError(f"--tp {tp} must equal the number of processes (WORLD_SIZE={world}); launch with "
                             f"`torchrun --nproc-per-node {tp} -m mistral_kernels generate|serve --tp {tp} ...`")
        rank = int(os.environ.get("RANK", "0"))
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            backend = "gloo"
        if tp > 1 and not dist.is_initialized():
            dist.init_process_group(backend=backend, rank=rank, world_size=world)
        return cls(rank=rank, world_size=world, moe=moe), device
