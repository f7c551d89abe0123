"""fused_moe against transformers' MixtralSparseMoeBlock with the same random weights.

transformers stores the experts stacked: ``experts.gate_up_proj`` [E, 2I, H] = cat(w1, w3) along dim 1 and
``experts.down_proj`` [E, H, I] = w2; the router is ``gate.weight`` [E, H]. It routes softmax → top-k →
renormalise in fp32 like we do (DESIGN §6).

torch.topk breaks exact ties in an unspecified order while we pick the lower expert id. bf16 router logits
tie often (8-bit mantissa), so a token whose k-th and (k+1)-th probabilities are equal has two valid
routings: those tokens are compared with reference.py (lower id) instead, and counted.

Shape letters: T tokens, H hidden, I intermediate, E experts, k top-k.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

from mistral_kernels import reference as ref

from .conftest import Backend, _make_backend, assert_close

H, I = 64, 96


@pytest.fixture(params=["cpu", "cuda"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return _make_backend(request.param, monkeypatch)


def _block(e: int, k: int, dtype: torch.dtype, seed: int) -> tuple[MixtralSparseMoeBlock, tuple[torch.Tensor, ...]]:
    config = MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=e, num_experts_per_tok=k,
                           router_jitter_noise=0.0, experts_implementation="eager")
    block = MixtralSparseMoeBlock(config).eval()
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(e, H, generator=g) / H**0.5
    w1, w3 = torch.randn(e, I, H, generator=g) / H**0.5, torch.randn(e, I, H, generator=g) / H**0.5
    w2 = torch.randn(e, H, I, generator=g) / I**0.5
    with torch.no_grad():
        block.gate.weight.copy_(gate)
        block.experts.gate_up_proj.copy_(torch.cat([w1, w3], dim=1))
        block.experts.down_proj.copy_(w2)
    block = block.to(dtype)
    return block, tuple(w.to(dtype) for w in (gate, w1, w2, w3))


def _boundary_ties(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[T] bool: the k-th and (k+1)-th router probabilities are equal (two valid routings)."""
    if k == logits.shape[1]:
        return torch.zeros(logits.shape[0], dtype=torch.bool)
    top = torch.softmax(logits.float(), dim=-1).topk(k + 1, dim=-1).values
    return top[:, k - 1] == top[:, k]


@pytest.mark.parametrize("t", [1, 7, 300])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_matches_transformers(native: Backend, t: int, e: int, k: int, dtype: torch.dtype) -> None:
    block, (gate, w1, w2, w3) = _block(e, k, dtype, seed=t + e)
    x = torch.randn(1, t, H, generator=torch.Generator().manual_seed(t)).to(dtype)
    with torch.no_grad():
        expect = block(x)[0]
        logits = block.gate(x[0])[0]
    dev = native.device
    out = native.ops.fused_moe(x[0].to(dev), gate.to(dev), w1.to(dev), w2.to(dev), w3.to(dev), top_k=k).cpu()
    tied = _boundary_ties(logits, k)
    if dtype == torch.float32:
        assert not bool(tied.any())  # fp32 logits of random data do not tie
        assert_close(out, expect, atol=1e-5, rtol=1e-5)
        return
    # bf16: transformers accumulates the k expert outputs in bf16 (index_add_), we in fp32 — bf16 tolerance.
    keep = ~tied
    assert int(keep.sum()) >= t // 2, f"{int(tied.sum())} of {t} tokens tie: inputs do not test routing"
    assert_close(out[keep], expect[keep])
    if bool(tied.any()):
        lower_id = ref.fused_moe(x[0], gate, w1, w2, w3, top_k=k)
        assert_close(out[tied], lower_id[tied])
