"""Helpers of the speculative decoding tests: a toy model whose greedy output loops (so n-gram proposals get
accepted and rejected), the engine run with and without speculation, and the block-pool invariants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.cache import NULL_BLOCK
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine


class LoopToy:
    """Cache: float64 [N, S] holding the token id written to each slot (NaN = never written). The next token
    peaks at a function of the last two tokens the query sees — read through the block table from the cache —
    and, every ``twist`` positions, of the position too: greedy outputs fall into short loops that
    change now and then, so proposals are often but not always right. Every key a query may see (its window)
    must have been written."""

    def __init__(self, vocab: int = 50, window: int | None = None, twist: int = 11, alphabet: int = 12) -> None:
        self.config = ModelConfig(dim=1, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, hidden_dim=1,
                                  vocab_size=vocab, sliding_window=window, max_position=4096, eos_token_ids=(49,))
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.twist, self.alphabet = twist, alphabet
        self.forwards = 0

    def new_cache(self, num_blocks: int, block_size: int) -> torch.Tensor:
        return torch.full((num_blocks, block_size), float("nan"), dtype=torch.float64)

    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, cache: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        bs = cache.shape[1]
        flat = cache.view(-1)
        keep = batch.slot_mapping >= 0
        flat[batch.slot_mapping[keep]] = token_ids[keep].double()  # every row's write before any read
        rows = batch.logits_indices.tolist() if batch.logits_indices is not None else range(token_ids.shape[0])
        cu = batch.cu_seqlens_q.tolist()
        v = self.config.vocab_size
        out = []
        for t in rows:
            b = max(i for i in range(len(cu) - 1) if cu[i] <= t)
            p = int(batch.positions[t])
            w = self.config.sliding_window
            js = torch.arange(max(0, p - w + 1) if w else 0, p + 1)
            toks = cache[batch.block_tables[b, js // bs].long(), js % bs]
            assert not torch.isnan(toks).any(), "read a slot that was never written"
            last, prev = int(toks[-1]), int(toks[-2]) if len(toks) > 1 else 0
            h = (3 * last + 7 * prev + (p // self.twist if p % self.twist == 0 else 0)) % self.alphabet
            logits = -((torch.arange(v) - h) % v).double() * 0.7
            out.append(logits)
        return torch.stack(out).float() if out else torch.empty(0, v)


class PoolChecker:
    """The block pool's invariants, checked after every step: refcount = tables holding the block; free,
    evictable and held blocks partition the pool; and (with a :class:`LoopToy` cache) every cached block's
    address is that of a run of *accepted* tokens of some request and the block holds exactly those tokens —
    no cached block holds a rejected proposal."""

    def __init__(self) -> None:
        self.known: dict[bytes, list[int]] = {}  # address → the tokens it names (accepted tokens only)
        self.steps = 0

    def _learn(self, engine: Engine, ids: list[int]) -> None:
        bm = engine.blocks
        for i, h in enumerate(bm.addresses(ids, len(ids) // bm.block_size)):
            self.known[h] = ids[i * bm.block_size:(i + 1) * bm.block_size]

    def __call__(self, engine: Engine, outputs: list) -> None:
        self.steps += 1
        bm, s = engine.blocks, engine.scheduler
        held: Counter[int] = Counter()
        for r in s.running():
            held.update(bm.owned_blocks(r.rid))
            self._learn(engine, r.all_ids)
        for out in outputs:
            if out.completion is not None:
                self._learn(engine, out.completion.prompt_token_ids + out.completion.token_ids)
        free, evictable = bm.free_block_ids(), set(bm.evictable_block_ids())
        assert NULL_BLOCK not in held
        assert all(bm.ref_count(b) == held[b] for b in range(1, bm.num_blocks + 1))
        assert not (free & held.keys()) and not (evictable & held.keys()) and not (free & evictable)
        assert len(free) + len(evictable) + len(held) == bm.num_blocks
        cache = engine.cache
        if isinstance(cache, torch.Tensor):  # a LoopToy cache: slot → token id
            for h, b in bm.cached_blocks().items():
                assert h in self.known, "a cached block's address names no accepted tokens"
                assert cache[b].tolist() == [float(t) for t in self.known[h]], f"cached block {b} holds other tokens"


def run_engine(make_engine, jobs: Sequence, check=None, max_steps: int = 100000):
    """Add every (prompt ids, params) job, step to the end (calling ``check(engine, outputs)`` after every step);
    returns (completions in job order, the token ids of each request's streamed outputs in order, engine)."""
    engine = make_engine()
    rids = [engine.add_request(ids, p) for ids, p in jobs]
    done, streamed = {}, {rid: [] for rid in rids}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        outputs = engine.step()
        for out in outputs:
            streamed[out.request_id] += out.token_ids
            if out.completion is not None:
                done[out.request_id] = out.completion
        if check is not None:
            check(engine, outputs)
    return [done[r] for r in rids], [streamed[r] for r in rids], engine


def chi_square_p(a: Counter, b: Counter) -> tuple[float, float]:
    """Two-sample chi-square test of homogeneity of two samples' counts → (p-value, total-variation distance)."""
    na, nb = sum(a.values()), sum(b.values())
    stat, cells = 0.0, 0
    for key in set(a) | set(b):
        oa, ob = a[key], b[key]
        ea, eb = (oa + ob) * na / (na + nb), (oa + ob) * nb / (na + nb)
        stat += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
        cells += 1
    df = max(cells - 1, 1)
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    tv = 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))
    return p, tv
