"""What the server needs of the engine: :meth:`Engine.abort` frees a request's KV blocks at once (running or
waiting) without disturbing the others, and each step's outputs name the requests that got a token in it."""

from __future__ import annotations

from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams

from .helpers.engine import CharTokenizer, ToyModel


def _alone(prompt: str, n: int) -> list[int]:
    tok = CharTokenizer()
    eng = Engine(ToyModel(), tok, num_blocks=64, block_size=4, max_batch=2, max_tokens_per_step=16)
    rid = eng.add_request(tok.encode(prompt), SamplingParams(max_new_tokens=n, ignore_eos=True))
    return eng.run([rid])[0].token_ids


def test_abort_running_and_waiting_frees_blocks_others_unaffected() -> None:
    tok = CharTokenizer()
    eng = Engine(ToyModel(), tok, num_blocks=64, block_size=4, max_batch=2, max_tokens_per_step=64)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    keep = eng.add_request(tok.encode("hello there"), params)
    drop_running = eng.add_request(tok.encode("the quick brown fox"), params)
    drop_waiting = eng.add_request(tok.encode("abc"), params)  # max_batch 2: waits
    first = eng.step()
    assert [out.request_id for out in first] == [keep, drop_running]
    second = eng.step()
    assert eng.num_running == 2 and eng.num_waiting == 1
    used = eng.blocks.num_blocks - eng.blocks.num_free_blocks
    # cached after two steps: prompt + the first sampled token; 11 + 1 = 12 → 3 blocks, 19 + 1 = 20 → 5 blocks
    assert used == 3 + 5
    assert eng.abort(drop_running) and eng.abort(drop_waiting)
    assert eng.blocks.num_blocks - eng.blocks.num_free_blocks == 3
    assert eng.num_running == 1 and eng.num_waiting == 0
    assert not eng.abort(drop_running)  # already gone
    rest = list(eng.iterate([keep]))
    outputs = [o for o in first + second if o.request_id == keep] + rest
    done = rest[-1].completion
    assert done is not None and done.request_id == keep
    assert [t for o in outputs for t in o.token_ids] == done.token_ids == _alone("hello there", 10)
    assert "".join(o.text for o in outputs) == done.text
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks
    assert not eng.abort(keep)  # finished and handed out
