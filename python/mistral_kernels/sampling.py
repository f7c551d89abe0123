"""Next-token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
penalties, logit bias and min_tokens (:mod:`.logit_bias`), seeds.

Shape letters: B sequences (rows of the logits), V vocabulary.

One call samples a whole batch; each row has its own :class:`~.sampling_params.SamplingParams` (defined
there, re-exported here). The order of the transforms is the usual one (as in HF ``generate``): repetition
penalty → presence / frequency penalties → temperature → top-k → top-p → min-p → sample.
``temperature == 0`` is greedy (argmax, lowest id on ties) and ignores the other filters except the penalties.

Reproducibility: a row with a ``seed`` draws from its own ``torch.Generator`` (created by the engine per
request), so its tokens do not depend on what else is in the batch, on batch order or on preemption.
Sampling uses the exponential-race form of a categorical draw: ``argmax(p / E)`` with E ~ Exp(1) i.i.d.
per vocabulary entry, which picks token i with probability p_i exactly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from .logit_bias import adjusts_logits, apply_logit_bias, apply_min_tokens
from .sampling_params import MAX_LOGPROBS, SEED_RANGE, SamplingParams
from .transfer import to_device

__all__ = ["MAX_LOGPROBS", "SEED_RANGE", "SamplingParams", "apply_filters", "filtered_probs", "penalized_logits",
           "sample"]


def _penalize(logits: torch.Tensor, rows: list[int], penalties: list[float],
              seen: Sequence[Sequence[int]]) -> None:
    """In place: for each listed row, logits of already-seen tokens are divided (if > 0) or multiplied
    (if ≤ 0) by the row's penalty. (A mask, not ``unique()``: no device sync.)"""
    for r, pen in zip(rows, penalties):
        if not seen[r]:
            continue
        ids = to_device(list(seen[r]), torch.int64, logits.device)
        hit = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device).index_fill_(0, ids, True)
        row = logits[r]
        row.copy_(torch.where(hit, torch.where(row > 0, row / pen, row * pen), row))


def _presence_frequency(logits: torch.Tensor, rows: list[int], params: Sequence[SamplingParams],
                        generated: Sequence[Sequence[int]]) -> None:
    """In place: ``logits[r, t] -= presence · [count_t > 0] + frequency · count_t`` where ``count_t`` is how
    often row r generated token t. Example: generated [5, 5, 7], presence 0.5, frequency 0.25 → token 5
    loses 0.5 + 0.5 = 1.0, token 7 loses 0.75. (Counts by index_add, not ``unique()``: no device sync.)"""
    for r in rows:
        if not generated[r]:
            continue
        ids = to_device(list(generated[r]), torch.int64, logits.device)
        counts = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        counts.index_add_(0, ids, torch.ones(ids.shape[0], dtype=logits.dtype, device=logits.device))
        p = params[r]
        logits[r] -= p.presence_penalty * (counts > 0).to(logits.dtype) + p.frequency_penalty * counts


