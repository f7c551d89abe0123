"""The fused CPU decode step (ops.decode_layers, mistral_kernels.cpu_decode) vs the per-op decoder layers
and vs the plain-torch reference, on tiny random models; fallbacks and argument errors.

Shape letters: B sequences, T tokens, V vocab, H hidden, L layers, N cache blocks, S block size.
The model-level comparison against transformers is tests/test_model_parity.py (its decode steps run fused).
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import ops, reference
from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.cpu_decode import FusedCpuDecode
from mistral_kernels.model import Model

from .helpers.model_helpers import fused_and_per_op_step, prefilled_caches, random_model

# H = 48 and I = 40: K and I not multiples of 32 / 16 (masked tails of the GEMV and SiLU loops);
# head_dim 16 (portable attention scan) and 64 (the AVX-512 BF16 scan); windows shorter than the sequences.
CONFIGS = {
    "d16-window": ModelConfig(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=40,
                              vocab_size=64, max_position=128, sliding_window=7),
    "d64-interleaved": ModelConfig(dim=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64, hidden_dim=96,
                                   vocab_size=64, max_position=128, rope_is_neox=False),
}
S, N = 4, 40
LENGTHS = [9, 3, 14]  # prompt lengths of the B = 3 sequences
TOL = {"atol": 1e-5, "rtol": 1.3e-6}  # fp32 tolerance, for both dtypes (the paths round at the same points)


def _tables() -> list[list[int]]:
    """Disjoint block tables in scrambled physical order, 10 blocks (40 tokens) per sequence."""
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    return [perm[10 * b:10 * (b + 1)] for b in range(len(LENGTHS))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_decode_equals_per_op_layers(name: str, dtype: torch.dtype) -> None:
    config = CONFIGS[name]
    model = random_model(config, dtype=dtype)
    fused = model.cpu_decode
    assert isinstance(fused, FusedCpuDecode)
    g = torch.Generator().manual_seed(2)
    tables = _tables()
    caches = prefilled_caches(model, tables, LENGTHS, S, N, g)  # NaN in every unwritten slot
    lens = list(LENGTHS)
    for step in range(8):  # crosses block boundaries and the window of 7
        tokens = torch.randint(0, config.vocab_size, (3,), generator=g)
        rows = [0, 2] if step % 3 == 2 else [0, 1, 2]  # batches of 3 and 2 sequences
        got, want = fused_and_per_op_step(model, tokens, tables, lens, rows, S, caches)
        torch.testing.assert_close(got, want, **TOL)
        for b in rows:
            lens[b] += 1
            for k0, k1 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
                j = torch.arange(lens[b])
                blocks = torch.tensor(tables[b])[j // S]
                torch.testing.assert_close(k0[blocks, j % S], k1[blocks, j % S], atol=0, rtol=0)


def _step_args(model: Model, dtype: torch.dtype, g: torch.Generator) -> tuple[list, dict]:
    """Arguments of ops.decode_layers for one step of B = 3 rows (the last a padding row: slot -1,
    seq_len 0), over a cache filled with random K/V up to each sequence's length."""
    c = model.config
    cache = model.new_cache(N, S)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    tables = torch.tensor(_tables(), dtype=torch.int32)
    lens = torch.tensor([10, 23, 0], dtype=torch.int32)
    positions = torch.tensor([9, 22, 0])
    slots = torch.tensor([int(tables[0, 9 // S]) * S + 9 % S, int(tables[1, 22 // S]) * S + 22 % S, -1])
    f, ls = model.cpu_decode, model.layers
    x = torch.randn(3, c.dim, generator=g).to(dtype)
    residual = torch.randn(3, c.dim, generator=g).to(dtype)
    args = [x, residual, f.attn_norm, [ly.qkv for ly in ls], [ly.wo for ly in ls], f.ffn_norm,
            [ly.w13 for ly in ls], [ly.w2 for ly in ls], cache.k, cache.v, f.windows, positions, slots, tables, lens,
            model.rope.covering(64), c.n_heads, c.norm_eps, f.scale, c.rope_is_neox]
    return args, {"cache": cache}


def _clone(args: list) -> list:
    return [a.clone() if isinstance(a, torch.Tensor) else [t.clone() for t in a] if isinstance(a, list)
            and a and isinstance(a[0], torch.Tensor) else a for a in args]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_layers_matches_reference(name: str, dtype: torch.dtype) -> None:
    model = random_model(CONFIGS[name], dtype=dtype)
    args, _ = _step_args(model, dtype, torch.Generator().manual_seed(3))
    ref = _clone(args)
    ops.decode_layers(*args)
    reference.decode_layers(*ref)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(args[0], ref[0], **tol)  # x
    torch.testing.assert_close(args[1], ref[1], **tol)  # residual
    for got, want in zip(args[8] + args[9], ref[8] + ref[9]):  # caches (the written slots included)
        torch.testing.assert_close(got, want, **tol)
    assert args[0][2].abs().sum() > 0  # the padding row still runs its FFN on the residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_rows_of_one_sequence_write_before_attending(name: str, dtype: torch.dtype) -> None:
    """Speculative decoding's verify rows: one sequence at positions 9 … 13, one row each (row j reads the
    keys rows 0 … j-1 write in the same step, across a block boundary and the window of 7) — every row's
    key / value is written before any row attends, as in the reference (the per-op order)."""
    model = random_model(CONFIGS[name], dtype=dtype)
    args, _ = _step_args(model, dtype, torch.Generator().manual_seed(5))
    table = args[13][0]
    rows = 5
    args[0], args[1] = args[0][:1].repeat(rows, 1) * torch.arange(1, rows + 1)[:, None].to(dtype), \
        args[1][:1].repeat(rows, 1)
    args[11] = torch.arange(9, 9 + rows)                                          # positions
    args[12] = torch.tensor([int(table[p // S]) * S + p % S for p in range(9, 9 + rows)])  # slots
    args[13] = table[None].repeat(rows, 1)                                         # one block table
    args[14] = torch.arange(10, 10 + rows, dtype=torch.int32)                      # seq_lens
    ref = _clone(args)
    ops.decode_layers(*args)
    reference.decode_layers(*ref)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(args[0], ref[0], **tol)
    torch.testing.assert_close(args[1], ref[1], **tol)
    for got, want in zip(args[8] + args[9], ref[8] + ref[9]):
        torch.testing.assert_close(got, want, **tol)


def test_fallback_to_per_op_layers() -> None:
    config = CONFIGS["d16-window"]
    assert random_model(config, fused_cpu_decode=False).cpu_decode is None
    moe = ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=1, head_dim=16, hidden_dim=24, vocab_size=64,
                      max_position=96, num_experts=4, top_k=2)
    assert random_model(moe).cpu_decode is None

    class Packed(torch.Tensor):  # stands for a quantized weight type: not a plain dense tensor
        pass

    model = random_model(config)
    model.layers[1].w2 = model.layers[1].w2.as_subclass(Packed)
    assert FusedCpuDecode.build(config, model.layers, ops, model.device, model.dtype) is None
    # a prefill / mixed step is not accepted
    batch = AttentionBatch.build([[0, 1]], [0], [5], S)
    assert not random_model(config).cpu_decode.accepts(torch.zeros(5, config.dim), batch)


@pytest.mark.parametrize("case,match", [
    ("qkv_shape", r"qkv\[1\] must have shape"),
    ("too_many_rows", r"must be <= 16"),
    ("position", r"row 0 decodes position 8 but seq_lens\[0\]=10"),
    ("block_id", r"block_tables\[1, 5\]=99 is out of range"),
    ("slot", r"slot_mapping\[1\]=9999 is out of range"),
    ("dtype", r"w13\[0\] .*dtype|dtype.*w13\[0\]"),
    ("list_length", r"wo has 1 tensors but attn_norm has 2"),
])
def test_bad_arguments_raise(case: str, match: str) -> None:
    model = random_model(CONFIGS["d16-window"])
    args, _ = _step_args(model, torch.float32, torch.Generator().manual_seed(4))
    if case == "qkv_shape":
        args[3] = [args[3][0], args[3][1][:-1]]
    elif case == "too_many_rows":
        args[0], args[1] = torch.zeros(17, args[0].shape[1]), torch.zeros(17, args[0].shape[1])
    elif case == "position":
        args[11] = torch.tensor([8, 22, 0])
    elif case == "block_id":
        args[13] = args[13].clone()
        args[13][1, 5] = 99
    elif case == "slot":
        args[12] = torch.tensor([args[12][0].item(), 9999, -1])
    elif case == "dtype":
        args[6] = [args[6][0].double(), args[6][1]]
    elif case == "list_length":
        args[4] = args[4][:1]
    with pytest.raises(RuntimeError, match=match):
        ops.decode_layers(*args)
