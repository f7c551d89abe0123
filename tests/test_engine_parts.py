"""The engine's parts on their own: the scheduler's worked example and preemption, the output processor's
stop-string hold-back, and AttentionBatch's logits rows (the one place they are computed).

Expected values are worked out by hand from the rules in each module's docstring.
Shape letters: T packed new tokens, N sampled sequences.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.cache import BlockManager
from mistral_kernels.output import OutputProcessor
from mistral_kernels.request import Request, RequestTimings
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.scheduler import Scheduler

from .helpers.engine import ALPHABET, CharTokenizer, fake_step


def _request(rid: int, prompt_len: int, **params: object) -> Request:
    return Request(rid, list(range(1, prompt_len + 1)), SamplingParams(**params), None, RequestTimings())


def test_scheduler_worked_example() -> None:
    """scheduler.py's example: A (4 cached, 1 block) and B (8 cached, 2 blocks) decode, 3 blocks free,
    budget 8; C (6-token prompt) would need 2 blocks but only a 3-token sliver fits: C waits."""
    s = Scheduler(BlockManager(num_blocks=6, block_size=4), max_batch=4, max_tokens_per_step=12)
    a, b, c = _request(0, 4), _request(1, 8), _request(2, 6)
    s.add(a)
    s.add(b)
    first = fake_step(s)                                              # both prompts in one step
    assert [(x.num_cached, x.num_new, x.samples, x.is_decode) for x in first.chunks] == [(0, 4, True, False),
                                                                                       (0, 8, True, False)]
    assert first.num_prefill_tokens == 12 and s.blocks.num_free_blocks == 3
    s.max_tokens_per_step = 8
    s.add(c)
    out = s.schedule()
    assert [(x.request.rid, x.num_cached, x.num_new) for x in out.chunks] == [(0, 4, 1), (1, 8, 1)]
    assert all(x.is_decode and x.samples for x in out.chunks) and out.num_prefill_tokens == 0
    assert [x.token_ids for x in out.chunks] == [[0], [0]]          # the tokens sampled last step
    assert s.num_waiting == 1 and s.blocks.num_free_blocks == 1 and not s.blocks.has(2)
    assert out.chunks[0].block_table == s.blocks.block_table(0) and len(out.chunks[1].block_table) == 3


def test_scheduler_preempts_the_newest() -> None:
    """3 blocks of 4, two 3-token prompts: after prefill and one decode each holds one full block. Next, A's
    5th token takes the last free block; B's finds none and B, the newest, is preempted (its blocks freed),
    then recomputed (prompt + its 2 sampled tokens) once blocks are free again."""
    s = Scheduler(BlockManager(num_blocks=3, block_size=4), max_batch=2, max_tokens_per_step=8)
    a, b = _request(0, 3), _request(1, 3)
    s.add(a)
    s.add(b)
    fake_step(s)                                                      # 3 + 3 prompt tokens, 2 blocks
    fake_step(s)                                                      # 4th tokens: blocks still full, not over
    out = fake_step(s)                                                # 5th: A takes the last block, B is preempted
    assert [x.request.rid for x in out.chunks] == [0] and out.num_preempted == 1
    assert (b.num_computed, b.num_preemptions, s.num_waiting, s.num_running) == (0, 1, 1, 1)
    s.finish(a)
    out = s.schedule()                                            # B recomputes prompt + its 2 outputs
    assert [(x.request.rid, x.num_cached, x.num_new, x.samples, x.is_decode) for x in out.chunks] == [
        (1, 0, 5, True, False)]
    assert out.chunks[0].token_ids == [1, 2, 3, 0, 0]


def test_output_processor_holds_back_a_possible_stop_string() -> None:
    """output.py's rule with stop "xyz": text "Hello x" → "Hello" released, " x" (2 = len - 1 chars) held."""
    tok = CharTokenizer()
    proc = OutputProcessor(tok, eos_ids=tok.eos_ids)
    r = _request(0, 1, max_new_tokens=20, stop=("xyz",))
    proc.add(r)
    texts = [out.text for i, t in enumerate(tok.encode("Hello x"))   # one sampled token per step
             for out in proc.process([r], [t], now=1.0 + i)]
    assert "".join(texts) == "Hello"                              # " x" could start "xyz"
    (out,) = proc.process([r], tok.encode("y"), now=8.0)
    assert (out.text, out.completion) == (" ", None)              # "xy" is held now
    (out,) = proc.process([r], tok.encode("z"), now=9.0)          # "xyz" completes on the "z"
    assert (r.finish_reason, r.stop_reason, r.output_ids) == ("stop", "xyz", tok.encode("Hello xyz"))
    assert out.text == "" and out.token_ids == tok.encode("z")    # the stop string is never shown
    done = out.completion
    assert done is not None and done.text == "Hello " and r.timings.first_token == 1.0 and done.timings.finished == 9.0
    assert not proc.has(0)                                        # a finished request is forgotten
    assert ALPHABET.index("!") in proc.eos_ids


def test_attention_batch_logits_rows() -> None:
    """batch.py's example (blocks [7, 2] and [5], 5 + 2 and 0 + 3 tokens) with only sequence 1 sampling."""
    batch = AttentionBatch.build([[7, 2], [5]], [5, 0], [2, 3], 4, logits_sequences=[1])
    assert batch.slot_mapping.tolist() == [9, 10, 20, 21, 22] and batch.cu_seqlens_q.tolist() == [0, 2, 5]
    assert batch.logits_indices.tolist() == [4]
    assert AttentionBatch.build([[7, 2], [5]], [5, 0], [2, 3], 4, logits_sequences=range(2)).logits_indices.tolist() \
        == [1, 4]
    assert AttentionBatch.build([[7, 2], [5]], [5, 0], [2, 3], 4, logits_sequences=[]).logits_indices.numel() == 0
    assert AttentionBatch.build([[7, 2], [5]], [5, 0], [2, 3], 4).logits_indices is None
    assert AttentionBatch.build([[7, 2], [5]], [5, 0], [2, 3], 4, logits_sequences=[1, 0]).logits_indices.tolist() \
        == [4, 1]  # rows in the order asked (the runner's decodes-first reordering relies on it)
    for bad in ([2], [0, 0], [-1]):
        with pytest.raises(ValueError, match="logits_sequences must be distinct ids in \\[0, 2\\)"):
            AttentionBatch.build([[7, 2], [5]], [5, 0], [2, 3], 4, logits_sequences=bad)
    assert batch.logits_indices.dtype == torch.int64
