"""RoPE frequency scaling (linear, dynamic NTK, YaRN, Llama 3) as data: the cos/sin table of a model.

The rotary kernel reads any fp32 cos/sin table (:func:`mistral_kernels.ops.rope_cos_sin_cache` layout), so a
scaled RoPE is only a different table: per-pair inverse frequencies ``inv_freq`` [R/2] and, for YaRN, an
attention factor that multiplies both cos and sin (q and k are each scaled by it, the scores by its square —
transformers applies it the same way, to cos and sin).

Shape letters: R rotated dims per head, P table rows (max positions).

Worked example (Llama 3.1: θ = 5e5, R = 128, factor 8, low 1, high 4, original context 8192):
wavelength λ_i = 2π / inv_freq_i.  λ < 8192/4 = 2048 → unchanged (high frequencies);  λ > 8192/1 → inv_freq / 8;
in between → smooth mix (1-s)·inv_freq/8 + s·inv_freq with s = (8192/λ - 1) / (4 - 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RopeScaling", "RopeTable", "parse_rope_scaling", "scaled_inv_freq", "rope_table"]

KINDS = ("linear", "dynamic", "yarn", "llama3")  # transformers' names; "freq_factors" comes from GGUF files


@dataclass(frozen=True)
class RopeScaling:
    """One RoPE scaling rule, as a checkpoint states it (transformers' ``rope_scaling`` / ``rope_parameters``).

    kind : 'linear' (inv_freq / factor), 'dynamic' (NTK, changes frequencies only past ``max_position``,
        so within the table it equals plain RoPE), 'yarn', 'llama3'
    factor : the context-extension factor
    original_max_position : pre-training context (llama3, yarn)
    low_freq_factor, high_freq_factor : llama3 band edges
    beta_fast, beta_slow : yarn ramp bounds (rotations)
    attention_factor : yarn's cos/sin multiplier (resolved from mscale / mscale_all_dim when not given); 1 otherwise
    truncate : yarn rounds the ramp bounds outward
    freq_factors : kind 'freq_factors' only — per-pair divisors of inv_freq [R/2], as llama.cpp stores a
        scaled RoPE (Llama 3.1's) in a GGUF file's ``rope_freqs.weight`` tensor
    """

    kind: str
    factor: float
    original_max_position: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True
    freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in (*KINDS, "freq_factors"):
            raise ValueError(f"RopeScaling.kind={self.kind!r}: expected one of {KINDS} or 'freq_factors'")
        if (self.kind == "freq_factors") != (self.freq_factors is not None):
            raise ValueError("RopeScaling: freq_factors are given exactly when kind='freq_factors'")
        if self.freq_factors is not None and not all(f > 0 for f in self.freq_factors):
            raise ValueError(f"RopeScaling.freq_factors must all be > 0, got {self.freq_factors}")
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor must be > 0, got {self.factor}")
        if self.kind in ("llama3", "yarn") and not (self.original_max_position or 0) > 0:
            raise ValueError(f"RopeScaling({self.kind}): original_max_position must be > 0, "
                             f"got {self.original_max_position}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(f"RopeScaling(llama3): need high_freq_factor > low_freq_factor > 0, got "
                             f"{self.high_freq_factor}, {self.low_freq_factor}")


def parse_rope_scaling(spec: Mapping[str, Any] | None, max_position: int, source: str) -> RopeScaling | None:
    """The :class:`RopeScaling` of a transformers rope dict (v4 ``rope_scaling`` or v5 ``rope_parameters``).

    ``rope_type`` (or the older ``type``) 'default' / absent → None. ``max_position`` is the config's
    ``max_position_embeddings``: the default of ``original_max_position_embeddings``, and of yarn's factor.
    Unknown types raise ``ValueError`` naming ``source`` (the caller turns it into UnsupportedCheckpointError).
    """
    if not spec:
        return None
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind == "default":
        return None
    if kind not in KINDS:
        raise ValueError(f"{source}: RoPE type {kind!r} is not supported (default, {', '.join(KINDS)})")
    original = spec.get("original_max_position_embeddings") or max_position
    factor = spec.get("factor")
    if factor is None:
        if kind != "yarn":
            raise ValueError(f"{source}: RoPE type {kind!r} needs a 'factor'")
        factor = max_position / original
    factor = float(factor)
    if kind == "llama3":
        return RopeScaling("llama3", factor, int(original), low_freq_factor=float(spec["low_freq_factor"]),
                           high_freq_factor=float(spec["high_freq_factor"]))
    if kind == "yarn":
        return RopeScaling("yarn", factor, int(original), beta_fast=float(spec.get("beta_fast") or 32),
                           beta_slow=float(spec.get("beta_slow") or 1),
                           attention_factor=_yarn_attention_factor(factor, spec),
                           truncate=bool(spec.get("truncate", True)))
    return RopeScaling(kind, factor)


def _yarn_attention_factor(factor: float, spec: Mapping[str, Any]) -> float:
    """YaRN's cos/sin multiplier: given, or 0.1·m·ln(factor) + 1 (ratio of two when mscale and mscale_all_dim)."""
    if spec.get("attention_factor") is not None:
        return float(spec["attention_factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    m, m_all = spec.get("mscale"), spec.get("mscale_all_dim")
    if m and m_all:
        return mscale(float(m)) / mscale(float(m_all))
    return mscale(1.0)


def scaled_inv_freq(rot_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """fp64 [R/2] inverse frequencies: theta^(-2i/R), then the scaling rule."""
    base = 1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    if scaling is None or scaling.kind == "dynamic":
        return base  # dynamic NTK only changes frequencies for sequences longer than max_position
    if scaling.kind == "linear":
        return base / scaling.factor
    if scaling.freq_factors is not None:
        if len(scaling.freq_factors) != rot_dim // 2:
            raise ValueError(f"RoPE freq_factors: {len(scaling.freq_factors)} entries for rot_dim {rot_dim}, "
                             f"expected {rot_dim // 2}")
        return base / torch.tensor(scaling.freq_factors, dtype=torch.float64)
    if scaling.kind == "llama3":
        assert scaling.original_max_position is not None  # checked by RopeScaling
        old = scaling.original_max_position
        wavelen = 2 * math.pi / base
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        smooth = (old / wavelen - low) / (high - low)
        mixed = (1 - smooth) * base / scaling.factor + smooth * base
        out = torch.where(wavelen > old / low, base / scaling.factor, base)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, mixed, out)
    return _yarn_inv_freq(rot_dim, theta, base, scaling)


def _yarn_inv_freq(rot_dim: int, theta: float, base: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """YaRN: pair i keeps ``base`` (extrapolation) below dim ``low``, uses base/factor above ``high``,
    and a linear ramp between; ``low``/``high`` are the dims that turn ``beta_fast``/``beta_slow`` times
    over the original context."""
    assert s.original_max_position is not None

    def correction_dim(rotations: float) -> float:
        return rot_dim * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # weight of the unscaled frequency
    return base / s.factor * (1 - keep) + base * keep


def rope_table(max_pos: int, rot_dim: int, theta: float, scaling: RopeScaling | None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 [P, R] cos/sin table (cos in ``[:, :R/2]``, sin in ``[:, R/2:]``) with the scaling applied.

    Row p, column i < R/2: a·cos(p·f_i) with f = :func:`scaled_inv_freq` and a the attention factor
    (YaRN; 1 otherwise). Computed in fp64, stored fp32.
    """
    if max_pos < 0 or rot_dim < 0 or rot_dim % 2:
        raise ValueError(f"rope_table: need max_pos >= 0 and an even rot_dim >= 0, got {max_pos}, {rot_dim}")
    if theta <= 0:
        raise ValueError(f"rope_table: theta must be > 0, got {theta}")
    inv_freq = scaled_inv_freq(rot_dim, theta, scaling)
    a = scaling.attention_factor if scaling is not None else 1.0
    table = torch.empty(max_pos, rot_dim, dtype=torch.float32)
    for start in range(0, max_pos, _CHUNK):  # bounded fp64 temporaries (Nemo's config states 1,024,000 rows)
        angles = torch.arange(start, min(start + _CHUNK, max_pos), dtype=torch.float64)[:, None] * inv_freq[None, :]
        table[start:start + angles.shape[0]] = torch.cat([angles.cos(), angles.sin()], dim=-1) * a
    return table.to(device)


_CHUNK = 65536  # rows per fp64 block in rope_table


class RopeTable:
    """A model's cos/sin table, built on demand: only the rows of positions in use, grown by
    doubling up to ``max_position``. A config may declare 1,024,000 positions (Mistral Nemo) — 512 MiB of
    fp32 at R = 128 — while a run uses a few thousand.

    >>> t = RopeTable(1 << 20, 128, 1e6, None)
    >>> t.covering(100).shape            # at least 100 rows (the first build makes MIN_ROWS)
    torch.Size([4096, 128])
    """

    MIN_ROWS = 4096

    def __init__(self, max_position: int, rot_dim: int, theta: float, scaling: RopeScaling | None,
                 device: torch.device | str | None = None) -> None:
        self.max_position = max_position
        self.args = (rot_dim, theta, scaling, device)
        self.table = torch.empty(0, rot_dim, dtype=torch.float32, device=device)

    def covering(self, rows: int) -> torch.Tensor:
        """fp32 [P, R] with P ≥ min(rows, max_position) (rows 0‥P-1 as :func:`rope_table` builds them)."""
        want = min(rows, self.max_position)
        if self.table.shape[0] < want:
            grown = max(want, 2 * self.table.shape[0], self.MIN_ROWS)
            self.table = rope_table(min(grown, self.max_position), *self.args)
        return self.table
