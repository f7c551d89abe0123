"""The scheduler's chunked-prefill policy (scheduler.py): decodes first, then running prefills, then
admissions, and the prefill share S = ⌈(B − D) / 2⌉ a chunk may take while another request wants prefill
tokens behind it. Pure host bookkeeping (no model): fast.

Expected chunks are worked out by hand from the module docstring's rules.
"""

from __future__ import annotations

from mistral_kernels.cache import BlockManager
from mistral_kernels.request import Request, RequestTimings
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.scheduler import Scheduler, SchedulerOutput

from .helpers.engine import fake_step


def _request(rid: int, prompt_len: int, max_new_tokens: int = 64) -> Request:
    return Request(rid, [1 + (rid * 7 + i) % 50 for i in range(prompt_len)],
                   SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), None, RequestTimings())


def _plan(out: SchedulerOutput) -> list[tuple[int, int, int]]:
    return [(c.request.rid, c.num_cached, c.num_new) for c in out.chunks]


def test_worked_example_head_of_line() -> None:
    """The docstring's example 2: budget 64; A decodes, L has 100 of 300 prompt tokens computed, N (20
    tokens) arrives: A 1, L ⌈63/2⌉ = 32, N 20 (samples); next step A 1, N 1, L 62."""
    s = Scheduler(BlockManager(num_blocks=64, block_size=4, prefix_caching=False), max_batch=4,
                  max_tokens_per_step=64)
    a, long = _request(0, 3), _request(1, 300)
    s.add(a)
    fake_step(s)                                                    # A's prompt: A decodes from now on
    s.add(long)
    assert _plan(fake_step(s)) == [(0, 3, 1), (1, 0, 63)]           # nobody behind L: it takes what is left
    fake_step(s)                                                    # L: 63 → 126 computed (A 1)
    assert long.num_computed == 126
    s.add(_request(2, 20))
    out = fake_step(s)
    assert _plan(out) == [(0, 5, 1), (1, 126, 32), (2, 0, 20)]
    assert [r.rid for r in out.sampling_requests] == [0, 2]     # N's first token in the step it joined
    assert _plan(fake_step(s)) == [(0, 6, 1), (2, 20, 1), (1, 158, 62)]


def test_decodes_come_first_and_never_wait_for_a_prefill() -> None:
    """An older request in a long prefill and three decoding ones, budget 8: every step gives each decode
    its token, before the prefill's chunk (the prefill gets the remaining 5)."""
    s = Scheduler(BlockManager(num_blocks=128, block_size=4, prefix_caching=False), max_batch=4,
                  max_tokens_per_step=8)
    long = _request(0, 200)
    s.add(long)
    fake_step(s)                                                    # L: 8 tokens, then the others join
    for rid in (1, 2, 3):
        s.add(_request(rid, 2))
    out = fake_step(s)                                              # L has others behind it: 4, then 2 + 2
    assert _plan(out) == [(0, 8, 4), (1, 0, 2), (2, 0, 2)]
    out = fake_step(s)                                              # 1, 2 decode; L 3 (3 behind), 3 joins
    assert _plan(out) == [(1, 2, 1), (2, 2, 1), (0, 12, 3), (3, 0, 2)]
    for _ in range(20):
        out = fake_step(s)
        assert [c.request.rid for c in out.chunks] == [1, 2, 3, 0] and out.chunks[3].num_new == 5
        assert all(c.is_decode for c in out.chunks[:3])


def test_short_request_is_not_stuck_behind_a_long_prefill() -> None:
    """A 3,000-token prompt is being prefilled at budget 256 when a 40-token request arrives: the short one
    samples its first token in the step after it arrived, long before the long prompt's prefill ends, and
    the long prompt keeps advancing by at least half the budget each step."""
    s = Scheduler(BlockManager(num_blocks=1024, block_size=16, prefix_caching=False), max_batch=8,
                  max_tokens_per_step=256)
    long, short = _request(0, 3000), _request(1, 40)
    s.add(long)
    for _ in range(3):
        assert _plan(fake_step(s))[0][2] == 256
    s.add(short)
    first_token_step = long_done_step = None
    for step in range(1, 40):
        before = long.num_computed
        out = fake_step(s)
        if short in out.sampling_requests and first_token_step is None:
            first_token_step = step
        if long in out.sampling_requests and long_done_step is None:
            long_done_step = step
        if long_done_step is None:
            assert long.num_computed - before >= 128 - 1    # the share: ⌈(256 − decodes) / 2⌉ at least
    assert first_token_step == 1 and long_done_step is not None and long_done_step > 5


