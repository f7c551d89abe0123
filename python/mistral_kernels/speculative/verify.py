"""Verification of proposed tokens against the target model's logits: one target token per verify row.

Shape letters: R verify rows of the step (every sampling sequence's rows, in batch order), V vocabulary,
K proposed tokens of one sequence.

A sequence that verifies K proposals d_1 … d_K has K+1 rows: row j holds the target's logits after its
last accepted token and d_1 … d_j, so its distribution p_j is the one plain decoding would sample the token
after d_j from (penalties, temperature and filters applied with d_1 … d_j in the history, exactly as plain
decoding would once they are accepted). A sequence without proposals has one row (K = 0). For each row this
module returns a *target token* t_j:

* greedy: t_j = argmax p_j;
* sampling, j < K: d_{j+1} with probability min(1, p_j(d)/q_j(d)), else a draw from the residual
  normalised max(0, p_j − q_j) — for a point-mass proposal (n-gram, q(d) = 1): accept with p_j(d), else
  draw from p_j with d removed. The residual never holds d, so t_j = d_{j+1} exactly when d_{j+1} is
  accepted;
* sampling, j = K (the bonus row): a draw from p_K.

The host then walks each sequence (:func:`accept`): it keeps d_{j+1} while t_j = d_{j+1} and ends with the
first t_j that differs (or t_K): the accepted tokens + one more, distributed exactly as plain decoding's
(the standard speculative-sampling argument, Leviathan et al. 2023 / Chen et al. 2023), greedy outputs
token-identical. One device → host read: the R target tokens.

Random draws: each verify row takes one uniform and one exponential race (V exponentials) from its request's
own generator, in row order, whether or not it needs them; a bonus row, like a row without proposals, only the
race, as :func:`~mistral_kernels.sampling.sample` does. So a seeded request is reproducible whatever the batch
and whether other requests of its steps speculate (its tokens differ from those of the same seed without
speculation; their distribution does not).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from ..logit_bias import adjusts_logits
from ..sampling import filtered_probs, penalized_logits
from ..sampling_params import SamplingParams
from ..transfer import to_device

__all__ = ["VerifyRow", "accept", "target_tokens"]


@dataclass(frozen=True)
class VerifyRow:
    """What one verify row needs besides its logits.

    Attributes
    ----------
    params : its request's sampling parameters
    generator : its request's generator (None: the shared one)
    seen, generated : the history plain decoding would have at this row (prompt + output + d_1 … d_j;
        output + d_1 … d_j), read only by penalties
    proposed : d_{j+1}, the proposal this row verifies; None for the bonus row
    q : float32 [V], the proposer's distribution of d_{j+1}; None = point mass (or a bonus row)
    """

    params: SamplingParams
    generator: torch.Generator | None
    seen: Sequence[int]
    generated: Sequence[int]
    proposed: int | None
    q: torch.Tensor | None = None


def target_tokens(logits: torch.Tensor, rows: Sequence[VerifyRow], default_generator: torch.Generator, *,
                  eos_ids: Collection[int] = ()) -> torch.Tensor:
    """int64 [R]: the target token of each row (module docstring) from the target's logits [R, V] — for a
    constrained request already masked by its grammar after that row's history
    (:func:`~mistral_kernels.structured.bitmask.constrain_verify_logits`), as plain decoding masks before
    sampling; ``eos_ids``: what ``min_tokens`` masks, as for :func:`~mistral_kernels.sampling.sample`."""
    r = logits.shape[0]
    if len(rows) != r:
        raise ValueError(f"target_tokens: {r} logits rows but {len(rows)} verify rows")
    params = [row.params for row in rows]
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if not rand and not any(p.needs_history or adjusts_logits(p) for p in params):
        return logits.argmax(dim=-1)  # all greedy, no penalties or biases: as plain decoding's greedy batch
    x = penalized_logits(logits, params, [row.seen for row in rows], [row.generated for row in rows],
                         eos_ids=eos_ids)  # [R, V] float32
    out = x.argmax(dim=-1)
    if not rand:
        return out
    dev = x.device
    idx = to_device(rand, torch.int64, dev)
    p = filtered_probs(x.index_select(0, idx), [params[i] for i in rand])  # [Rr, V]
    u = torch.empty(len(rand), dtype=torch.float32, device=dev)
    noise = torch.empty_like(p)
    for j, i in enumerate(rand):
        gen = rows[i].generator or default_generator
        if rows[i].proposed is not None:
            u[j:j + 1].uniform_(0.0, 1.0, generator=gen)
        noise[j].exponential_(1.0, generator=gen)
    noise.clamp_(min=1e-30)
    verify = [j for j, i in enumerate(rand) if rows[i].proposed is not None]
    picked = (p / noise).argmax(dim=-1)  # [Rr] draws from p (the bonus rows keep theirs)
    if verify:
        vidx = to_device(verify, torch.int64, dev)
        d = to_device([rows[rand[j]].proposed for j in verify], torch.int64, dev)  # [Rv]
        pv = p.index_select(0, vidx)  # [Rv, V]
        q = torch.zeros_like(pv).scatter_(1, d[:, None], 1.0)  # point masses …
        for m, j in enumerate(verify):
            if rows[rand[j]].q is not None:
                q[m] = rows[rand[j]].q.to(dev, torch.float32)  # … or the proposer's q
        p_d = pv.gather(1, d[:, None])[:, 0]
        q_d = q.gather(1, d[:, None])[:, 0].clamp(min=1e-30)
        accepted = u.index_select(0, vidx) < (p_d / q_d).clamp(max=1.0)
        residual = (pv - q).clamp_(min=0.0).scatter_(1, d[:, None], 0.0)  # never d (see the docstring)
        redraw = (residual / noise.index_select(0, vidx)).argmax(dim=-1)
        picked = picked.index_copy(0, vidx, torch.where(accepted, d, redraw))
    return out.index_copy(0, idx, picked)


def accept(targets: Sequence[int], proposed: Sequence[Sequence[int]]) -> list[list[int]]:
    """Host: each sequence's new tokens — the proposals kept while the target agrees, then the first target
    token that differs (or the bonus row's). ``targets`` holds sum(len(d)+1) ids, the sequences' rows in order.

    Example: proposals [[5, 6, 7], []], targets [5, 6, 9, 4, 8] → [[5, 6, 9], [8]].
    """
    out, row = [], 0
    for d in proposed:
        new = []
        for j, tok in enumerate(d):
            new.append(targets[row + j])
            if targets[row + j] != tok:
                break
        else:
            new.append(targets[row + len(d)])
        out.append(new)
        row += len(d) + 1
    return out
