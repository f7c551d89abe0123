"""Prefix-cache bookkeeping without a model: the block manager's worked examples, and a randomized run of the
scheduler (thousands of steps of random arrivals, lengths, aborts and finishes over a tiny pool) checked
after every step against an independent account of who holds what.

The forward is simulated on a fake KV cache: every slot a chunk writes gets the *fingerprint* of the
sequence prefix ending there (what real k/v depend on), and every key a chunk reads (its window) must hold
the fingerprint of the reading sequence's own prefix. Each check is O(blocks + table entries) per step.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mistral_kernels.cache import FREED, NULL_BLOCK, BlockManager, hash_block, root_hash
from mistral_kernels.request import Request, RequestTimings
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.scheduler import Scheduler


def _computed(bm: BlockManager, seq: str, tokens: list[int], n: int) -> None:
    bm.cache_computed(seq, n, lambda a, b: tokens[a:b])


def test_worked_example_of_the_module_docstring() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, prefix_caching=True)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert bm.match_prefix("A", a) == 0
    bm.allocate("A", 0, len(a))
    _computed(bm, "A", a, len(a))
    blocks_a = list(bm.block_table("A"))
    h1 = hash_block(root_hash(""), [1, 2, 3, 4])
    h2 = hash_block(h1, [5, 6, 7, 8])
    assert bm.cached_blocks() == {h1: blocks_a[0], h2: blocks_a[1]}       # the partial block has no address
    bm.free("A")
    assert bm.num_free_blocks == 8 and bm.num_used_blocks == 0
    assert bm.evictable_block_ids() == [blocks_a[1], blocks_a[0]]         # the prefix is evicted last
    assert blocks_a[2] in bm.free_block_ids()
    b = [1, 2, 3, 4, 5, 6, 7, 8, 11]
    assert bm.match_prefix("B", b) == 8                                   # only token 11 is computed
    bm.allocate("B", 8, 9)
    assert bm.block_table("B")[:2] == blocks_a[:2] and bm.block_table("B")[2] not in blocks_a[:2]
    assert bm.ref_count(blocks_a[0]) == 1 and bm.num_evictable_blocks == 0
    c = [1, 2, 3, 4, 5, 6, 7, 8]                                          # a strict prefix of B
    assert bm.match_prefix("C", c) == 4                                   # its last token must be computed
    bm.allocate("C", 4, 8)
    _computed(bm, "C", c, 8)
    assert bm.ref_count(blocks_a[0]) == 2 and bm.block_table("C")[1] != blocks_a[1]
    assert bm.cached_blocks()[h2] == blocks_a[1]                          # C's copy of block 1 stays unregistered
    bm.free("C")
    bm.free("B")
    assert bm.num_free_blocks == 8 and set(bm.cached_blocks().values()) == set(bm.evictable_block_ids())


def test_eviction_takes_free_blocks_first_then_least_recent() -> None:
    bm = BlockManager(num_blocks=3, block_size=2, prefix_caching=True)
    x = [1, 2, 3, 4, 5]
    bm.allocate("x", 0, 5)
    _computed(bm, "x", x, 5)
    bm.free("x")                                         # 2 cached (evictable) + 1 free
    assert bm.num_free_blocks == 3 and bm.num_evictable_blocks == 2
    bm.allocate("y", 0, 2)                               # takes the never-cached free block
    assert bm.num_evictable_blocks == 2
    bm.allocate("z", 0, 2)                               # evicts the least recently released: x's 2nd block
    assert len(bm.cached_blocks()) == 1 and bm.match_prefix("w", [1, 2, 3, 4, 5]) == 2


def test_window_match_needs_only_the_blocks_still_read() -> None:
    """W 4, block_size 2: a 9-token prompt matching 8 cached tokens reads keys 5..8 from position 8 only, so
    blocks 2 and 3 must be cached; blocks 0 and 1 may have been evicted and their entries are FREED."""
    bm = BlockManager(num_blocks=6, block_size=2, sliding_window=4, prefix_caching=True)
    a = list(range(10, 20))
    bm.allocate("a", 0, 10)
    _computed(bm, "a", a, 10)
    bm.free("a")
    for i in range(2):                                   # evict a's first two blocks (released last = MRU)
        bm.allocate(f"f{i}", 0, 2)
    bm.free("f0")
    bm.free("f1")
    b = a[:8] + [99]
    assert bm.match_prefix("b", b) == 8
    assert bm.block_table("b")[:2] == [FREED, FREED] and bm.num_owned("b") == 2


def test_match_prefix_rejects_a_sequence_with_blocks() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, prefix_caching=True)
    bm.allocate("a", 0, 3)
    with pytest.raises(ValueError, match="already has blocks"):
        bm.match_prefix("a", [1, 2, 3])


def test_batch_sharing_a_prefix_computes_it_once() -> None:
    """Four requests with a common 13-token prefix arrive together (block_size 4, budget 64): the first
    computes the prefix; the others, whose next block it completes in that step, wait one step and then
    start after its 3 full blocks (12 tokens)."""
    s = Scheduler(BlockManager(num_blocks=32, block_size=4, prefix_caching=True), max_batch=4,
                  max_tokens_per_step=64)
    prefix = list(range(1, 14))
    for rid in range(4):
        s.add(Request(rid, prefix + [20 + rid, 30 + rid], SamplingParams(max_new_tokens=3), None, RequestTimings()))
    first = s.schedule()
    assert [(c.request.rid, c.num_cached, c.num_new) for c in first.chunks] == [(0, 0, 15)]
    assert s.num_waiting == 3 and first.prefix_hit_tokens == 0
    s.commit(first)
    first.chunks[0].request.output_ids.append(7)
    second = s.schedule()
    assert [(c.request.rid, c.num_cached, c.num_new) for c in second.chunks] == [(0, 15, 1), (1, 12, 3), (2, 12, 3),
                                                                               (3, 12, 3)]
    assert second.prefix_query_tokens == 45 and second.prefix_hit_tokens == 36
    assert len({c.block_table[2] for c in second.chunks}) == 1                  # one physical copy of the prefix


# ---------------------------------------------------------------------------------------------- randomized
class FakeForward:
    """The fake KV cache: slot → fingerprint of the prefix written there (None = never written)."""

    def __init__(self, num_physical: int, block_size: int, window: int | None) -> None:
        self.slots: list[list[int | None]] = [[None] * block_size for _ in range(num_physical)]
        self.bs = block_size
        self.window = window

    def run(self, bm: BlockManager, chunks, fps: dict[int, list[int]]) -> None:
        cached_blocks = set(bm.cached_blocks().values())
        for c in chunks:
            table, fp, first = c.block_table, fps[c.request.rid], c.num_cached
            lo = max(0, first - self.window + 1) if self.window else 0
            for j in range(lo, first):                   # keys of the cached prefix the first query reads
                blk = table[j // self.bs]
                assert blk != NULL_BLOCK and self.slots[blk][j % self.bs] == fp[j], (c.request.rid, j)
            for p in range(first, first + c.num_new):    # writes: only to blocks held alone, never cached
                blk = table[p // self.bs]
                assert blk != NULL_BLOCK and bm.ref_count(blk) == 1 and blk not in cached_blocks
                self.slots[blk][p % self.bs] = fp[p]


def _check_invariants(bm: BlockManager, s: Scheduler, fake: FakeForward, contents: dict[bytes, list[int]]) -> None:
    n = bm.num_blocks
    held: Counter[int] = Counter()
    for r in s._running:
        held.update(bm.owned_blocks(r.rid))
    for r in s._waiting:
        assert not bm.has(r.rid)
    free, evictable = bm.free_block_ids(), set(bm.evictable_block_ids())
    cached = bm.cached_blocks()
    assert NULL_BLOCK not in held and NULL_BLOCK not in free and NULL_BLOCK not in evictable
    assert all(bm.ref_count(b) == held[b] for b in range(1, n + 1))      # refcount == tables holding it
    assert not (free & held.keys()) and not (evictable & held.keys()) and not (free & evictable)
    assert len(free) + len(evictable) + len(held) == n == bm.num_used_blocks + bm.num_free_blocks
    assert len(set(cached.values())) == len(cached) and evictable <= set(cached.values())
    assert not free & set(cached.values())
    for h, b in cached.items():                                         # the block holds what its address says
        assert fake.slots[b] == contents[h]


@pytest.mark.parametrize("window,n_blocks", [(None, 20), (6, 9)])
def test_randomized_bookkeeping_invariants(window: int | None, n_blocks: int) -> None:
    rng = random.Random(1234 if window is None else 99)
    bs = 4
    bm = BlockManager(n_blocks, bs, window, prefix_caching=True)
    s = Scheduler(bm, max_batch=5, max_tokens_per_step=16)
    fake = FakeForward(bm.num_physical_blocks, bs, window)
    systems = [[rng.randrange(6) for _ in range(n)] for n in (4, 7, 8, 9, 13)]  # on / off block boundaries
    requests: dict[int, Request] = {}
    fps: dict[int, list[int]] = {}                     # per request: fingerprint of each prefix
    chains: dict[int, list[bytes]] = {}               # per request: addresses of its full blocks
    contents: dict[bytes, list[int]] = {}             # address → the fingerprints its block must hold
    root = root_hash("")

    def extend(rid: int) -> None:
        r, fp, chain = requests[rid], fps[rid], chains[rid]
        ids = r.all_ids
        for p in range(len(fp), len(ids)):
            fp.append(hash((fp[-1] if fp else 0, ids[p])))
        for i in range(len(chain), len(ids) // bs):
            chain.append(hash_block(chain[-1] if chain else root, ids[i * bs:(i + 1) * bs]))
            contents.setdefault(chain[-1], fp[i * bs:(i + 1) * bs])

    next_id = hits = evictions = preemptions = 0
    seen_cached: set[bytes] = set()
    steps = 4000
    for step in range(steps + 400):
        if step < steps and rng.random() < 0.35:                          # arrivals
            prompt = list(rng.choice(systems)) if rng.random() < 0.8 else []
            prompt = prompt[:rng.randrange(1, len(prompt) + 1)] if prompt and rng.random() < 0.2 else prompt
            prompt += [rng.randrange(6) for _ in range(rng.choice((0, 1, 3, 5, 12)))] or [1]
            params = SamplingParams(max_new_tokens=rng.randrange(1, 20), ignore_eos=True)
            s.check_fits(len(prompt), params.max_new_tokens)
            r = Request(next_id, prompt, params, None, RequestTimings())
            requests[next_id], fps[next_id], chains[next_id] = r, [], []
            extend(next_id)
            s.add(r)
            next_id += 1
        if step < steps and rng.random() < 0.02 and s.request_ids():      # aborts
            s.abort(rng.choice(s.request_ids()))
        out = s.schedule()
        fake.run(bm, out.chunks, fps)
        s.commit(out)
        hits += out.prefix_hit_tokens
        preemptions += out.num_preempted
        for r in out.sampling_requests:                                   # "sample": often a function of the prefix
            r.output_ids.append(fps[r.rid][-1] % 3 if rng.random() < 0.7 else rng.randrange(6))
            extend(r.rid)
            if len(r.output_ids) >= r.params.max_new_tokens or rng.random() < 0.03:
                s.finish(r)
        cached_now = set(bm.cached_blocks())
        evictions += len(seen_cached - cached_now)
        seen_cached = cached_now
        _check_invariants(bm, s, fake, contents)
        if step >= steps and not s.request_ids():
            break
    assert not s.request_ids()
    assert bm.num_free_blocks == n_blocks and bm.num_used_blocks == 0          # no leak
    assert all(bm.ref_count(b) == 0 for b in range(n_blocks + 1))
    print(f"requests {next_id} hits {hits} evictions {evictions} preemptions {preemptions}")
    assert hits > 1000 and evictions > 100 and preemptions > 20 and next_id > 1000  # the paths were exercised
