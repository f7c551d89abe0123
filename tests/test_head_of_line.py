"""Head-of-line blocking on the default model (SmolLM2-135M-Instruct Q4_1) with the default engine sizes:
a short request that arrives while a 3,000-token prompt is being prefilled gets its first token in the next
step — before the long prompt's prefill ends — and within 3 s on a 2-core machine (the bound of the README's
serving section; before the scheduler's prefill share it waited for the whole prefill, 13.5–15.5 s). The
decoding stream keeps getting a token every step meanwhile.

Also the default sizes themselves (engine_sizing.py): the rules of its docstring on given numbers.
"""

from __future__ import annotations

import time

import pytest
import torch

from mistral_kernels import LLM
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine_sizing import (KV_MEMORY_SHARE, MAX_BATCH, MAX_STEP_TOKENS, MIN_STEP_TOKENS, STEP_SECONDS,
                                           batch_cap, step_budget)
from mistral_kernels.sampling import SamplingParams

from .helpers.default_model_files import default_model_or_skip

LONG_PROMPT = 3000
HEAD_OF_LINE_SECONDS = 3.0


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(default_model_or_skip())


def test_short_request_is_not_blocked_by_a_long_prefill(llm: LLM) -> None:
    eng = llm.engine
    budget = eng.max_tokens_per_step
    assert MIN_STEP_TOKENS <= budget <= MAX_STEP_TOKENS and eng.max_batch >= 32
    greedy = SamplingParams(max_new_tokens=200, temperature=0, ignore_eos=True)
    stream = eng.add_request(llm.prompt_ids("Tell me a story.", chat=True), greedy)
    eng.step()                                                  # the stream decodes from now on
    long_ids = [(7 * i + 3) % 40000 + 100 for i in range(LONG_PROMPT)]
    long = eng.add_request(long_ids, SamplingParams(max_new_tokens=4, temperature=0))
    for _ in range(2):                                          # the long prompt is being prefilled
        assert {out.request_id for out in eng.step()} == {stream}
    short = eng.add_request(llm.prompt_ids("What is the capital of France?", chat=True), greedy)
    t0 = time.perf_counter()
    steps = 0
    while True:
        got = {out.request_id for out in eng.step()}
        steps += 1
        assert stream in got                                    # decodes never wait for the prefill
        if short in got:
            break
        assert long not in got and steps < 20
    ttft = time.perf_counter() - t0
    long_request = next(r for r in eng.scheduler._running if r.rid == long)
    assert long_request.num_computed < LONG_PROMPT              # its prefill is still going on
    assert steps == 1                                           # the short one joined the very next step
    assert ttft < HEAD_OF_LINE_SECONDS, f"time to first token {ttft:.2f} s behind a {LONG_PROMPT}-token prefill"
    eng.abort_all([stream, long, short])
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks


def test_step_budget_rule() -> None:
    """B = rate × STEP_SECONDS rounded down to the block size, clamped, and never below max_batch."""
    assert STEP_SECONDS == 0.5
    assert step_budget(300.0, 16, 32) == 144                   # 150 → 144
    assert step_budget(40.0, 16, 32) == MIN_STEP_TOKENS        # 20 → the floor 64
    assert step_budget(1e6, 16, 32) == MAX_STEP_TOKENS
    assert step_budget(100.0, 16, 96) == 96                   # a full decode step of max_batch must fit
    with pytest.raises(ValueError, match="rate must be > 0"):
        step_budget(0.0, 16, 8)


def test_batch_cap_rule() -> None:
    """max_batch = sequences of 1024 tokens (+ a block) whose KV cache fits in half the available memory."""
    cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, vocab_size=100,
                      max_position=4096)
    per_token = 2 * 2 * 2 * 16 * 4                              # k and v, 2 layers, 2 kv heads, head 16, fp32
    assert cfg.kv_bytes_per_token(torch.float32) == per_token
    per_seq = (1024 + 16) * per_token
    assert KV_MEMORY_SHARE == 0.5
    assert batch_cap(cfg, torch.float32, 2 * 10 * per_seq, 16) == 10
    assert batch_cap(cfg, torch.float32, 2 * 10 * per_seq - 1, 16) == 9
    assert batch_cap(cfg, torch.float32, 0, 16) == 1
    assert batch_cap(cfg, torch.float32, 10**15, 16) == MAX_BATCH == 64
    assert batch_cap(cfg, torch.float32, None, 16) == MAX_BATCH
