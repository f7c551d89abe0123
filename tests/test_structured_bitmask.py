"""The grammar bitmask applied to logits (mistral_kernels/structured/bitmask.py), checked against masks and
distributions the test computes itself: disallowed tokens are never sampled, the allowed ones keep their
renormalised probabilities (softmax over the allowed logits only), greedy picks the best allowed token,
unconstrained rows are untouched."""

from __future__ import annotations

import pytest
import torch

from mistral_kernels.sampling import SamplingParams, sample
from mistral_kernels.structured.bitmask import MaskWorkspace, apply_bitmask


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [R, V] → the int32 [R, ceil(V/32)] bitmask (bit t % 32 of word t // 32), built bit by bit."""
    r, v = allowed.shape
    w = (v + 31) // 32
    words = [[0] * w for _ in range(r)]
    for i in range(r):
        for t in range(v):
            if allowed[i, t]:
                words[i][t // 32] |= 1 << (t % 32)
    signed = [[x - (1 << 32) if x >= 1 << 31 else x for x in row] for row in words]
    return torch.tensor(signed, dtype=torch.int32)


def _random_case(rows: int, v: int, seed: int, keep: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, v, generator=g) * 2
    allowed = torch.rand(rows, v, generator=g) < keep
    allowed[:, 0] = True  # never an empty row
    return logits, allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the numpy path (fp32 CPU) and torch's
def test_masked_tokens_become_minus_inf_and_the_rest_is_unchanged(dtype: torch.dtype) -> None:
    logits, allowed = _random_case(5, 100, seed=1)  # V = 100: the last word is partial
    logits = logits.to(dtype)
    before = logits.clone()
    out = apply_bitmask(logits, _pack(allowed))
    assert torch.equal(logits, before)  # the raw logits are left as they were (logprobs read them)
    assert out.dtype == dtype
    assert torch.equal(out[allowed], logits[allowed])
    assert bool((out[~allowed] == float("-inf")).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the numpy path (fp32 CPU) and torch's
def test_only_the_listed_rows_are_constrained(dtype: torch.dtype) -> None:
    logits, allowed = _random_case(6, 70, seed=2)
    logits = logits.to(dtype)
    rows = torch.tensor([4, 1])
    out = apply_bitmask(logits, _pack(allowed[[4, 1]]), rows)
    for i in (0, 2, 3, 5):
        assert torch.equal(out[i], logits[i])
    for j, i in enumerate([4, 1]):
        want = logits[i].masked_fill(~allowed[[4, 1]][j], float("-inf"))
        assert torch.equal(out[i], want)


def test_a_reused_workspace_gives_the_fresh_results() -> None:
    ws = MaskWorkspace()
    for seed, (n, v, rows) in enumerate([(4, 100, None), (6, 64, [5, 0]), (2, 33, None), (7, 200, [3])]):
        logits, allowed = _random_case(n, v, seed=10 + seed)
        idx = torch.tensor(rows) if rows is not None else None
        bm = _pack(allowed if rows is None else allowed[rows])
        want = apply_bitmask(logits, bm, idx)
        assert torch.equal(apply_bitmask(logits, bm, idx, workspace=ws), want)


def test_bad_bitmask_shapes_are_refused() -> None:
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match=r"int32 \[2, 2\]"):
        apply_bitmask(logits, torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask(logits, torch.zeros(2, 2, dtype=torch.int64))


def test_greedy_picks_the_best_allowed_token() -> None:
    logits, allowed = _random_case(8, 300, seed=3, keep=0.05)
    out = apply_bitmask(logits, _pack(allowed))
    got = sample(out, [SamplingParams()] * 8, [None] * 8)
    for i in range(8):
        best = max((t for t in range(300) if allowed[i, t]), key=lambda t: float(logits[i, t]))
        assert int(got[i]) == best


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs`` (cells with expectation < 5 pooled);
    the chi-square survival function is the regularised upper incomplete gamma Q(k/2, x/2)."""
    n = int(counts.sum())
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    exp = torch.cat([expected[big].double(), expected[~big].double().sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_distribution_is_the_renormalised_allowed_softmax(temperature: float) -> None:
    v, draws = 60, 20000
    logits, allowed = _random_case(3, v, seed=4, keep=0.4)
    masked = apply_bitmask(logits, _pack(allowed))
    # Reference: softmax over the allowed tokens only, computed here from the logits and the bool mask.
    want = []
    for i in range(3):
        z = torch.tensor([float(logits[i, t]) / temperature if allowed[i, t] else float("-inf") for t in range(v)],
                         dtype=torch.float64)
        want.append(torch.softmax(z, dim=0))
    gen = torch.Generator().manual_seed(123)
    rows = masked.repeat_interleave(draws, dim=0)  # [3 * draws, V]: one draw per row
    got = sample(rows, [SamplingParams(temperature=temperature)] * rows.shape[0], [gen] * rows.shape[0])
    for i in range(3):
        ids = got[i * draws:(i + 1) * draws]
        counts = torch.bincount(ids, minlength=v)
        assert int(counts[~allowed[i]].sum()) == 0, "a disallowed token was sampled"
        p = _chi_square_p(counts, want[i])
        assert p > 1e-4, f"row {i}: chi-square p = {p:.2e}"
        tv = 0.5 * float((counts.double() / draws - want[i]).abs().sum())
        assert tv < 0.03, f"row {i}: total variation {tv:.3f}"
