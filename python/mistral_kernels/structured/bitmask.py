"""The grammar masks of one step: filled on the host by llguidance, applied to the logits before sampling.

Shape letters: N rows of the step's logits (sampling requests), R constrained rows among them, V vocabulary,
W = ceil(V / 32) int32 words per bitmask row.

:func:`constrain_logits` is the runner's one call, between the forward and sampling:

1. fill: one int32 [R, W] bitmask for the constrained rows, on the host, by llguidance's executor
   (several rows in parallel threads, the GIL released). On CUDA the forward was only *launched* when this
   runs (kernels and graph replays are asynchronous), so the fill overlaps the GPU's work; on the CPU the
   forward has finished (no overlap there).
2. copy to the logits' device without a host sync (:mod:`~mistral_kernels.transfer`: pinned, non_blocking).
3. apply (:func:`apply_bitmask`): disallowed tokens → -inf in a new tensor (fp32 CPU logits: numpy integer
   passes on the float bits into the runner's reused :class:`MaskWorkspace`; other devices / dtypes: torch
   ops); the unconstrained rows are copied bit for bit. The raw logits stay as they were: log-probabilities
   are reported from them (raw, before the mask, like before penalties and temperature; see
   ``SamplingParams.logprobs``).

When no row is constrained, the logits are returned as they are: no tensor, no copy, no cost.

Speculative decoding (:func:`constrain_verify_logits`): a constrained request that verifies K proposals
d_1 … d_K has K+1 rows; row j gets the mask of its grammar after d_1 … d_j
(:meth:`~.matcher.GrammarState.masks_for_proposals`, the state left as it was), so each row's distribution is
the masked one plain decoding would sample from once d_1 … d_j are accepted. The accepted tokens are then
consumed by the output processor like any sampled token; rejected ones never were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import llguidance
import numpy as np
import torch

from ..transfer import copy_into, to_device
from .matcher import GrammarState, bitmask_words

__all__ = ["MaskWorkspace", "apply_bitmask", "constrain_logits", "constrain_verify_logits", "fill_bitmask"]

_executor: llguidance.LLExecutor | None = None
_bit_tables: dict[torch.device, torch.Tensor] = {}


class _Constrained(Protocol):
    grammar: GrammarState | None


def fill_bitmask(states: Sequence[GrammarState], vocab_size: int) -> torch.Tensor:
    """The allowed next tokens of each state: int32 [R, W] on the CPU (filled in parallel)."""
    global _executor
    out = torch.empty((len(states), bitmask_words(vocab_size)), dtype=torch.int32)
    if len(states) == 1:
        states[0].fill(out[0])
        return out
    if _executor is None:
        _executor = llguidance.LLExecutor()
    # (llguidance.torch's wrapper of this call would import torch.compile machinery for nothing)
    _executor.unsafe_compute_mask_ptr([(s.matcher, i) for i, s in enumerate(states)], out.data_ptr(),
                                      out.shape[1] * 4, out.shape[0])
    return out


def _blocked_bits(device: torch.device) -> torch.Tensor:
    """bool [256, 8]: entry [b, j] is True when bit j of byte b is clear (token disallowed)."""
    table = _bit_tables.get(device)
    if table is None:
        b = torch.arange(256, dtype=torch.int32)[:, None]
        host = (b >> torch.arange(8, dtype=torch.int32)[None, :]) & 1 == 0
        table = torch.empty(host.shape, dtype=torch.bool, device=device)
        copy_into(table, host)  # no host sync, even the first time
        _bit_tables[device] = table
    return table


class MaskWorkspace:
    """Host buffers reused by :func:`apply_bitmask` on fp32 CPU logits (grown on demand, never shrunk): each
    step's masked logits are written into the same memory instead of freshly allocated megabytes (whose page
    faults cost more than the masking). A result lives in the workspace until its next use."""

    def __init__(self) -> None:
        self._flat: dict[str, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, int], dtype: type) -> np.ndarray:
        size = shape[0] * shape[1]
        flat = self._flat.get(name)
        if flat is None or flat.dtype != dtype or flat.size < size:
            flat = self._flat[name] = np.empty(size, dtype=dtype)
        return flat[:size].reshape(shape)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None, *,
                  workspace: MaskWorkspace | None = None) -> torch.Tensor:
    """``logits`` with the tokens a bitmask disallows at -inf, in a new tensor (or ``workspace``'s memory).

    Parameters
    ----------
    logits : float [N, V] (any float dtype; not modified)
    bitmask : int32 [R, W] on the logits' device; bit ``t % 32`` of word ``t // 32`` set = token t allowed
    rows : int64 [R], the rows of ``logits`` the bitmask rows constrain (distinct); None: all rows (R = N)
    workspace : buffers for fp32 CPU logits (the result then lives in it until its next use); None: fresh

    Returns
    -------
    float [N, V], the dtype of ``logits``; rows not in ``rows`` equal to the input's.
    """
    n, v = logits.shape
    r, w = bitmask.shape
    if bitmask.dtype != torch.int32 or w != bitmask_words(v) or (rows is None and r != n):
        raise ValueError(f"apply_bitmask: bitmask must be int32 [{n if rows is None else 'R'}, "
                         f"{bitmask_words(v)}] for logits {tuple(logits.shape)}, got {bitmask.dtype} {(r, w)}")
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return _apply_host(logits, bitmask, rows, workspace or MaskWorkspace())
    # The int32 words as bytes (little-endian: byte i of a word holds tokens 8i … 8i+7) → one bool per bit.
    idx = bitmask.contiguous().view(torch.uint8).reshape(-1).long()
    blocked = _blocked_bits(logits.device).index_select(0, idx).view(r, 32 * w)[:, :v]  # [R, V]
    if rows is None:
        return logits.masked_fill(blocked, float("-inf"))
    out = logits.clone()
    out.index_copy_(0, rows, logits.index_select(0, rows).masked_fill(blocked, float("-inf")))
    return out


_NEG_INF_BITS = np.int32(-8388608)  # 0xFF800000: float32 -inf
# int32 [256, 8]: entry [b, j] = -1 (all bits set) when bit j of byte b is set (token allowed), else 0
_KEEP = -((np.arange(256, dtype=np.int32)[:, None] >> np.arange(8, dtype=np.int32)[None, :]) & 1)


def _apply_host(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None,
                ws: MaskWorkspace) -> torch.Tensor:
    """:func:`apply_bitmask` for fp32 CPU logits, in numpy on the float bits: ``(x & keep) | (~keep & -inf)``
    with ``keep`` = -1 / 0 per token (looked up per mask byte), every pass single-threaded and in place in
    the workspace: well under a millisecond at N = 16, V = 49k on an idle core, where torch's parallel ops
    would pay thread-pool hand-offs larger than the work (a boolean ``np.where`` is ~10× slower too)."""
    n, v = logits.shape
    r, w = bitmask.shape
    keep_full = ws.array("keep", (r, 32 * w), np.int32)
    np.take(_KEEP, bitmask.contiguous().numpy().view(np.uint8), axis=0, out=keep_full.reshape(r, 4 * w, 8))
    keep = keep_full[:, :v]
    x = np.ascontiguousarray(logits.detach().numpy())
    out = ws.array("out", (n, v), np.float32)
    if rows is None:
        res = out.view(np.int32)
        np.bitwise_and(x.view(np.int32), keep, out=res)
    else:
        np.copyto(out, x)
        sub = ws.array("sub", (r, v), np.float32)
        idx = rows.numpy()
        np.take(x, idx, axis=0, out=sub)
        res = sub.view(np.int32)
        np.bitwise_and(res, keep, out=res)
    np.invert(keep, out=keep)
    np.bitwise_and(keep, _NEG_INF_BITS, out=keep)
    np.bitwise_or(res, keep, out=res)
    if rows is not None:
        out[idx] = sub
    return torch.from_numpy(out)


def constrain_logits(logits: torch.Tensor, requests: Sequence[_Constrained],
                     workspace: MaskWorkspace | None = None) -> torch.Tensor:
    """``logits`` [N, V] with each constrained request's disallowed tokens at -inf (a new tensor, or the
    ``workspace``'s memory on the CPU), or ``logits`` itself when no request has a grammar (see the module
    docstring)."""
    picked = [(i, r.grammar) for i, r in enumerate(requests) if r.grammar is not None]
    if not picked:
        return logits
    host = fill_bitmask([g for _, g in picked], logits.shape[-1])
    return _apply_host_mask(logits, host, [i for i, _ in picked], workspace)


def constrain_verify_logits(logits: torch.Tensor, sequences: Sequence[tuple[GrammarState | None, Sequence[int]]],
                            workspace: MaskWorkspace | None = None) -> torch.Tensor:
    """The verify rows' logits [R, V] with each constrained row's disallowed tokens at -inf (see the module
    docstring), or ``logits`` itself when no sequence has a grammar.

    ``sequences``: per sequence in row order, its grammar state (None: unconstrained) and the proposals it
    verifies (its rows: len + 1).
    """
    if sum(len(d) + 1 for _, d in sequences) != logits.shape[0]:
        raise ValueError(f"constrain_verify_logits: {logits.shape[0]} logits rows for sequences of "
                         f"{sum(len(d) + 1 for _, d in sequences)} verify rows")
    masks, rows, row = [], [], 0
    for grammar, draft in sequences:
        if grammar is not None:
            masks.append(grammar.masks_for_proposals(draft))  # [len(draft)+1, W]
            rows.extend(range(row, row + len(draft) + 1))
        row += len(draft) + 1
    if not masks:
        return logits
    return _apply_host_mask(logits, torch.cat(masks), rows, workspace)


def _apply_host_mask(logits: torch.Tensor, host: torch.Tensor, rows: list[int],
                     workspace: MaskWorkspace | None) -> torch.Tensor:
    """Apply the host bitmask int32 [R, W] of ``rows`` (distinct, increasing) to ``logits`` [N, V]."""
    picked = None if len(rows) == logits.shape[0] else to_device(rows, torch.int64, logits.device)
    if logits.device.type == "cpu":
        mask = host
    else:
        mask = torch.empty(host.shape, dtype=torch.int32, device=logits.device)
        copy_into(mask, host)
    return apply_bitmask(logits, mask, picked, workspace=workspace)
