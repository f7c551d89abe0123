"""Op-level fuzz cases (issue 22): one valid call per raw op schema (csrc/registration.cpp), then single
mutations of it — a wrong size on each dimension of each tensor argument, another dtype, None, a
non-contiguous / stride-0 layout, a written argument aliasing another one — each judged by one oracle:

  * the op raises RuntimeError / ValueError / TypeError whose message names the op (a clear user error), or
  * the op succeeds, the reference (mistral_kernels.reference) accepts the same inputs, and every tensor
    the op writes matches it (NaN where the reference has NaN).

Anything else fails: a crash (the cases run in a subprocess, tests/test_op_fuzz.py), an unclear exception,
"UNKNOWN_SCALAR", or an op that accepts inputs the reference rejects (garbage output).

Run as ``python -m tests.op_fuzz_cases <namespace> <first> <last>``: prints ``START i`` before and one
``RESULT i <json>`` line after each case, so a crash names its case.

Shape letters: T tokens, B sequences, Hq / Hkv heads, D head_dim, N blocks, S block_size, M max_blocks,
H hidden, I intermediate, E experts, k top-k, P max positions, R rot_dim.
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


def valid_calls(namespace: str) -> list[Call]:
    g = torch.Generator().manual_seed(SEED)
    calls = [*_norm_calls(g), _rope_call(g), _rope_cache_call(g), *_attention_calls(g), *_moe_calls(g)]
    if namespace == "mistral_kernels":
        calls.append(_linear_call(g))  # CPU-only schema
        calls.append(_qlinear_call(g))  # the emulated qlinear is a separate piece of work (CUDA kernels)
    return calls


# ---- mutations -------------------------------------------------------------------------------------------


def _resized(t: torch.Tensor, dim: int, size: int, g: torch.Generator) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
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
                yield f"{name}.shape[{d}]={size}", {**call.args, name: _resized(t, d, size, g)}
                if twins:
                    yield f"{name}.shape[{d}]={size} with {', '.join(twins)}", {
                        **call.args, name: _resized(t, d, size, g),
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


def cases(namespace: str) -> list[tuple[Call, str, dict[str, Any]]]:
    g = torch.Generator().manual_seed(SEED + 1)
    out = []
    for call in valid_calls(namespace):
        out.append((call, "valid", call.args))
        out.extend((call, desc, args) for desc, args in mutations(call, g))
    return out


# ---- the oracle -----------------------------------------------------------------------------------------


def _fresh(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of the CPU tensors that keeps their aliasing: one new storage per original storage, every
    tensor re-created on it with its own dtype, offset, shape and strides."""
    storages: dict[int, torch.UntypedStorage] = {}
    out = {}
    for n, v in args.items():
        if isinstance(v, torch.Tensor) and v.device.type == "cpu":
            key = v.untyped_storage().data_ptr()
            if key not in storages:
                storages[key] = v.untyped_storage().clone()
            t = torch.empty(0, dtype=v.dtype)
            t.set_(storages[key], v.storage_offset(), v.shape, v.stride())
            out[n] = t
        else:
            out[n] = v
    return out


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
        got = run_args[name]
        if got.shape != exp.shape:
            return f"FAIL: {name} has shape {tuple(got.shape)}, the reference {tuple(exp.shape)}"
        if exp.dtype.is_floating_point:
            tol = 2e-2 if torch.bfloat16 in (got.dtype, exp.dtype) else 1e-4
            if not torch.allclose(got.float(), exp.float(), atol=tol, rtol=tol, equal_nan=True):
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
