"""Helpers of tests/test_opcheck.py that other tests share."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mistral_kernels import ops, reference as ref


def _norm_cases() -> list[tuple[str, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g)
    w = torch.randn(64, generator=g)
    q, k = torch.randn(4, 4, 64, generator=g), torch.randn(4, 2, 64, generator=g)
    cache = ops.rope_cos_sin_cache(16, 64, 1e4)
    pos = torch.tensor([0, 3, 7, 15])
    return [
        ("rms_norm", lambda: (torch.empty_like(x), x, w, 1e-5)),
        ("fused_add_rms_norm", lambda: (x.clone(), x.clone() * 2, w, 1e-5)),
        ("silu_and_mul", lambda: (torch.empty(3, 32), x)),
        ("rotary_embedding", lambda: (pos, q.clone(), k.clone(), cache, True)),
    ]


def _moe_cases() -> list[tuple[str, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(0)
    t, h, i, e, k = 5, 16, 24, 8, 2
    x, logits = torch.randn(t, h, generator=g), torch.randn(t, e, generator=g)
    ids = torch.rand(t, e, generator=g).topk(k, dim=-1).indices.to(torch.int32)
    inv = ref.moe_permute(x, ids, e)[2]
    ws = [torch.randn(e, i, h, generator=g) * 0.2, torch.randn(e, h, i, generator=g) * 0.2,
          torch.randn(e, i, h, generator=g) * 0.2]
    return [
        ("topk_softmax", lambda: (torch.empty(t, k), torch.empty(t, k, dtype=torch.int32), logits, True)),
        ("moe_permute", lambda: (torch.empty(t * k, h), torch.empty(e + 1, dtype=torch.int64),
                                 torch.empty(t, k, dtype=torch.int32), x, ids)),
        ("moe_unpermute", lambda: (torch.empty(t, h), torch.randn(t * k, h, generator=g), torch.rand(t, k), inv)),
        ("fused_moe", lambda: (torch.empty(t, h), x, torch.randn(e, h, generator=g), *ws, k, True)),
    ]


def _attention_cases() -> list[tuple[str, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(0)
    n_blocks, s, hkv, d, hq = 6, 8, 1, 64, 2
    kc, vc = torch.randn(n_blocks, s, hkv, d, generator=g), torch.randn(n_blocks, s, hkv, d, generator=g)
    tables = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    lens = torch.tensor([19, 9], dtype=torch.int32)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    return [
        ("reshape_and_cache", lambda: (torch.randn(3, hkv, d, generator=g), torch.randn(3, hkv, d, generator=g),
                                       kc.clone(), vc.clone(), torch.tensor([5, -1, 47]))),
        ("paged_decode_attention", lambda: (torch.empty(2, hq, d), torch.randn(2, hq, d, generator=g), kc, vc,
                                            tables, lens, 0.125, 0, 0)),
        ("paged_prefill_attention", lambda: (torch.empty(4, hq, d), torch.randn(4, hq, d, generator=g), kc, vc,
                                             tables, cu, lens, 0.125, 5)),
    ]


def _expert_ffn_cases() -> list[tuple[str, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 16, generator=g)
    w1, w3, w2 = torch.randn(2, 8, 16, generator=g), torch.randn(2, 8, 16, generator=g), torch.randn(2, 16, 8, generator=g)
    return [("moe_expert_ffn", lambda: (torch.empty_like(x), x, torch.tensor([0, 2, 4, 6]), w1, w2, w3))]


def _linear_cases() -> list[tuple[str, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 24, generator=g), torch.randn(10, 24, generator=g)
    return [("skinny_linear", lambda: (torch.empty(3, 10), x, w))]


def _quant_cases() -> list[tuple[str, Callable[[], tuple]]]:
    from .quant_data import random_qweight

    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    qweight, _ = random_qweight("Q4_0", 10, 64, seed=4)
    return [("qlinear", lambda: (torch.empty(3, 10), x, qweight, None, 2))]


def _moe_quant_cases() -> list[tuple[str, Callable[[], tuple]]]:
    from .quant_data import random_qweight

    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(5))
    w1 = torch.stack([random_qweight("Q8_0", 6, 64, seed=s)[0] for s in (1, 2)])
    w3 = torch.stack([random_qweight("Q8_0", 6, 64, seed=s)[0] for s in (3, 4)])
    offsets = torch.tensor([0, 2, 5])
    return [("moe_qgemm", lambda: (torch.empty(5, 6), x, offsets, w1, None, 8, w3, None))]



def _decode_layers_cases() -> list[tuple[str, Callable[[], tuple]]]:
    g = torch.Generator().manual_seed(4)
    h, hq, hkv, d, i, n, s, layers = 16, 2, 1, 8, 12, 4, 4, 2

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    def args() -> tuple:
        per = [[rnd(h) + 1 for _ in range(layers)], [rnd((hq + 2 * hkv) * d, h) for _ in range(layers)],
               [rnd(h, hq * d) for _ in range(layers)], [rnd(h) + 1 for _ in range(layers)],
               [rnd(2 * i, h) for _ in range(layers)], [rnd(h, i) for _ in range(layers)],
               [rnd(n, s, hkv, d) for _ in range(layers)], [rnd(n, s, hkv, d) for _ in range(layers)]]
        cos_sin = torch.cat([torch.ones(8, d // 2), torch.zeros(8, d // 2)], 1)
        return (rnd(2, h), rnd(2, h), *per, [0, 3], torch.tensor([5, 0]), torch.tensor([9, -1]),
                torch.tensor([[3, 2], [0, 0]], dtype=torch.int32), torch.tensor([6, 0], dtype=torch.int32),
                cos_sin, hq, 1e-5, d ** -0.5, True, [], [])

    def packed_args() -> tuple:  # one layer: qkv = Q4_0 rows | Q8_0 rows, wo INT8_ROWWISE, w13 dense, w2 Q4_1
        from .quant_data import random_qweight

        hp, ip = 32, 32
        qa, _ = random_qweight("Q4_0", (hq + hkv) * d, hp, seed=5)
        qb, _ = random_qweight("Q8_0", hkv * d, hp, seed=6)
        qo, so = random_qweight("INT8_ROWWISE", hp, hq * d, seed=7)
        q2, _ = random_qweight("Q4_1", hp, ip, seed=8)
        cos_sin = torch.cat([torch.ones(8, d // 2), torch.zeros(8, d // 2)], 1)
        return (rnd(2, hp), rnd(2, hp), [rnd(hp) + 1], [qa, qb], [qo], [rnd(hp) + 1], [rnd(2 * ip, hp)], [q2],
                [rnd(n, s, hkv, d)], [rnd(n, s, hkv, d)], [0], torch.tensor([5, 0]), torch.tensor([9, -1]),
                torch.tensor([[3, 2], [0, 0]], dtype=torch.int32), torch.tensor([6, 0], dtype=torch.int32),
                cos_sin, hq, 1e-5, d ** -0.5, True, [2, 8, 1000, -1, 3], [None, None, so, None, None])

    return [("decode_layers", args), ("decode_layers", packed_args)]



CASES = (
    _norm_cases() + _moe_cases() + _attention_cases() + _expert_ffn_cases() + _linear_cases() + _quant_cases()
    + _moe_quant_cases()
    + _decode_layers_cases()
)
