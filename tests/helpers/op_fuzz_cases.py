"""Op-level fuzz cases: one valid call per raw op schema (csrc/registration.cpp), then single
mutations of it — a wrong size on each dimension of each tensor argument, another dtype, None, a
non-contiguous / stride-0 layout, a written argument aliasing another one — each judged by one oracle:

  * the op raises RuntimeError / ValueError / TypeError whose message names the op (a clear user error), or
  * the op succeeds, the reference (mistral_kernels.reference) accepts the same inputs, and every tensor
    the op writes matches it (NaN where the reference has NaN).

Anything else fails: a crash (the cases run in a subprocess, tests/test_op_fuzz.py), an unclear exception,
"UNKNOWN_SCALAR", or an op that accepts inputs the reference rejects (garbage output).

Run as ``python -m tests.helpers.op_fuzz_cases <namespace> <first> <last>``: prints ``START i`` before and one
``RESULT i <json>`` line after each case, so a crash names its case.

List arguments (decode_layers' per-layer lists) get their own mutations: a list shorter, longer or empty,
each entry resized / retyped / strided / aliased, packed format codes and scales, out-of-range indices.

Shape letters: T tokens, B sequences, Hq / Hkv heads, D head_dim, N blocks, S block_size, M max_blocks,
H hidden, I intermediate, E experts, k top-k, P max positions, R rot_dim, L layers.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mistral_kernels import reference as ref

SEED = 22


@dataclass
class Call:
    """One raw op call: its arguments in schema order, the ones it writes, the reference of those."""

    op: str
    args: dict[str, Any]
    written: tuple[str, ...]
    expected: Callable[[dict[str, Any]], dict[str, torch.Tensor]]


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _norm_calls(g: torch.Generator) -> Iterator[Call]:
    T, H, I = 3, 8, 4
    yield Call("rms_norm", {"out": torch.empty(T, H), "x": _randn(g, T, H), "weight": _randn(g, H), "eps": 1e-5},
               ("out",), lambda a: {"out": ref.rms_norm(a["x"], a["weight"], a["eps"])})

    def fused(a: dict[str, Any]) -> dict[str, torch.Tensor]:
        x, r = a["x"].clone(), a["residual"].clone()
        ref.fused_add_rms_norm(x, r, a["weight"], a["eps"])
        return {"x": x, "residual": r}

    yield Call("fused_add_rms_norm", {"x": _randn(g, T, H), "residual": _randn(g, T, H), "weight": _randn(g, H),
                                      "eps": 1e-5}, ("x", "residual"), fused)
    yield Call("silu_and_mul", {"out": torch.empty(T, I), "x": _randn(g, T, 2 * I)}, ("out",),
               lambda a: {"out": ref.silu_and_mul(a["x"])})


def _rope_call(g: torch.Generator) -> Call:
    T, Hq, Hkv, D, P = 3, 4, 2, 8, 16

    def expected(a: dict[str, Any]) -> dict[str, torch.Tensor]:
        q, k = a["q"].clone(), a["k"].clone()
        ref.rotary_embedding(a["positions"], q, k, a["cos_sin_cache"], a["is_neox"])
        return {"q": q, "k": k}

    return Call("rotary_embedding", {"positions": torch.tensor([0, 5, 15]), "q": _randn(g, T, Hq, D),
                                     "k": _randn(g, T, Hkv, D), "cos_sin_cache": ref.rope_cos_sin_cache(P, D, 1e4),
                                     "is_neox": True}, ("q", "k"), expected)


def _rope_cache_call(g: torch.Generator) -> Call:
    T, Hq, Hkv, D, P, N, S = 3, 4, 2, 8, 16, 3, 4

    def expected(a: dict[str, Any]) -> dict[str, torch.Tensor]:
        q, k = a["q"].clone(), a["k"].clone()
        k_cache, v_cache = a["k_cache"].clone(), a["v_cache"].clone()
        ref.rotary_embedding_and_cache(a["positions"], q, k, a["v"], a["cos_sin_cache"], a["is_neox"], k_cache,
                                       v_cache, a["slot_mapping"])
        return {"q": q, "k": k, "k_cache": k_cache, "v_cache": v_cache}

    return Call("rotary_embedding_and_cache",
                {"positions": torch.tensor([0, 5, 15]), "q": _randn(g, T, Hq, D), "k": _randn(g, T, Hkv, D),
                 "v": _randn(g, T, Hkv, D), "cos_sin_cache": ref.rope_cos_sin_cache(P, D, 1e4), "is_neox": True,
                 "k_cache": _randn(g, N, S, Hkv, D), "v_cache": _randn(g, N, S, Hkv, D),
                 "slot_mapping": torch.tensor([7, -1, 0])},
                ("q", "k", "k_cache", "v_cache"), expected)


def _attention_calls(g: torch.Generator) -> Iterator[Call]:
    N, S, Hq, Hkv, D, B, M = 6, 4, 4, 2, 64, 2, 3
    kc, vc = _randn(g, N, S, Hkv, D), _randn(g, N, S, Hkv, D)
    tables = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    lens = torch.tensor([7, 12], dtype=torch.int32)

    def cache_expected(a: dict[str, Any]) -> dict[str, torch.Tensor]:
        k_cache, v_cache = a["k_cache"].clone(), a["v_cache"].clone()
        ref.reshape_and_cache(a["k"], a["v"], k_cache, v_cache, a["slot_mapping"])
        return {"k_cache": k_cache, "v_cache": v_cache}

    yield Call("reshape_and_cache", {"k": _randn(g, 3, Hkv, D), "v": _randn(g, 3, Hkv, D), "k_cache": kc.clone(),
                                     "v_cache": vc.clone(), "slot_mapping": torch.tensor([5, -1, 17])},
               ("k_cache", "v_cache"), cache_expected)

    def window(a: dict[str, Any]) -> int | None:
        return a["sliding_window"] if a["sliding_window"] > 0 else None

    yield Call("paged_decode_attention",
               {"out": torch.empty(B, Hq, D), "q": _randn(g, B, Hq, D), "k_cache": kc, "v_cache": vc,
                "block_tables": tables, "seq_lens": lens, "scale": D ** -0.5, "sliding_window": 5,
                "partition_size": 4},
               ("out",), lambda a: {"out": ref.paged_decode_attention(
                   a["q"], a["k_cache"], a["v_cache"], a["block_tables"], a["seq_lens"], a["scale"], window(a))})
    yield Call("paged_prefill_attention",
               {"out": torch.empty(5, Hq, D), "q": _randn(g, 5, Hq, D), "k_cache": kc, "v_cache": vc,
                "block_tables": tables, "cu_seqlens_q": torch.tensor([0, 2, 5], dtype=torch.int32),
                "seq_lens": lens, "scale": D ** -0.5, "sliding_window": 0},
               ("out",), lambda a: {"out": ref.paged_prefill_attention(
                   a["q"], a["k_cache"], a["v_cache"], a["block_tables"], a["cu_seqlens_q"], a["seq_lens"],
                   a["scale"], window(a))})


def _moe_calls(g: torch.Generator) -> Iterator[Call]:
    T, H, I, E, k = 3, 8, 4, 4, 2

    def topk(a: dict[str, Any]) -> dict[str, torch.Tensor]:
        w, ids = ref.topk_softmax(a["gating_logits"], a["topk_weights"].shape[1], a["renormalize"])
        return {"topk_weights": w, "topk_ids": ids}

    yield Call("topk_softmax", {"topk_weights": torch.empty(T, k), "topk_ids": torch.empty(T, k, dtype=torch.int32),
                                "gating_logits": _randn(g, T, E), "renormalize": True},
               ("topk_weights", "topk_ids"), topk)
    ids = torch.tensor([[0, 3], [3, 1], [0, 1]], dtype=torch.int32)

    def permute(a: dict[str, Any]) -> dict[str, torch.Tensor]:
        p, o, inv = ref.moe_permute(a["x"], a["topk_ids"], a["expert_offsets"].shape[0] - 1)
        return {"permuted_x": p, "expert_offsets": o, "inv_perm": inv}

    yield Call("moe_permute", {"permuted_x": torch.empty(T * k, H), "expert_offsets": torch.empty(E + 1, dtype=torch.long),
                               "inv_perm": torch.empty(T, k, dtype=torch.int32), "x": _randn(g, T, H), "topk_ids": ids},
               ("permuted_x", "expert_offsets", "inv_perm"), permute)
    inv = torch.tensor([[0, 4], [5, 2], [1, 3]], dtype=torch.int32)
    yield Call("moe_unpermute", {"out": torch.empty(T, H), "expert_out": _randn(g, T * k, H),
                                 "topk_weights": torch.rand(T, k, generator=g), "inv_perm": inv},
               ("out",), lambda a: {"out": ref.moe_unpermute(a["expert_out"], a["topk_weights"], a["inv_perm"])})
    w1, w3, w2 = _randn(g, E, I, H) * 0.3, _randn(g, E, I, H) * 0.3, _randn(g, E, H, I) * 0.3
    yield Call("fused_moe", {"out": torch.empty(T, H), "x": _randn(g, T, H), "gate_weight": _randn(g, E, H),
                             "w1": w1, "w2": w2, "w3": w3, "top_k": k, "renormalize": True},
               ("out",), lambda a: {"out": ref.fused_moe(a["x"], a["gate_weight"], a["w1"], a["w2"], a["w3"],
                                                         a["top_k"], a["renormalize"])})
    yield Call("moe_expert_ffn", {"out": torch.empty(T * k, H), "permuted_x": _randn(g, T * k, H),
                                  "expert_offsets": torch.tensor([0, 2, 2, 5, 6]), "w1": w1, "w2": w2, "w3": w3},
               ("out",), lambda a: {"out": ref.moe_expert_ffn(a["permuted_x"], a["expert_offsets"], a["w1"], a["w2"],
                                                              a["w3"])})


def _linear_call(g: torch.Generator) -> Call:
    return Call("skinny_linear", {"out": torch.empty(2, 5), "x": _randn(g, 2, 8), "weight": _randn(g, 5, 8)},
                ("out",), lambda a: {"out": ref.linear(a["x"], a["weight"])})


def _qlinear_call(g: torch.Generator) -> Call:
    from .quant_data import random_qweight

    qweight, _ = random_qweight("Q4_0", 5, 64, seed=SEED)
    return Call("qlinear", {"out": torch.empty(2, 5), "x": _randn(g, 2, 64), "qweight": qweight, "scales": None,
                            "qtype": 2},
                ("out",), lambda a: {"out": ref.qlinear(a["x"], a["qweight"], a["qtype"], a["scales"])})


# INT8_ROWWISE weights with non-finite scales (docs/design.md §3, NaN / Inf semantics): every backend gives the
# product of the dequantized weight W[n, k] = q[n, k] · s[n], so a row with an Inf scale is NaN where it meets a
# 0 (q = 0 or x = 0: 0 · Inf) or terms of both signs, ±Inf only where every term has the same sign; a NaN scale
# is NaN. Rows: 0 +Inf, 1 -Inf, 2 NaN, 3 +Inf over codes all 1 (x row 0 positive: +Inf there), 4 finite.
# M = 2 runs the decode GEMV, M = 20 the prefill (dequantized tile) path; K = 40 a vector tail.
def _nonfinite_int8(g: torch.Generator, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    q[0, 3] = 0
    q[3] = 1
    scales = torch.rand(n, generator=g) * 0.02 + 1e-3
    scales[:4] = torch.tensor([math.inf, -math.inf, math.nan, math.inf])
    return q, scales


def _nonfinite_x(g: torch.Generator, m: int, k: int) -> torch.Tensor:
    x = _randn(g, m, k)
    x[0] = x[0].abs() + 0.1
    return x


def _nonfinite_scale_calls(g: torch.Generator) -> Iterator[tuple[str, Call]]:
    N, K, G = 5, 40, 2
    for M in (2, 20):
        q, scales = _nonfinite_int8(g, N, K)
        yield f"Inf / NaN scales, M={M}", Call(
            "qlinear", {"out": torch.empty(M, N), "x": _nonfinite_x(g, M, K), "qweight": q, "scales": scales,
                        "qtype": 1000},
            ("out",), lambda a: {"out": ref.qlinear(a["x"], a["qweight"], a["qtype"], a["scales"])})
        qs = [_nonfinite_int8(g, N, K) for _ in range(2 * G)]
        qw, sc = torch.stack([t[0] for t in qs[:G]]), torch.stack([t[1] for t in qs[:G]])
        uq, us = torch.stack([t[0] for t in qs[G:]]), torch.stack([t[1] for t in qs[G:]])
        offsets = torch.tensor([0, M // 2, M])
        for gated in (False, True):
            yield f"Inf / NaN scales, M={M}{', gated' if gated else ''}", Call(
                "moe_qgemm", {"out": torch.empty(M, N), "x": _nonfinite_x(g, M, K), "expert_offsets": offsets,
                              "qweight": qw, "scales": sc, "qtype": 1000, "up_qweight": uq if gated else None,
                              "up_scales": us if gated else None},
                ("out",), lambda a: {"out": ref.moe_qgemm(a["x"], a["expert_offsets"], a["qweight"], a["qtype"],
                                                          a["scales"], a["up_qweight"], a["up_scales"])})


# decode_layers (CPU only): L = 2 layers, M = 2 rows; H = I = 32 and Hq·D = 32 so every matrix's K is a whole
# number of 32-element blocks (the packed call). Rows 0 / 1 decode positions 5 / 9 (block tables below, S = 4).
_DL = {"L": 2, "M": 2, "H": 32, "I": 32, "Hq": 2, "Hkv": 1, "D": 16, "N": 6, "S": 4, "P": 16}
_DENSE = -1  # decode_layers' qtypes entry of a dense part
_MATRICES = ("qkv", "wo", "w13", "w2")


def _dl_shapes() -> dict[str, tuple[int, int]]:
    d = _DL
    return {"qkv": ((d["Hq"] + 2 * d["Hkv"]) * d["D"], d["H"]), "wo": (d["H"], d["Hq"] * d["D"]),
            "w13": (2 * d["I"], d["H"]), "w2": (d["H"], d["I"])}


def _dl_matrices(a: dict[str, Any]) -> dict[str, list[object]]:
    """The per-layer matrices of a decode_layers call's flat part lists (rows of a layer's parts sum to its N),
    as the reference takes them; raises when the parts do not make whole matrices."""
    from mistral_kernels.quant_weight import FusedWeight, QuantizedWeight

    out: dict[str, list[object]] = {}
    g = 0
    for name in _MATRICES:
        n, k = _dl_shapes()[name]
        parts, layers = list(a[name]), []
        for _ in range(len(a["attn_norm"])):
            rows, groups = 0, []
            while rows < n:
                t = parts.pop(0)
                qt = a["qtypes"][g] if a["qtypes"] else _DENSE
                sc = a["scales"][g] if a["scales"] else None
                g += 1
                groups.append(t if qt == _DENSE else QuantizedWeight(t, qt, (t.shape[0], k), sc))
                rows += t.shape[0]
            if rows != n or (len(groups) > 1 and any(isinstance(x, torch.Tensor) for x in groups)):
                raise ValueError(f"{name}: parts do not make a [{n}, {k}] matrix")
            layers.append(groups[0] if len(groups) == 1 else FusedWeight(tuple(groups)))
        if parts:
            raise ValueError(f"{name}: {len(parts)} parts left over")
        out[name] = layers
    return out


def _dl_expected(a: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The reference on ``a`` in place (``a`` is the judge's fresh copy, aliasing kept as in the call)."""
    x, residual, kc, vc = a["x"], a["residual"], a["k_cache"], a["v_cache"]
    m = _dl_matrices(a)
    if not (len(a["ffn_norm"]) == len(kc) == len(vc) == len(a["windows"]) == len(a["attn_norm"])):
        raise ValueError("layer lists differ in length")
    ref.decode_layers(x, residual, a["attn_norm"], m["qkv"], m["wo"], a["ffn_norm"], m["w13"], m["w2"], kc, vc,
                      a["windows"], a["positions"], a["slot_mapping"], a["block_tables"], a["seq_lens"], a["cos_sin"],
                      a["n_heads"], a["eps"], a["scale"], a["is_neox"])
    return {"x": x, "residual": residual, **{f"k_cache.{i}": t for i, t in enumerate(kc)},
            **{f"v_cache.{i}": t for i, t in enumerate(vc)}}


