"""Adaptive speculation (mistral_kernels/speculative/cost.py, speculator.py): the cost model's rule against a
brute-force evaluation of the same expectation, the acceptance estimate, the row-cost measurement on a fake
clock, and the engine on the loop toy — a request whose proposals are always wrong soon verifies only a probe
token now and then (outputs unchanged), one whose proposals are always right keeps the most; both in one batch."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.speculative import Proposal, SpeculativeConfig
from mistral_kernels import engine_sizing
from mistral_kernels.speculative.cost import (ACCEPTANCE_DECAY, PROBE_SHARE, ROW_COST_MIN_WEIGHT, Acceptance, CostModel,
                                             RowCostTracker, measure_row_cost)

from .helpers.engine import CharTokenizer
from .helpers.speculative import LoopToy, run_engine

WRONG = 48  # the loop toy never outputs it (its alphabet is 0 … 11)


# ------------------------------------------------------------------------------------------ the rule
def _expected_by_outcomes(alpha: float, k: int) -> float:
    """Σ over the accepted count a of P(a) · (a + 1): P(a) = α^a (1 − α) for a < k, α^k for a = k."""
    return sum((alpha ** a) * (1 - alpha) * (a + 1) for a in range(k)) + alpha ** k * (k + 1)


def _best_by_search(alpha: float, rho: float, batch: int, k_max: int) -> int:
    """The k of the most tokens per unit of time for a step of ``batch`` sequences, one of them verifying k
    proposals — the step time written from the measured model: n rows take 1 + ρ(n − 1)."""
    best, value = 0, batch / (1 + rho * (batch - 1))
    for k in range(1, k_max + 1):
        v = (batch - 1 + _expected_by_outcomes(alpha, k)) / (1 + rho * (batch - 1 + k))
        if v > value * (1 + 1e-9):
            best, value = k, v
    return best


def test_expected_tokens_and_best_k_equal_a_search_over_outcomes() -> None:
    for alpha in (0.0, 0.13, 0.41, 0.6, 0.9, 0.999, 1.0):
        for k in range(0, 9):
            assert CostModel.expected_tokens(alpha, k) == pytest.approx(_expected_by_outcomes(alpha, k))
    for alpha, rho, batch, k_max in itertools.product((0.0, 0.2, 0.41, 0.6, 0.8, 0.95, 1.0), (0.0, 0.05, 0.15, 0.3,
                                                      0.7, 1.0, 1.3), (1, 2, 4), (1, 3, 8)):
        assert CostModel(rho).best_k(alpha, k_max, batch) == _best_by_search(alpha, rho, batch, k_max), \
            (alpha, rho, batch, k_max)


def test_the_worked_example_of_the_docstring() -> None:
    fast, slow = CostModel(0.15), CostModel(0.7)
    assert slow.best_k(0.6, 3) == 0 and slow.best_k(0.9, 3) == 2 and slow.best_k(1.0, 3) == 3
    assert fast.best_k(0.6, 3) == 2
    assert slow.probe_interval() == 35 and fast.probe_interval() == 8
    a = Acceptance()
    a.update(0, 3)
    assert a.rate == pytest.approx(0.7 / 1.7) and slow.best_k(a.rate, 3) == 0
    assert CostModel(1.0).best_k(1.0, 8) == 0  # rows as dear as steps: speculation never pays
    for rho in (0.05, 0.3, 0.7, 1.0):  # a probe row per interval stays within the share
        assert rho / CostModel(rho).probe_interval() <= PROBE_SHARE + 1e-12
    with pytest.raises(ValueError, match="row_cost"):
        CostModel(float("nan"))
    with pytest.raises(ValueError, match="row_cost"):
        SpeculativeConfig(row_cost=-0.1)


def test_acceptance_is_decayed_counts_of_tried_proposals() -> None:
    a = Acceptance()
    assert a.rate == 1.0
    acc, trials = 1.0, 1.0
    for kept, proposed in ((3, 3), (1, 3), (0, 2), (2, 2), (0, 1)):
        a.update(kept, proposed)
        acc = ACCEPTANCE_DECAY * acc + kept
        trials = ACCEPTANCE_DECAY * trials + kept + (1 if kept < proposed else 0)
        assert a.rate == pytest.approx(acc / trials)
    with pytest.raises(ValueError, match="accepted ≤ proposed"):
        a.update(3, 2)


def test_row_cost_is_measured_from_decode_shaped_forwards(monkeypatch) -> None:
    """A fake model whose forward of n single-token rows takes a + b·n on a fake clock: ρ = b / (a + b)."""
    now = [0.0]
    calls = []

    class Timed:
        config = ModelConfig(dim=1, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, hidden_dim=1, vocab_size=32,
                             max_position=512, eos_token_ids=())
        device = torch.device("cpu")

        def new_cache(self, num_blocks: int, block_size: int) -> None:
            return None

        def forward(self, ids, batch, cache):
            n = ids.shape[0]
            calls.append(n)
            now[0] += 3.0 + 1.0 * n if n < 16 else 100.0  # the prefill of the context: any time
            return torch.zeros(n, 32)

    monkeypatch.setattr(engine_sizing.time, "perf_counter", lambda: now[0])  # the clock of engine_sizing.fastest
    assert measure_row_cost(Timed(), 16, 5) == pytest.approx(1.0 / 4.0)
    assert calls[0] == 64 + 5 and sorted(set(calls[1:])) == [1, 5]  # context prefilled, then the two shapes


# ------------------------------------------------------------------------------------------ the engine
class Mixed:
    """Proposes each request's known continuation (always right) or a token the toy never outputs (always
    wrong), by the request's prompt; records each step's asked k per prompt."""

    def __init__(self, right: dict[tuple[int, ...], list[int]], wrong: set[tuple[int, ...]]) -> None:
        self.right, self.wrong = right, wrong
        self.asked: list[dict[tuple[int, ...], int]] = []

    def propose(self, requests, k):
        self.asked.append({tuple(r.prompt_ids): n for r, n in zip(requests, k)})
        out = []
        for r, n in zip(requests, k):
            key = tuple(r.prompt_ids)
            if key in self.wrong:
                out.append(Proposal([WRONG] * n))
            else:
                ref = self.right[key]
                out.append(Proposal(ref[len(r.output_ids):len(r.output_ids) + n]))
        return out

    def forget(self, rid: int) -> None:
        return None


def _engine(spec: SpeculativeConfig | None, proposer=None, max_batch: int = 2):
    return lambda: Engine(LoopToy(), CharTokenizer(), num_blocks=300, block_size=4, max_batch=max_batch,
                          max_tokens_per_step=64, speculative=spec, proposer=proposer)


def _per_step(make, jobs, proposer: Mixed):
    """Run the jobs; per engine step, which prompts were asked for how many tokens ({} when none was)."""
    steps: list[dict[tuple[int, ...], int]] = []
    seen = [0]

    def check(engine, outputs):
        new = proposer.asked[seen[0]:]
        seen[0] = len(proposer.asked)
        steps.append(new[-1] if new else {})

    done, _, engine = run_engine(make, jobs, check=check)
    return done, steps, engine


def _jobs(n: int, max_new: int = 120) -> list:
    rng = random.Random(5)
    return [([rng.randrange(12) for _ in range(7)], SamplingParams(max_new_tokens=max_new, ignore_eos=True))
            for _ in range(n)]


def test_always_wrong_proposals_fall_to_probes_and_outputs_stay_identical() -> None:
    jobs = _jobs(1)
    want, _, _ = run_engine(_engine(None), jobs)
    key = tuple(jobs[0][0])
    rho = 0.3
    spec = SpeculativeConfig(num_tokens=4, row_cost=rho)
    proposer = Mixed({}, {key})
    done, steps, engine = _per_step(_engine(spec, proposer), jobs, proposer)
    assert done[0].token_ids == want[0].token_ids and engine.stats.spec_accepted_tokens == 0
    asked = [(i, s[key]) for i, s in enumerate(steps) if key in s]
    interval = CostModel(rho).probe_interval()
    assert interval == 15
    # warm-up: k = 4 (α = 1), then 1 (α = 0.41 is still worth one row at ρ = 0.3), then plain decode …
    assert [k for _, k in asked[:2]] == [4, 1] and asked[1][0] == asked[0][0] + 1
    # … with one probe token after every `interval` plain steps
    probes = asked[2:]
    assert len(probes) >= 5 and all(k == 1 for _, k in probes)
    gaps = [b - a for (a, _), (b, _) in zip(asked[1:], asked[2:])]
    assert all(g == interval + 1 for g in gaps), gaps
    decode_steps = len(steps) - 1
    rows = sum(k for _, k in asked)
    assert rows <= 5 + math.ceil(decode_steps / (interval + 1))
    # without adaptation every step verifies 4 proposals (what the rule above saves)
    fixed = Mixed({}, {key})
    done, steps, _ = _per_step(_engine(SpeculativeConfig(num_tokens=4, adaptive=False), fixed), jobs, fixed)
    assert done[0].token_ids == want[0].token_ids
    assert sum(s.get(key, 0) for s in steps) >= 4 * (len(steps) - 5)  # (the last steps propose fewer)


def test_always_right_proposals_keep_the_most_tokens_and_requests_adapt_apart() -> None:
    jobs = _jobs(2)
    want, _, _ = run_engine(_engine(None), jobs)
    right_key, wrong_key = tuple(jobs[0][0]), tuple(jobs[1][0])
    proposer = Mixed({right_key: want[0].token_ids}, {wrong_key})
    k_max = 3
    done, steps, engine = _per_step(_engine(SpeculativeConfig(num_tokens=k_max, row_cost=0.3), proposer), jobs,
                                    proposer)
    assert [c.token_ids for c in done] == [c.token_ids for c in want]
    right = [s[right_key] for s in steps if right_key in s]
    cap = [min(k_max, 120 - n - 1) for n in range(1, 121)]
    assert right and all(k == k_max for k in right[:-1]) and right[-1] in cap  # always the most
    wrong = [(i, s[wrong_key]) for i, s in enumerate(steps) if wrong_key in s]
    assert sum(k for _, k in wrong) < len(steps) // 4  # the other request fell back to probes meanwhile
    assert engine.speculator is not None and engine.speculator.cost == CostModel(0.3)


def test_the_row_cost_is_measured_when_not_given() -> None:
    engine = _engine(SpeculativeConfig(num_tokens=3))()
    cost = engine.speculative_cost
    assert cost is not None and math.isfinite(cost.row_cost) and cost.row_cost >= 0
    assert _engine(SpeculativeConfig(adaptive=False))().speculative_cost is None


def test_row_cost_tracker_fits_the_step_times() -> None:
    # the docstring's example, then a line through three row counts with noise: ρ = b / (a + b) of t = a + b·n
    tr = RowCostTracker()
    for _ in range(3):
        assert tr.observe(1, 0.010) is None  # one row count only
    for _ in range(2):
        assert tr.observe(2, 0.013) is None  # weight below ROW_COST_MIN_WEIGHT (decayed: 1, 1.95)
    assert 1 + 0.95 < ROW_COST_MIN_WEIGHT <= 1 + 0.95 + 0.95 ** 2
    assert tr.observe(2, 0.013) == pytest.approx(0.3)
    tr, rng = RowCostTracker(), random.Random(5)
    for _ in range(300):
        n = rng.choice([1, 2, 4])
        tr.observe(n, (0.02 + 0.005 * n) * (1 + rng.uniform(-0.01, 0.01)))
    assert tr.row_cost() == pytest.approx(0.005 / 0.025, rel=0.05)
    with pytest.raises(ValueError, match="finite seconds"):
        tr.observe(1, float("nan"))


def test_a_measured_row_cost_follows_the_running_steps() -> None:
    # measured at start (row_cost None): the engine feeds each decode-only step's time to the tracker, and a
    # fixed row_cost is left alone
    measured = _engine(SpeculativeConfig(num_tokens=3))()
    fixed = _engine(SpeculativeConfig(num_tokens=3, row_cost=0.25))()
    jobs = [([1, 2, 3, 4, 5, 6], SamplingParams(max_new_tokens=40))]
    for engine in (measured, fixed):
        engine.generate(jobs)
    seen = measured.speculator._tracker._weight  # type: ignore[union-attr]
    assert sum(seen.values()) > 10 and len(seen) >= 2, seen
    assert fixed.speculator._tracker is None and fixed.speculative_cost == CostModel(0.25)  # type: ignore[union-attr]
    rho = measured.speculator._tracker.row_cost()  # type: ignore[union-attr]
    assert rho is None or measured.speculative_cost == CostModel(rho)
