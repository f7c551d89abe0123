"""Typed, range-checked reads of a checkpoint's config (config.json, params.json, GGUF metadata).

Every size a config states is bounded before anything is allocated from it (a
``num_hidden_layers`` of 10^8 or a ``max_position_embeddings`` of 10^9 must fail at once, not after
minutes or gigabytes). The bounds are generous — several times the largest published models — so that
they only reject corrupt or hostile files; the tensors then confirm the sizes (:mod:`.naming` checks every
shape the config implies against the file). Also the helpers every format's config parser shares: token ids
and building a :class:`~mistral_kernels.config.ModelConfig` with its consistency errors naming the file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..config import ModelConfig
from ..errors import CheckpointError

__all__ = ["LIMITS", "Fields", "as_tuple", "build", "token_id"]

# field (our name) → (smallest, largest) allowed value
LIMITS: dict[str, tuple[float, float]] = {
    "dim": (1, 1 << 16),               # largest published: 16384 (Llama 3.1 405B)
    "n_layers": (1, 1024),             # 126 (Llama 3.1 405B)
    "n_heads": (1, 1024),
    "n_kv_heads": (1, 1024),
    "head_dim": (2, 1024),             # 256 (Gemma); even: RoPE rotates pairs
    "hidden_dim": (1, 1 << 20),        # 53248 (Llama 3.1 405B)
    "vocab_size": (1, 1 << 22),        # 262144 (Gemma 3)
    "num_experts": (0, 1024),
    "top_k": (0, 1024),
    "max_position": (1, 1 << 24),      # = ops.rope.MAX_POSITIONS (tested); 1,024,000 (Mistral Nemo), 10M (Llama 4)
    "sliding_window": (1, 1 << 24),
    "rotary_dim": (2, 1024),
    "norm_eps": (0.0, 1.0),            # exclusive at 0: rsqrt(mean(x²) + eps) must not divide by 0
    "rope_theta": (0.0, 1e15),         # exclusive at 0
}


class Fields:
    """Reads of one config source; errors name ``source`` (the file) and the key.

    >>> Fields({"hidden_size": 4096}, "config.json").int("hidden_size", "dim")
    4096
    """

    def __init__(self, values: Mapping[str, Any], source: str) -> None:
        self.values = values
        self.source = source

    def raw(self, key: str, default: Any = ...) -> Any:
        """The value of ``key`` as stored (``default`` when absent or null; required when no default)."""
        value = self.values.get(key)
        if value is None:
            if default is ...:
                raise CheckpointError(f"{self.source}: required field {key!r} is missing")
            return default
        return value

    def int(self, key: str, limit: str, default: Any = ...) -> Any:
        """An integer in ``LIMITS[limit]`` (or ``default`` when absent, returned as is)."""
        value = self.raw(key, default)
        if value is default and default is not ...:
            return value
        lo, hi = LIMITS[limit]
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # GGUF and some JSON writers store integers as floats
        if type(value) is not int or not lo <= value <= hi:
            raise CheckpointError(f"{self.source}: {key}={value!r} must be an integer in [{int(lo)}, {int(hi)}]")
        return value

    def float(self, key: str, limit: str, default: Any = ...) -> Any:
        """A finite number in ``(lo, hi]`` of ``LIMITS[limit]`` (0 is excluded: eps, theta)."""
        value = self.raw(key, default)
        lo, hi = LIMITS[limit]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not lo < value <= hi:
            raise CheckpointError(f"{self.source}: {key}={value!r} must be a number in ({lo:g}, {hi:g}]")
        return float(value)


def build(source: str, make: Callable[[], ModelConfig]) -> ModelConfig:
    """``make()``, with the consistency errors of :class:`ModelConfig` (heads not dividing, top_k > experts,
    ...) as CheckpointErrors naming ``source``."""
    try:
        return make()
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def token_id(value: Any, source: str) -> int | None:
    """A token id as a config states it (None when absent); CheckpointError unless a non-negative integer."""
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise CheckpointError(f"{source}: token id {value!r} must be a non-negative integer")
    return value


def as_tuple(ids: Any, source: str = "config") -> tuple[int, ...]:
    """One token id or a list of them (``eos_token_id``) as a tuple."""
    if ids is None:
        return ()
    if isinstance(ids, (list, tuple)):
        return tuple(token_id(i, source) or 0 for i in ids)
    return (token_id(ids, source) or 0,)