def _decode_layers_calls(g: torch.Generator) -> Iterator[Call]:
    from .quant_data import random_qweight

    d, shapes = _DL, _dl_shapes()
    L = d["L"]

    def common() -> dict[str, Any]:
        return {"attn_norm": [1 + 0.1 * _randn(g, d["H"]) for _ in range(L)],
                "ffn_norm": [1 + 0.1 * _randn(g, d["H"]) for _ in range(L)],
                "k_cache": [_randn(g, d["N"], d["S"], d["Hkv"], d["D"]) for _ in range(L)],
                "v_cache": [_randn(g, d["N"], d["S"], d["Hkv"], d["D"]) for _ in range(L)],
                "windows": [0, 3], "positions": torch.tensor([5, 9]), "slot_mapping": torch.tensor([5, 13]),
                "block_tables": torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32),
                "seq_lens": torch.tensor([6, 10], dtype=torch.int32),
                "cos_sin": ref.rope_cos_sin_cache(d["P"], d["D"], 1e4), "n_heads": d["Hq"], "eps": 1e-5,
                "scale": d["D"] ** -0.5, "is_neox": True}

    def args(mats: dict[str, list[torch.Tensor]], qtypes: list[int], scales: list[torch.Tensor | None],
             c: dict[str, Any]) -> dict[str, Any]:  # schema order
        return {"x": _randn(g, d["M"], d["H"]), "residual": _randn(g, d["M"], d["H"]), "attn_norm": c["attn_norm"],
                "qkv": mats["qkv"], "wo": mats["wo"], "ffn_norm": c["ffn_norm"], "w13": mats["w13"],
                "w2": mats["w2"], **{k: c[k] for k in ("k_cache", "v_cache", "windows", "positions", "slot_mapping",
                                                         "block_tables", "seq_lens", "cos_sin", "n_heads", "eps",
                                                         "scale", "is_neox")},
                "qtypes": qtypes, "scales": scales}

    written = ("x", "residual")
    dense = {name: [0.2 * _randn(g, *shapes[name]) for _ in range(L)] for name in _MATRICES}
    yield Call("decode_layers", args(dense, [], [], common()), written, _dl_expected)
    # packed: qkv of two row groups (Q4_0 | Q8_0, as a Q4_K_M file mixes formats), wo INT8_ROWWISE, w13 Q4_K
    # needs K = 256: Q8_0 instead; w2 dense in layer 0 and Q4_0 in layer 1
    codes = {"Q4_0": 2, "Q8_0": 8, "INT8_ROWWISE": 1000}
    mats: dict[str, list[torch.Tensor]] = {name: [] for name in _MATRICES}
    qtypes: list[int] = []
    scales: list[torch.Tensor | None] = []
    layout = {"qkv": [[("Q4_0", 32), ("Q8_0", 32)]] * L, "wo": [[("INT8_ROWWISE", 32)]] * L,
              "w13": [[("Q8_0", 64)]] * L, "w2": [[("dense", 32)], [("Q4_0", 32)]]}
    seed = SEED
    for name in _MATRICES:
        for groups in layout[name]:
            for fmt, rows in groups:
                seed += 1
                if fmt == "dense":
                    mats[name].append(0.2 * _randn(g, rows, shapes[name][1]))
                    qtypes.append(_DENSE)
                    scales.append(None)
                    continue
                q, sc = random_qweight(fmt, rows, shapes[name][1], seed=seed)
                mats[name].append(q)
                qtypes.append(codes[fmt])
                scales.append(sc)
    yield Call("decode_layers", args(mats, qtypes, scales, common()), written, _dl_expected)


