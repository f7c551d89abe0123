"""Logit edits a request asks for before sampling: ``logit_bias`` (added to chosen tokens' logits) and
``min_tokens`` (EOS and ``stop_token_ids`` masked until the request has generated that many tokens).

Shape letters: B sequences (rows of the logits), V vocabulary.

Both are applied to the whole batch with one scatter each: the (row, token, value) triples are built on the
host from the requests' parameters and copied to the device without a sync (:func:`~.transfer.to_device`);
nothing is read back. Example: row 0 with ``logit_bias={5: -100}`` and row 1 with ``min_tokens=3`` after
one generated token and EOS id 2 → ``x[0, 5] += -100``, ``x[1, 2] = -inf``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from .sampling_params import SamplingParams
from .transfer import to_device

__all__ = ["adjusts_logits", "apply_logit_bias", "apply_min_tokens"]


def adjusts_logits(p: SamplingParams) -> bool:
    """The request changes logits before sampling (``logit_bias`` or ``min_tokens``)."""
    return bool(p.logit_bias) or p.min_tokens > 0


def apply_logit_bias(x: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """In place: ``x[r, t] += bias`` for every (t, bias) of row r's ``logit_bias``.

    x : float32 [B, V]
    """
    rows, cols, vals = [], [], []
    for r, p in enumerate(params):
        for t, b in p.logit_bias:
            rows.append(r)
            cols.append(t)
            vals.append(b)
    if rows:
        dev = x.device
        x.index_put_((to_device(rows, torch.int64, dev), to_device(cols, torch.int64, dev)),
                     to_device(vals, torch.float32, dev), accumulate=True)


def apply_min_tokens(x: torch.Tensor, params: Sequence[SamplingParams], num_generated: Sequence[int],
                     eos_ids: Collection[int]) -> None:
    """In place: rows that have generated fewer than their ``min_tokens`` get -inf at the EOS ids (unless the
    request sets ``ignore_eos``) and at their ``stop_token_ids``.

    x : float32 [B, V];  num_generated : B counts (tokens generated so far per row)
    """
    rows, cols = [], []
    for r, p in enumerate(params):
        if num_generated[r] >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
        rows += [r] * len(banned)
        cols += sorted(banned)
    if rows:
        dev = x.device
        x.index_put_((to_device(rows, torch.int64, dev), to_device(cols, torch.int64, dev)),
                     torch.tensor(float("-inf"), device=dev))
