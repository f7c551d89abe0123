"""Counters of the SIMT emulator's launches (``MK_SIMT_STATS=1``): grid waste and memory efficiency.

With ``MK_SIMT_STATS=1`` in the environment, every emulated launch records (csrc/simt/emu_stats.h):

* ``blocks`` / ``empty_blocks``: blocks that exit without a barrier, a warp collective or a global store;
* per access site: global stores' 32-byte sector efficiency, shared-memory stores' and ``ldmatrix`` reads'
  bank-conflict wavefronts, ``cp.async`` copies (the module instruments stores only; the standalone
  program tests/emu/test_mem_efficiency.cpp instruments loads too).

``simt_stats()`` returns the launches recorded since the last reset, oldest first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json

from .._library import library_path


@dataclasses.dataclass(frozen=True)
class SiteStats:
    site: str  # "file:line" (emulator instruction) or "pc 0x…" (compiled access)
    space: str  # "global" | "shared"
    op: str  # "load" | "store"
    instructions: int  # warp-level executions
    bytes: int
    sectors: int  # global: 32-byte sectors touched
    efficiency: float  # global: bytes / (32 · sectors)
    wavefronts: int  # shared: wavefronts issued …
    ideal_wavefronts: int  # … and without bank conflicts
    max_degree: int  # shared: worst bank-conflict degree of one phase (1: conflict-free)
    lo: int  # address range touched [lo, hi)
    hi: int


@dataclasses.dataclass(frozen=True)
class LaunchStats:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    blocks: int
    empty_blocks: int
    sites: tuple[SiteStats, ...]

    @property
    def empty_fraction(self) -> float:
        return self.empty_blocks / self.blocks if self.blocks else 0.0


@functools.cache
def _reader() -> ctypes._CFuncPtr:
    fn = ctypes.CDLL(str(library_path())).mk_simt_stats_json
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_char_p
    return fn


def simt_stats(reset: bool = True) -> list[LaunchStats]:
    """The emulated launches recorded under ``MK_SIMT_STATS=1`` since the last reset (then reset if asked)."""
    raw = json.loads(_reader()(int(reset)).decode())
    return [LaunchStats(kernel=r["kernel"], grid=tuple(r["grid"]), block=tuple(r["block"]), smem_bytes=r["smem_bytes"],
                        blocks=r["blocks"], empty_blocks=r["empty_blocks"],
                        sites=tuple(SiteStats(**s) for s in r["sites"]))
            for r in raw]