def valid_calls(namespace: str) -> list[Call]:
    g = torch.Generator().manual_seed(SEED)
    calls = [*_norm_calls(g), _rope_call(g), _rope_cache_call(g), *_attention_calls(g), *_moe_calls(g)]
    if namespace == "mistral_kernels":
        calls.append(_linear_call(g))  # CPU-only schema
        calls.append(_qlinear_call(g))  # the emulated qlinear is a separate piece of work (CUDA kernels)
        calls.extend(_decode_layers_calls(g))  # CPU-only schema
    return calls


# ---- mutations -------------------------------------------------------------------------------------------


# RoPE tables [P, R] (cos in the first half, sin in the second): a resized one keeps being a table — random
# values would make the "rotation" scale q and k, and the op vs reference differences then grow with the scaled
# terms rather than the result (ill-conditioned cases that say nothing about the kernels).
_ROPE_TABLES = ("cos_sin", "cos_sin_cache")


def _resized(t: torch.Tensor, dim: int, size: int, g: torch.Generator, name: str = "") -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
    if name in _ROPE_TABLES and dim == 0 and t.dim() == 2:
        return ref.rope_cos_sin_cache(size, t.shape[1], 1e4)
    if t.dtype.is_floating_point:
        return _randn(g, *shape, dtype=t.dtype)
    hi = max(int(t.max()) + 1, 1) if t.numel() else 1
    return torch.randint(0, hi, shape, generator=g, dtype=t.dtype)


