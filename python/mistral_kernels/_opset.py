"""OpSet: every public op wrapper, bound to one ``torch.ops`` namespace (see _opbase.py)."""

from __future__ import annotations

from ._ops_attention import AttentionOps
from ._ops_moe import MoEOps
from ._ops_norm import NormOps
from ._ops_rope import RopeOps


class OpSet(NormOps, RopeOps, MoEOps, AttentionOps):
    pass
