"""Helpers of tests/test_prefix_models.py that other tests share."""

from __future__ import annotations

from typing import Any

import torch

from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams


class Recording:
    """The model, recording the logits [N, V] of every forward (the rows of the step's sampling requests)."""

    def __init__(self, model: Any) -> None:
        self.model, self.config, self.device, self.dtype = model, model.config, model.device, model.dtype
        self.logits: list[torch.Tensor] = []

    def new_cache(self, num_blocks: int, block_size: int) -> Any:
        return self.model.new_cache(num_blocks, block_size)

    def forward(self, token_ids: torch.Tensor, batch: Any, cache: Any) -> torch.Tensor:
        out = self.model.forward(token_ids, batch, cache)
        self.logits.append(out)
        return out


Phase = list[tuple[list[int], int]]  # requests (prompt, max_new_tokens) added together


def _script(vocab: int, bs: int, seed: int, new: int, new_preempt: int) -> tuple[list[Phase], Phase]:
    """The shared-prefix phases (run one after the other) and the preemption phase (tiny pool)."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    system = rand(2 * bs + 3)
    p = rand(3 * bs)
    phases = [
        [(system + rand(n), new) for n in (1, 5, 9, 13)],                # shared system prompt across a batch
        [(system + rand(4), new)],                                        # after the first ones finished
        [(p, new)],
        [(p[:2 * bs] + rand(3), new), (p[:2 * bs + 1] + rand(3), new),   # prefix ends on / one after /
         (p[:2 * bs - 1] + rand(3), new)],                                # one before a block boundary
        [(p[:2 * bs], new), (p[:2 * bs + 1], new), (p[:5], new), (list(p), new)],  # strict prefixes of p
    ]
    preempt = [(system + rand(n), new_preempt) for n in (2, 7, 3, 11)]
    return phases, preempt


def _run(model: Any, phases: list[Phase], *, caching: bool, num_blocks: int, bs: int, budget: int):
    """Run the phases on one engine; per request (in order): greedy tokens and logits [S, V]."""
    rec = Recording(model)
    eng = Engine(rec, None, num_blocks=num_blocks, block_size=bs, max_batch=4, max_tokens_per_step=budget,
                 eos_ids=(), prefix_caching=caching)
    tokens: list[list[int]] = []
    logits: list[list[torch.Tensor]] = []
    for phase in phases:
        rids = [eng.add_request(prompt, SamplingParams(max_new_tokens=n)) for prompt, n in phase]
        rows: dict[int, list[torch.Tensor]] = {rid: [] for rid in rids}
        done = {}
        while eng.has_unfinished():
            before = len(rec.logits)
            outputs = eng.step()
            if len(rec.logits) > before:
                for out, row in zip(outputs, rec.logits[-1]):  # the outputs come in the logits' row order
                    rows[out.request_id].append(row)
            done |= {out.request_id: out.completion for out in outputs if out.completion is not None}
        tokens += [done[rid].token_ids for rid in rids]
        logits += [rows[rid] for rid in rids]
    assert eng.blocks.num_free_blocks == num_blocks and eng.blocks.num_used_blocks == 0
    return tokens, [torch.stack(r) for r in logits], eng.stats


def check_prefix_caching_changes_nothing(model: Any, bs: int, *, pool: int, budget: int, seed: int = 0,
                                         new: int = 6, new_preempt: int = 20) -> None:
    """The module's script on ``model`` with block size ``bs``; the preemption phase on ``pool`` blocks."""
    phases, preempt = _script(model.config.vocab_size, bs, seed, new, new_preempt)
    want_t, want_l, _ = _run(model, phases, caching=False, num_blocks=256, bs=bs, budget=budget)
    got_t, got_l, stats = _run(model, phases, caching=True, num_blocks=256, bs=bs, budget=budget)
    assert got_t == want_t
    for g, w in zip(got_l, want_l):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
    assert stats.prefix_hit_tokens >= 14 * bs, stats                # every phase after the first batch hits
    # Preemption under a tiny pool with shared blocks: the cached run preempts and still matches.
    want_t, want_l, _ = _run(model, [preempt], caching=False, num_blocks=256, bs=bs, budget=budget)
    got_t, got_l, stats = _run(model, [preempt], caching=True, num_blocks=pool, bs=bs, budget=budget)
    assert stats.preemptions > 0 and stats.prefix_hit_tokens > 0, stats
    assert got_t == want_t
    for g, w in zip(got_l, want_l):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