def _strided(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    out = []
    if t.dim() >= 1 and t.numel() > 1:
        wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        out.append(("every other element", wide[..., ::2]))
        out.append(("stride-0 rows", t[:1].expand(t.shape)))
    if t.dim() >= 2:
        out.append(("transposed", t.transpose(0, 1).contiguous().transpose(0, 1)))
    return out


def _alias(t: torch.Tensor, other: torch.Tensor) -> torch.Tensor | None:
    """A view of `other`'s memory shaped like t (dtype reinterpreted), or None when other is too small."""
    nbytes = t.numel() * t.element_size()
    if other.numel() * other.element_size() < nbytes or nbytes == 0 or not other.is_contiguous():
        return None
    flat = other.view(-1).view(torch.uint8)[:nbytes]
    return flat.view(t.dtype).view(t.shape)


def mutations(call: Call, g: torch.Generator) -> Iterator[tuple[str, dict[str, Any]]]:
    tensors = [n for n, v in call.args.items() if isinstance(v, torch.Tensor)]
    for name in tensors:
        t = call.args[name]
        # written tensors shaped like t follow it (as a wrapper allocating `out` like its input would)
        twins = [w for w in call.written if w != name and call.args[w].shape == t.shape]
        for d in range(t.dim()):
            for size in sorted({t.shape[d] + 1, t.shape[d] - 1, 0} - {t.shape[d], -1}):
                yield f"{name}.shape[{d}]={size}", {**call.args, name: _resized(t, d, size, g, name)}
                if twins:
                    yield f"{name}.shape[{d}]={size} with {', '.join(twins)}", {
                        **call.args, name: _resized(t, d, size, g, name),
                        **{w: _resized(call.args[w], d, size, g) for w in twins}}
        yield f"{name} extra dim", {**call.args, name: t.unsqueeze(0)}
        yield f"{name} 0-d", {**call.args, name: t.reshape(-1)[:1].reshape(()) if t.numel() else torch.zeros(())}
        for dt in (torch.float64, torch.int32, torch.int64, torch.bfloat16):
            if dt != t.dtype:
                yield f"{name} dtype {dt}", {**call.args, name: t.to(dt)}
        yield f"{name}=None", {**call.args, name: None}
        yield f"{name} on meta", {**call.args, name: t.to("meta")}
        for what, s in _strided(t):
            yield f"{name} {what}", {**call.args, name: s}
    for w in call.written:
        for other in tensors:
            if other == w:
                continue
            view = _alias(call.args[w], call.args[other])
            if view is not None:
                yield f"{w} aliases {other}", {**call.args, w: view}
            view = _alias(call.args[other], call.args[w])
            if view is not None:
                yield f"{other} aliases {w}", {**call.args, other: view}
    for name, v in call.args.items():  # scalars: extreme values
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            for x in (-1, 0, 2**31, 2**62):
                yield f"{name}={x}", {**call.args, name: x}
        elif isinstance(v, float):
            for x in (math.nan, math.inf, 0.0, -1.0):
                yield f"{name}={x}", {**call.args, name: x}


def _with(args: dict[str, Any], name: str, i: int, value: Any) -> dict[str, Any]:
    """``args`` with entry ``i`` of the list ``name`` replaced."""
    lst = list(args[name])
    lst[i] = value
    return {**args, name: lst}


def _set(t: torch.Tensor, index: tuple[int, ...], value: int) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def list_mutations(call: Call, g: torch.Generator) -> Iterator[tuple[str, dict[str, Any]]]:
    """Mutations of list arguments (decode_layers' per-layer lists): lengths, each entry's shape / dtype /
    layout, aliasing between entries and with the written tensors, and out-of-range values of the index
    arguments."""
    a = call.args
    lists = [n for n, v in a.items() if isinstance(v, list)]
    for name in lists:
        v = a[name]
        if v:
            yield f"{name} without its last entry", {**a, name: v[:-1]}
            yield f"{name} with one entry more", {**a, name: [*v, v[-1]]}
        yield f"{name} empty", {**a, name: []}
        for i in sorted({0, len(v) - 1} if v else set()):
            if not isinstance(v[i], torch.Tensor):
                continue
            t = v[i]
            for dim in range(t.dim()):
                for size in sorted({t.shape[dim] + 1, t.shape[dim] - 1, 0} - {t.shape[dim], -1}):
                    yield f"{name}[{i}].shape[{dim}]={size}", _with(a, name, i, _resized(t, dim, size, g))
            yield f"{name}[{i}] extra dim", _with(a, name, i, t.unsqueeze(0))
            for dt in (torch.float64, torch.int32, torch.bfloat16, torch.uint8, torch.int8):
                if dt != t.dtype:
                    yield f"{name}[{i}] dtype {dt}", _with(a, name, i, t.to(dt))
            yield f"{name}[{i}] on meta", _with(a, name, i, t.to("meta"))
            for what, st in _strided(t):
                yield f"{name}[{i}] {what}", _with(a, name, i, st)
            for w in call.written:  # a written tensor and a list entry sharing memory, both ways
                view = _alias(t, a[w])
                if view is not None:
                    yield f"{name}[{i}] aliases {w}", _with(a, name, i, view)
                view = _alias(a[w], t)
                if view is not None:
                    yield f"{w} aliases {name}[{i}]", {**a, w: view}
        if v and isinstance(v[0], int):
            for x in (-1, 2**31, 2**62):
                yield f"{name}[0]={x}", _with(a, name, 0, x)
    if "k_cache" in a and len(a["k_cache"]) > 1:  # caches are written: two layers, or k and v, on one tensor
        yield "k_cache[1] is k_cache[0]", _with(a, "k_cache", 1, a["k_cache"][0])
        yield "v_cache[0] is k_cache[0]", _with(a, "v_cache", 0, a["k_cache"][0])
        yield "v_cache[1] overlaps k_cache[1]", _with(a, "v_cache", 1, _alias(a["v_cache"][1], a["k_cache"][1]))
    if a.get("qtypes"):
        for i in (0, len(a["qtypes"]) - 1):
            for code in (-2, 0, 1, 99, 1000, 12, 2**40):
                if code != a["qtypes"][i]:
                    yield f"qtypes[{i}]={code}", _with(a, "qtypes", i, code)
        first_int8 = next(i for i, q in enumerate(a["qtypes"]) if q == 1000)
        sc = a["scales"][first_int8]
        yield "scales of INT8_ROWWISE None", _with(a, "scales", first_int8, None)
        yield "scales fp64", _with(a, "scales", first_int8, sc.double())
        yield "scales one short", _with(a, "scales", first_int8, sc[:-1])
        yield "scales strided", _with(a, "scales", first_int8, torch.stack([sc, sc], 1)[:, 0])
        yield "scales for a block part", _with(a, "scales", 0, sc)
    elif "qtypes" in a:
        n = sum(len(a[k]) for k in ("qkv", "wo", "w13", "w2"))
        yield "qtypes all -1 (dense)", {**a, "qtypes": [-1] * n, "scales": [None] * n}
        yield "qtypes all Q4_0 on dense parts", {**a, "qtypes": [2] * n, "scales": [None] * n}
    indices = {"positions": [((1,), 16), ((1,), -1), ((0,), 2**40)],
               "slot_mapping": [((1,), 24), ((1,), -2), ((0,), 2**40)],
               "block_tables": [((1, 2), 6), ((0, 1), -1), ((1, 2), 2**31 - 1)],
               "seq_lens": [((1,), 13), ((1,), -1), ((0,), 0), ((1,), 2**31 - 1)]}
    for name, edits in indices.items():
        if isinstance(a.get(name), torch.Tensor):
            for index, value in edits:
                yield f"{name}{list(index)}={value}", {**a, name: _set(a[name], index, value)}


def cases(namespace: str) -> list[tuple[Call, str, dict[str, Any]]]:
    g = torch.Generator().manual_seed(SEED + 1)
    out = []
    for call in valid_calls(namespace):
        out.append((call, "valid", call.args))
        out.extend((call, desc, args) for desc, args in mutations(call, g))
        out.extend((call, desc, args) for desc, args in list_mutations(call, g))
    out.extend((call, desc, call.args) for desc, call in _nonfinite_scale_calls(g))
    return out


# ---- the oracle -----------------------------------------------------------------------------------------


def _fresh(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of the CPU tensors that keeps their aliasing: one new storage per original storage, every
    tensor re-created on it with its own dtype, offset, shape and strides."""
    storages: dict[int, torch.UntypedStorage] = {}

    def fresh(v: Any) -> Any:
        if isinstance(v, list):
            return [fresh(e) for e in v]
        if not (isinstance(v, torch.Tensor) and v.device.type == "cpu"):
            return v
        key = v.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = v.untyped_storage().clone()
        t = torch.empty(0, dtype=v.dtype)
        t.set_(storages[key], v.storage_offset(), v.shape, v.stride())
        return t

    return {n: fresh(v) for n, v in args.items()}


def _written(args: dict[str, Any], name: str) -> torch.Tensor:
    """``args[name]``, or entry i of a list for ``"name.i"``."""
    base, _, i = name.partition(".")
    return args[base][int(i)] if i else args[base]


_COMPOSITE_OPS = ("decode_layers",)  # compared with a tolerance scaled by the output's magnitude (judge)


def judge(namespace: str, call: Call, args: dict[str, Any]) -> str:
    """'ok: ...' or 'FAIL: ...' for one case."""
    fn = getattr(getattr(torch.ops, namespace), call.op)
    run_args = _fresh(args)
    try:
        fn(*run_args.values())
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        msg = str(e)
        if "UNKNOWN_SCALAR" in msg or call.op not in msg:
            return f"FAIL: unclear {type(e).__name__}: {msg[:300]}"
        return "ok: rejected"
    except Exception as e:  # noqa: BLE001 - any other exception type is the failure being reported
        return f"FAIL: {type(e).__name__}: {str(e)[:300]}"
    try:
        with torch.no_grad():
            expected = call.expected(_fresh(args))
    except Exception as e:  # noqa: BLE001 - the reference's rejection of the inputs, whatever its type
        return f"FAIL: the op accepted inputs the reference rejects ({type(e).__name__}: {str(e)[:200]})"
    for name, exp in expected.items():
        got = _written(run_args, name)
        if got.shape != exp.shape:
            return f"FAIL: {name} has shape {tuple(got.shape)}, the reference {tuple(exp.shape)}"
        if exp.dtype.is_floating_point:
            tol = 2e-2 if torch.bfloat16 in (got.dtype, exp.dtype) else 1e-4
            atol = tol
            if call.op in _COMPOSITE_OPS and exp.numel():
                # whole decoder layers: fp32 rounding differences scale with the terms summed (|x| ~ 100s after
                # two random layers), not with each output element, some of which come out of cancellation
                finite = exp.float()[exp.float().isfinite()]
                atol = tol * max(1.0, float(finite.abs().max())) if finite.numel() else tol
            if not torch.allclose(got.float(), exp.float(), atol=atol, rtol=tol, equal_nan=True):
                return f"FAIL: {name} differs from the reference (max err {(got.float() - exp.float()).abs().max()})"
        elif not torch.equal(got.long(), exp.long()):
            return f"FAIL: {name} differs from the reference"
    return "ok: matches the reference"


def main(namespace: str, first: int, last: int) -> None:
    all_cases = cases(namespace)
    for i in range(first, min(last, len(all_cases))):
        call, desc, args = all_cases[i]
        print(f"START {i}", flush=True)
        verdict = judge(namespace, call, args)
        print(f"RESULT {i} " + json.dumps({"op": call.op, "case": desc, "verdict": verdict}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