def test_a_stream_of_arrivals_does_not_starve_the_oldest_prefill() -> None:
    """New short requests arrive every step (more than the budget could ever admit): the long prompt still
    gets the share of every step and finishes."""
    s = Scheduler(BlockManager(num_blocks=4096, block_size=4, prefix_caching=False), max_batch=6,
                  max_tokens_per_step=32)
    long = _request(0, 400)
    s.add(long)
    rid = 1
    done_at = None
    for step in range(60):
        for _ in range(3):
            s.add(_request(rid, 12, max_new_tokens=2))
            rid += 1
        out = fake_step(s)
        for r in out.sampling_requests:
            if r is not long and len(r.output_ids) >= r.params.max_new_tokens:
                s.finish(r)
        if long in out.sampling_requests:
            done_at = step
            break
        decodes = sum(c.is_decode for c in out.chunks)
        assert _plan(out)[decodes][0] == 0 and out.chunks[decodes].num_new >= (32 - decodes + 1) // 2
    assert done_at is not None and done_at <= 400 // 13 + 1


def test_admissions_fill_the_step_without_slivers() -> None:
    """Five 50-token prompts at once, budget 128: the share (64) is above each prompt, so they are admitted
    whole in arrival order until the budget ends (50, 50, then a 28-token chunk), not halved one by one.
    Next step: 2 decodes, share ⌈126/2⌉ = 63; the last waiting request has nobody behind it: 50 whole."""
    s = Scheduler(BlockManager(num_blocks=256, block_size=4, prefix_caching=False), max_batch=8,
                  max_tokens_per_step=128)
    for rid in range(5):
        s.add(_request(rid, 50))
    assert _plan(fake_step(s)) == [(0, 0, 50), (1, 0, 50), (2, 0, 28)]
    assert _plan(fake_step(s)) == [(0, 50, 1), (1, 50, 1), (2, 28, 22), (3, 0, 50), (4, 0, 50)]


def test_alone_a_prefill_takes_the_whole_budget() -> None:
    """Nobody behind it (no other prefill, no one waiting): the chunk is the whole budget, as before."""
    s = Scheduler(BlockManager(num_blocks=256, block_size=4, prefix_caching=False), max_batch=2,
                  max_tokens_per_step=100)
    s.add(_request(0, 250))
    assert [c.num_new for c in fake_step(s).chunks] == [100]
    assert [c.num_new for c in fake_step(s).chunks] == [100]
    assert [c.num_new for c in fake_step(s).chunks] == [50]


def test_a_full_batch_leaves_waiting_requests_out_of_the_share() -> None:
    """max_batch 2, both slots taken (a decode and a long prefill): the waiting request cannot join, so the
    prefill is not capped for it."""
    s = Scheduler(BlockManager(num_blocks=256, block_size=4, prefix_caching=False), max_batch=2,
                  max_tokens_per_step=64)
    s.add(_request(0, 3))
    fake_step(s)
    s.add(_request(1, 500))
    fake_step(s)
    s.add(_request(2, 5))
    assert _plan(fake_step(s)) == [(0, 4, 1), (1, 63, 63)] and s.num_waiting == 1


def test_a_decode_preempts_the_newest_prefill_not_chosen() -> None:
    """2 blocks of 4, budget 8: A (4-token prompt) and B (8) share the first step (A: the share 4, B: the
    last 4), one block each. Next, A's decode needs a block and none is free: B, the newest request not
    chosen in this step, is preempted (the decode runs), and B waits for blocks."""
    s = Scheduler(BlockManager(num_blocks=2, block_size=4, prefix_caching=False), max_batch=2,
                  max_tokens_per_step=8)
    a, b = _request(0, 4), _request(1, 8)
    s.add(a)
    s.add(b)
    assert _plan(fake_step(s)) == [(0, 0, 4), (1, 0, 4)]
    out = fake_step(s)
    assert _plan(out) == [(0, 4, 1)] and out.num_preempted == 1
    assert (b.num_computed, b.num_preemptions, s.num_waiting, s.num_running) == (0, 1, 1, 1)
