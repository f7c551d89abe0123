"""Speculative decoding in the engine (mistral_kernels/speculative/): the n-gram proposer, acceptance, and
the engine with and without speculation on a toy model whose cache holds token ids — greedy outputs
token-identical (stops, streaming, batches 1–8, windows, prefix caching, forced preemption), block-pool
invariants after every step (no cached block holds a rejected token)."""

from __future__ import annotations

import random

import pytest

from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.speculative import NgramProposer, SpeculativeConfig, ngram_lookup
from mistral_kernels.speculative.verify import accept

from .helpers.engine import CharTokenizer
from .helpers.speculative import LoopToy, PoolChecker, run_engine


# ------------------------------------------------------------------------------------------ n-gram lookup
def _lookup_by_scan(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """The rule written out plainly: longest n first, the latest earlier start."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for s in range(len(tokens) - n - 1, -1, -1):
            if tokens[s:s + n] == suffix:
                return tokens[s + n:s + n + k]
    return []


def test_ngram_worked_example() -> None:
    a, b, c, d, x = 1, 2, 3, 4, 5
    assert ngram_lookup([a, b, c, d, x, a, b], 3, 3, 2) == [c, d, x]
    assert ngram_lookup([a, b, c, a, b, c, a, b], 4, 3, 2) == [c, a, b]  # latest match: start 3
    assert ngram_lookup([a, b, c], 3, 3, 2) == []
    assert ngram_lookup([a, b, a, b], 0, 3, 2) == []


def test_ngram_matches_the_plain_scan_also_across_misaligned_bytes() -> None:
    rng = random.Random(3)
    for trial in range(400):
        tokens = [rng.choice([0, 1, 2, 256, 65536, 2**24, 2**31 - 1]) for _ in range(rng.randrange(2, 40))]
        if trial % 3 == 0:  # a suffix whose bytes also occur at an offset that is not a token boundary
            raw = b"".join(t.to_bytes(4, "little") for t in tokens)
            cut = rng.randrange(1, 4)
            if len(raw) >= cut + 8:
                tokens += [int.from_bytes(raw[cut + 4 * i:cut + 4 * i + 4], "little") for i in range(2)]
                tokens = [t if t < 2**31 else t - 2**32 for t in tokens]
        for n_max, n_min in ((4, 2), (3, 1), (2, 2)):
            assert ngram_lookup(tokens, 5, n_max, n_min) == _lookup_by_scan(tokens, 5, n_max, n_min), tokens


def test_accept_keeps_proposals_while_the_target_agrees() -> None:
    assert accept([5, 6, 9, 4, 8], [[5, 6, 7], []]) == [[5, 6, 9], [8]]
    assert accept([5, 6, 7, 1], [[5, 6, 7]]) == [[5, 6, 7, 1]]
    assert accept([2, 3], [[9]]) == [[2]]


def test_config_checks_name_the_field() -> None:
    with pytest.raises(ValueError, match="speculative method"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_tokens=0)
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig(method="draft")
    with pytest.raises(ValueError, match="ngram_min"):
        SpeculativeConfig(ngram_min=3, ngram_max=2)
    with pytest.raises(ValueError, match="needs a proposer"):
        Engine(LoopToy(), CharTokenizer(), num_blocks=8, block_size=4,
               speculative=SpeculativeConfig(method="draft", draft_model="x"))


# ------------------------------------------------------------------------------------------ the engine
def _engine(spec: SpeculativeConfig | None, window: int | None = None, num_blocks: int = 200, max_batch: int = 8,
            prefix_caching: bool = True, budget: int = 64):
    return lambda: Engine(LoopToy(window=window), CharTokenizer(), num_blocks=num_blocks, block_size=4,
                          max_batch=max_batch, max_tokens_per_step=budget, prefix_caching=prefix_caching,
                          speculative=spec)


def _jobs(n: int, seed: int, max_new: int = 40, **params) -> list:
    rng = random.Random(seed)
    system = [rng.randrange(12) for _ in range(9)]
    jobs = []
    for i in range(n):
        prompt = (system if i % 2 else []) + [rng.randrange(12) for _ in range(rng.randrange(1, 14))]
        jobs.append((prompt, SamplingParams(max_new_tokens=rng.randrange(max_new // 2, max_new), **params)))
    return jobs


def _compare(make_plain, make_spec, jobs, min_accepted: int = 1, some_rejected: bool = True) -> Engine:
    want, want_stream, _ = run_engine(make_plain, jobs)
    checker = PoolChecker()
    got, got_stream, engine = run_engine(make_spec, jobs, check=checker)
    for w, g in zip(want, got):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == \
            (w.token_ids, w.text, w.finish_reason, w.stop_reason)
    assert got_stream == [c.token_ids for c in got] == want_stream  # streamed in order, nothing dropped
    s = engine.stats
    assert s.spec_accepted_tokens >= min_accepted
    assert s.spec_proposed_tokens > s.spec_accepted_tokens or not some_rejected
    assert engine.blocks.num_used_blocks == 0
    return engine


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("window", [None, 6])
def test_greedy_identical_under_continuous_batching(batch: int, window: int | None) -> None:
    jobs = _jobs(10, seed=batch, ignore_eos=True)
    spec = SpeculativeConfig(num_tokens=4, max_batch=8, max_rows=64, row_cost=0.1)
    engine = _compare(_engine(None, window, max_batch=batch), _engine(spec, window, max_batch=batch), jobs,
                      min_accepted=20)
    assert engine.stats.decode_tokens > engine.stats.steps  # more than one token per step on average


def test_greedy_identical_with_stops_inside_accepted_runs() -> None:
    rng = random.Random(7)
    jobs = []
    for i in range(24):  # stop tokens / strings / EOS / max_new_tokens land inside accepted runs
        prompt = [rng.randrange(12) for _ in range(rng.randrange(2, 10))]
        kind = i % 4
        params = SamplingParams(max_new_tokens=rng.randrange(3, 30), ignore_eos=kind != 0,
                                stop_token_ids=(rng.randrange(12),) if kind == 1 else (),
                                stop=("".join(rng.choice("abcdefghijkl") for _ in range(2)),) if kind == 2 else ())
        jobs.append((prompt, params))
    spec = SpeculativeConfig(num_tokens=6, max_batch=8, max_rows=64, row_cost=0.1)
    _compare(_engine(None), _engine(spec), jobs)


@pytest.mark.parametrize("window,num_blocks", [(None, 20), (6, 10)])
def test_greedy_identical_under_forced_preemption(window: int | None, num_blocks: int) -> None:
    jobs = _jobs(8, seed=11, max_new=50, ignore_eos=True)
    spec = SpeculativeConfig(num_tokens=5, max_batch=8, max_rows=64, row_cost=0.1)
    engine = _compare(_engine(None, window, num_blocks=num_blocks, budget=16),
                      _engine(spec, window, num_blocks=num_blocks, budget=16), jobs)
    assert engine.stats.preemptions > 0


def test_prefix_caching_off_and_budget_smaller_than_the_proposals() -> None:
    jobs = _jobs(6, seed=5, ignore_eos=True)
    spec = SpeculativeConfig(num_tokens=8, max_batch=8, max_rows=64, row_cost=0.1)
    _compare(_engine(None, prefix_caching=False, budget=8), _engine(spec, prefix_caching=False, budget=8), jobs)


def test_logprobs_of_accepted_tokens_equal_plain_decodings() -> None:
    jobs = _jobs(5, seed=12, logprobs=2, ignore_eos=True)
    want, _, _ = run_engine(_engine(None), jobs)
    got, _, engine = run_engine(_engine(SpeculativeConfig(num_tokens=4, max_batch=8, max_rows=64, row_cost=0.1)), jobs)
    assert engine.stats.spec_accepted_tokens > 0
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids and len(g.logprobs) == len(g.token_ids)
        assert g.logprobs == w.logprobs


def test_no_speculation_above_the_batch_threshold() -> None:
    plans = []

    def make():
        engine = _engine(SpeculativeConfig(num_tokens=4, max_batch=2, max_rows=64, row_cost=0.1), max_batch=8)()
        schedule = engine.scheduler.schedule
        engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
        return engine

    _compare(_engine(None), make, _jobs(6, seed=2, ignore_eos=True), some_rejected=False)
    decoding = [(sum(c.is_decode for c in p.chunks), any(c.draft for c in p.chunks)) for p in plans]
    assert any(n > 2 for n, _ in decoding) and any(d for _, d in decoding)
    assert all(n <= 2 for n, d in decoding if d)


def test_proposal_length_follows_acceptance_and_the_row_cap() -> None:
    lengths = []

    class Recording(NgramProposer):
        def propose(self, requests, k):
            lengths.append(list(k))
            return super().propose(requests, k)

    jobs = _jobs(4, seed=8, ignore_eos=True)
    make = lambda: Engine(LoopToy(), CharTokenizer(), num_blocks=200, block_size=4, max_batch=4,  # noqa: E731
                          max_tokens_per_step=64, proposer=Recording(),
                          speculative=SpeculativeConfig(num_tokens=6, max_batch=4, max_rows=12, row_cost=0.1))
    _compare(_engine(None), make, jobs)
    assert all(sum(n + 1 for n in k) <= 12 for k in lengths)  # 4 decoding: k ≤ 12 // 4 - 1 = 2
    assert any(len(k) <= 2 and max(k) > 2 for k in lengths)  # fewer decoding requests: longer proposals
    assert any(1 <= min(k) < max(k) for k in lengths)  # each request's own length (acceptance)


# ------------------------------------------------------------------------------------------ surfaces
def test_stats_line_and_metrics_report_proposed_and_accepted() -> None:
    from mistral_kernels.cli import build_parser, speculative_stats
    from mistral_kernels.engine_args import EngineArgs

    args = EngineArgs.from_cli_args(build_parser().parse_args(
        ["generate", "--prompt", "x", "--speculative", "ngram", "--num-speculative-tokens", "3", "--ngram-max", "3"]))
    assert args.speculative_config() == SpeculativeConfig(num_tokens=3, ngram_max=3)
    spec = SpeculativeConfig(num_tokens=3, max_batch=8, max_rows=64, row_cost=0.1)
    _, _, engine = run_engine(_engine(spec), _jobs(4, 1, ignore_eos=True))
    s = engine.stats
    assert 0 < s.spec_accepted_tokens < s.spec_proposed_tokens
    line = speculative_stats(engine)
    assert line == (f" | spec ngram accepted {s.spec_accepted_tokens / s.spec_proposed_tokens:.1%} "
                    f"({s.spec_accepted_tokens}/{s.spec_proposed_tokens} tok)")
    assert speculative_stats(_engine(None)()) == ""
    pytest.importorskip("prometheus_client")
    from mistral_kernels.serve.metrics import ServerMetrics

    text = ServerMetrics(engine).render().decode()
    assert f"mistral_kernels_spec_proposed_tokens_total {float(s.spec_proposed_tokens)}\n" in text
    assert f"mistral_kernels_spec_accepted_tokens_total {float(s.spec_accepted_tokens)}\n" in text