def apply_filters(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p, batched; filtered entries become -inf.

    Parameters
    ----------
    logits : float32 [B, V]
    temperature : float32 [B], > 0
    top_k : int64 [B], 0 = off
    top_p : float32 [B], 1 = off
    min_p : float32 [B], 0 = off

    Returns
    -------
    float32 [B, V] — scaled logits with the dropped tokens at -inf (at least one token always kept).
    """
    x = logits / temperature[:, None]
    v = x.shape[-1]
    sorted_x, order = x.sort(dim=-1, descending=True)
    rank = torch.arange(v, device=x.device)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=v), torch.full_like(top_k, v))
    drop = rank >= k[:, None]
    probs = sorted_x.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # top-p: keep a token if the mass strictly before it is < top_p (so the first token is always kept).
    before = probs.cumsum(dim=-1) - probs
    drop |= (before >= top_p[:, None]) & (top_p[:, None] < 1.0)  # (cumsum rounding may reach 1 early)
    # min-p: relative to the most likely token (probabilities after temperature, top-k).
    drop |= probs < (min_p[:, None] * probs[:, :1])
    drop[:, 0] = False
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.full_like(x, float("-inf")).scatter_(-1, order, sorted_x)


def penalized_logits(logits: torch.Tensor, params: Sequence[SamplingParams],
                     seen: Sequence[Sequence[int]] | None = None,
                     generated: Sequence[Sequence[int]] | None = None, *,
                     eos_ids: Collection[int] = ()) -> torch.Tensor:
    """float32 [B, V]: a copy of ``logits`` [B, V] with each row's repetition, presence and frequency penalties,
    then its ``logit_bias`` and ``min_tokens`` mask applied (``seen`` / ``generated`` / ``eos_ids`` as for
    :func:`sample`); ``logits`` is not modified."""
    pen_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    pf_rows = [i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0]
    x = logits.to(torch.float32, copy=True)  # the penalties below write into it, never into `logits`
    if pen_rows:
        if seen is None:
            raise ValueError("sample: repetition_penalty needs `seen` (the tokens of each sequence)")
        _penalize(x, pen_rows, [params[i].repetition_penalty for i in pen_rows], seen)
    if pf_rows:
        if generated is None:
            raise ValueError("sample: presence / frequency penalties need `generated` (each row's output tokens)")
        _presence_frequency(x, pf_rows, params, generated)
    if any(adjusts_logits(p) for p in params):
        apply_logit_bias(x, params)
        if any(p.min_tokens for p in params):
            if generated is None:
                raise ValueError("sample: min_tokens needs `generated` (each row's output tokens)")
            apply_min_tokens(x, params, [len(g) for g in generated], eos_ids)
    return x


def filtered_probs(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """float32 [R, V]: the sampling distribution of each row of the penalized logits ``x`` [R, V] (rows that do
    not sample greedily): temperature, top-k, top-p, min-p (:func:`apply_filters`), softmax."""
    dev = x.device
    filt = apply_filters(
        x,
        to_device([p.temperature for p in params], torch.float32, dev),
        to_device([p.top_k for p in params], torch.int64, dev),
        to_device([p.top_p for p in params], torch.float32, dev),
        to_device([p.min_p for p in params], torch.float32, dev),
    )
    return filt.softmax(dim=-1)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None],
           seen: Sequence[Sequence[int]] | None = None,
           generated: Sequence[Sequence[int]] | None = None, *,
           eos_ids: Collection[int] = ()) -> torch.Tensor:
    """Sample one token per row.

    Parameters
    ----------
    logits : float [B, V]
        Next-token logits (any float dtype; computed in float32; not modified).
    params : B SamplingParams
    generators : B generators (or None: torch's default generator) used by the non-greedy rows
    seen : B token lists (prompt + generated so far); needed when a row has repetition_penalty ≠ 1
    generated : B token lists (generated so far); needed when a row has a presence / frequency penalty or
        ``min_tokens``
    eos_ids : the ids ``min_tokens`` masks (with each row's ``stop_token_ids``); see :mod:`.logit_bias`

    Returns
    -------
    int64 [B] token ids (on the logits' device; the caller reads them once per step).
    """
    b = logits.shape[0]
    if len(params) != b or len(generators) != b:
        raise ValueError(f"sample: {b} rows but {len(params)} params and {len(generators)} generators")
    rand_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not (rand_rows or any(p.needs_history or adjusts_logits(p) for p in params)):
        # Greedy batch: the argmax of the logits as given (a 16-bit → fp32 cast is exact and monotone, so the
        # same ids, lowest on ties), no fp32 copy, no probabilities.
        return logits.argmax(dim=-1)
    x = penalized_logits(logits, params, seen, generated, eos_ids=eos_ids)
    out = x.argmax(dim=-1)
    if not rand_rows:
        return out
    idx = to_device(rand_rows, torch.int64, x.device)
    probs = filtered_probs(x.index_select(0, idx), [params[i] for i in rand_rows])
    noise = torch.empty_like(probs)
    for j, i in enumerate(rand_rows):
        noise[j].exponential_(1.0, generator=generators[i])
    picked = (probs / noise.clamp_(min=1e-30)).argmax(dim=-1)
    return out.index_copy(0, idx, picked)
