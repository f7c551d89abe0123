"""Log-probabilities of sampled tokens (``SamplingParams.logprobs``), for the OpenAI ``logprobs`` fields.

Shape letters: N sequences that sampled this step (rows of the logits), V vocabulary, R rows that asked for
log-probabilities, K the most alternatives any of them asked for.

Which distribution: the *raw* model distribution, ``log_softmax`` (in float32) of the logits the model
returned, before repetition / presence / frequency penalties, temperature, top-k / top-p / min-p. This is
what vLLM returns by default; the sampled token's log-probability is therefore the same whatever the
sampling parameters, and a greedy token is always the top-1 alternative.

Example: logits [2, 1, 0] → log_softmax ≈ [-0.408, -1.408, -2.408]; sampled token 1 with ``logprobs=2``
→ ``TokenLogprob(token_id=1, logprob=-1.408, top=((0, -0.408), (1, -1.408)))``.

Cost: nothing unless a request of the step asks; then one log_softmax over its rows and one extra
device → host read of R·(2+2K) numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["TokenLogprob", "token_logprobs"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the ``k`` most likely tokens at its position.

    Attributes
    ----------
    token_id : the sampled token
    logprob : its log-probability under the raw model distribution
    top : (token id, log-probability) of the k most likely tokens, most likely first (ties: any order)
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def _top_lowest_id_first(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row of lp [R, V] with their ids [R, k], equal values lowest id first — as greedy's
    argmax picks them, so a greedy token is its own first entry (topk leaves the order of ties unspecified).
    Only the m ≥ k entries at or above each row's k-th value are ordered (m > k only for ties at the boundary),
    not the whole vocabulary."""
    if k == 0:
        return lp[:, :0], lp[:, :0].long()
    kth = lp.topk(k, dim=-1).values[:, -1:]
    m = max(k, int((lp >= kth).sum(dim=-1).max()))
    vals, ids = lp.topk(m, dim=-1)
    ids, by_id = ids.sort(dim=-1)
    vals, by_val = vals.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
    return vals[:, :k], ids.gather(1, by_val)[:, :k]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                   top_n: Sequence[int | None]) -> list[TokenLogprob | None]:
    """Log-probabilities of the sampled tokens of the rows that ask for them.

    Parameters
    ----------
    logits : float [N, V], the model's raw next-token logits (not modified)
    token_ids : int64 [N], the token sampled from each row
    top_n : N entries: None = the row does not want log-probabilities; k ≥ 0 = the k most likely

    Returns
    -------
    N entries: a :class:`TokenLogprob` for each row with ``top_n[i]`` not None, else None.
    """
    n = logits.shape[0]
    if len(top_n) != n or token_ids.shape != (n,):
        raise ValueError(f"token_logprobs: {n} rows but {len(top_n)} top_n entries and token_ids "
                         f"{tuple(token_ids.shape)}")
    rows = [i for i, k in enumerate(top_n) if k is not None]
    out: list[TokenLogprob | None] = [None] * n
    if not rows:
        return out
    idx = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    lp = logits.index_select(0, idx).float().log_softmax(dim=-1)  # [R, V]
    chosen = token_ids.index_select(0, idx)  # [R]
    k = min(max(int(top_n[i] or 0) for i in rows), lp.shape[-1])
    top_lp, top_ids = _top_lowest_id_first(lp, k)  # [R, K]
    # One host read: ids are exact in float64 (vocabularies are far below 2**53).
    packed = torch.cat([chosen[:, None].double(), lp.gather(1, chosen[:, None]).double(), top_ids.double(),
                        top_lp.double()], dim=1).tolist()  # [R, 2 + 2K]
    for i, row in zip(rows, packed):
        want = int(top_n[i] or 0)
        ids, vals = row[2:2 + k], row[2 + k:]
        out[i] = TokenLogprob(int(row[0]), row[1], tuple((int(t), v) for t, v in zip(ids[:want], vals[:want])))
    return out
