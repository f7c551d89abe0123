"""The fused CPU decode step on packed (quantized) matrices: GGUF block formats, a Q4_K_M-like mix (a qkv of
two formats), INT8_ROWWISE.

References: the per-op packed path (``model.cpu_decode = None``: one ``qlinear`` per matrix, itself tested
against the ``gguf`` package in tests/test_quant_linear.py and tests/test_quant_model.py) for model decode
steps — the fused step rounds at the same points, so logits agree to fp32 rounding (csrc/cpu/decode_step.h
states where they may differ in the last fp32 bit); and ``reference.decode_layers`` (gguf's dequantization +
fp32 matmuls) for one op call.

Shape letters: B sequences, H hidden, I intermediate, V vocab, L layers, N cache blocks, S block size.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from mistral_kernels import ops, reference
from mistral_kernels.config import ModelConfig
from mistral_kernels.cpu_decode import FusedCpuDecode
from mistral_kernels.model import Model
from mistral_kernels.quant_weight import FusedWeight, QuantizedWeight, with_quantized_activations
from mistral_kernels.checkpoint import load_checkpoint

gguf = pytest.importorskip("gguf")
from .helpers.model_helpers import fused_and_per_op_step, prefilled_caches  # noqa: E402
from .helpers.quant_checkpoints import Q4_K_M, uniform, write_quant_gguf  # noqa: E402

# K-quant rows are whole 256-element super-blocks: H = I = 256. Nqkv = 512 (wq | wk 384 rows, wv 128).
CONFIG = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, vocab_size=256,
                     rope_is_neox=False, max_position=128)
KINDS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q4_K_M", "INT8")
S, N = 4, 40
LENGTHS = [9, 3, 14]                 # prompt lengths of the B = 3 sequences
ROWS = [[0, 1, 2], [1], [0, 2]]      # the sequences of each decode step, in turn (batches of 3, 1, 2)
TOL = {"atol": 1e-5, "rtol": 1.3e-6}  # fp32 rounding, for both activation dtypes


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("packed")
    files = {}
    for kind in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q4_K_M"):
        files[kind] = d / f"{kind}.gguf"
        write_quant_gguf(files[kind], CONFIG, Q4_K_M if kind == "Q4_K_M" else uniform(kind))
    return files


def _model(files: dict[str, Path], kind: str, dtype: torch.dtype, window: int | None,
           quantize_x: bool = False) -> Model:
    """The tiny model of ``kind`` natively packed (INT8: the Q8_0 file requantized per row), with
    ``window`` as every layer's sliding window; ``quantize_x``: fp32 x through the int8-activation paths."""
    path = files["Q8_0" if kind == "INT8" else kind]
    config, weights = load_checkpoint(path, dtype=dtype, quantize="int8" if kind == "INT8" else None)
    if quantize_x:
        weights = with_quantized_activations(weights)
    return Model(dataclasses.replace(config, sliding_window=window), weights)


def _formats(model: Model) -> list[list[str]]:
    """Per matrix of layer 0 (qkv, wo, w13, w2) the format names of its parts."""
    ly = model.layers[0]
    return [[p.format.name for p in (w.parts if isinstance(w, FusedWeight) else (w,))]
            for w in (ly.qkv, ly.wo, ly.w13, ly.w2)]


def _tables() -> list[list[int]]:
    """Disjoint block tables in scrambled physical order, 10 blocks (40 tokens) per sequence."""
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    return [perm[10 * b:10 * (b + 1)] for b in range(len(LENGTHS))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_fused_packed_decode_equals_per_op(gguf_files: dict[str, Path], kind: str, dtype: torch.dtype) -> None:
    window = 7 if kind in ("Q4_1", "Q4_K_M", "INT8") else None  # windows shorter than the sequences
    model = _model(gguf_files, kind, dtype, window)
    want_formats = {"Q4_K_M": [["Q4_K", "Q6_K"], ["Q6_K"], ["Q4_K"], ["Q6_K"]],  # its "output.weight" rule: wo
                    "INT8": [["INT8_ROWWISE"]] * 4}.get(kind, [[kind]] * 4)
    assert _formats(model) == want_formats
    fused = model.cpu_decode
    assert isinstance(fused, FusedCpuDecode)  # the packed model takes the fused step
    g = torch.Generator().manual_seed(2)
    tables = _tables()
    caches = prefilled_caches(model, tables, LENGTHS, S, N, g)  # NaN in every unwritten slot
    lens = list(LENGTHS)
    for step in range(6):  # crosses block boundaries and the window of 7
        tokens = torch.randint(0, CONFIG.vocab_size, (3,), generator=g)
        rows = ROWS[step % len(ROWS)]
        got, want = fused_and_per_op_step(model, tokens, tables, lens, rows, S, caches)
        assert want.isfinite().all() and want.std() > 0.05  # a meaningful comparison
        torch.testing.assert_close(got, want, **TOL)
        for b in rows:
            lens[b] += 1
        for k0, k1 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):  # the same slots written
            torch.testing.assert_close(k0, k1, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_K_M", "INT8"])
def test_quantize_x_takes_the_int8_paths_of_bf16_x(gguf_files: dict[str, Path], kind: str) -> None:
    """fp32 activations with quantize_x (the default for a quantized GGUF): the fused step rounds each GEMV input
    to bf16 and runs the int8-activation paths, as the per-op path does (``qlinear`` on x.bfloat16()); the per-op
    path also rounds each packed matmul's output to bf16, the fused step keeps it in fp32 — so the two agree to
    bf16 output rounding, not to fp32 rounding. Against the exact fp32 step they differ by the int8 error."""
    model = _model(gguf_files, kind, torch.float32, None, quantize_x=True)
    exact = _model(gguf_files, kind, torch.float32, None)
    assert model.cpu_decode.matrices.quantize_x and not exact.cpu_decode.matrices.quantize_x
    g = torch.Generator().manual_seed(6)
    tables = _tables()
    caches = prefilled_caches(model, tables, LENGTHS, S, N, g)
    exact_caches = [type(c)(k=[t.clone() for t in c.k], v=[t.clone() for t in c.v]) for c in caches]
    tokens = torch.randint(0, CONFIG.vocab_size, (3,), generator=g)
    got, want = fused_and_per_op_step(model, tokens, tables, list(LENGTHS), [0, 1, 2], S, caches)
    exact_got, _ = fused_and_per_op_step(exact, tokens, tables, list(LENGTHS), [0, 1, 2], S, exact_caches)
    scale = want.abs().max()
    assert want.isfinite().all() and scale > 0.05
    torch.testing.assert_close(got, want, atol=2e-2 * scale, rtol=0)  # bf16 output rounding (2⁻⁸) per matmul
    int8_err = (got - exact_got).abs().max()
    if kind != "INT8":  # INT8_ROWWISE multiplies fp32 x on every path: quantize_x changes nothing there
        assert int8_err > 1e-4 * scale, "quantize_x had no effect"
    assert int8_err < 0.1 * scale  # within int8 activation error of the exact step


def test_quantize_x_rules(gguf_files: dict[str, Path]) -> None:
    """One flag per step (mixed raises); fp16 x has no int8 path on the fused step; the load-time rule."""
    from mistral_kernels.ops.decode import LayerMatrices
    from mistral_kernels.quant_weight import quantize_x_for

    model = _model(gguf_files, "Q4_K", torch.float32, None, quantize_x=True)
    exact = _model(gguf_files, "Q4_K", torch.float32, None)
    ls, ex = model.layers, exact.layers
    with pytest.raises(ValueError, match="mix quantize_x True and False"):
        LayerMatrices.of([ly.qkv for ly in ls], [ly.wo for ly in ex], [ly.w13 for ly in ls], [ly.w2 for ly in ls])
    half = _model(gguf_files, "Q4_K", torch.float16, None)
    args = _op_args(half, torch.float16, torch.Generator().manual_seed(7))
    with pytest.raises(RuntimeError, match="quantize_x needs fp32 or bf16 x"):
        torch.ops.mistral_kernels.decode_layers(*args[:2], args[2], [ly.qkv.qweight for ly in half.layers],
                                                [ly.wo.qweight for ly in half.layers], *args[5:6],
                                                [ly.w13.qweight for ly in half.layers],
                                                [ly.w2.qweight for ly in half.layers], *args[8:],
                                                [12] * 8, [None] * 8, True)
    assert quantize_x_for("auto", torch.float32) and not quantize_x_for("auto", torch.bfloat16)
    assert quantize_x_for("int8", torch.bfloat16) and not quantize_x_for("exact", torch.float32)
    with pytest.raises(ValueError, match="activations='exact' needs fp32 activations"):
        quantize_x_for("exact", torch.bfloat16)
    with pytest.raises(ValueError, match="activations='int8' needs fp32 or bf16 activations"):
        quantize_x_for("int8", torch.float16)  # the fused step would refuse fp16 x at the first decode
    with pytest.raises(ValueError, match="activations must be one of"):
        quantize_x_for("fp8", torch.float32)


def test_int8_activations_without_packed_matrices_are_refused(gguf_files: dict[str, Path]) -> None:
    """activations='int8' on a model whose matrices are all dense would change nothing: refused at load, naming
    the choice; 'auto' loads the same file dequantized, and 'int8' its packed form."""
    from mistral_kernels.loading import load_model

    path = gguf_files["Q4_K"]
    with pytest.raises(ValueError, match="activations='int8'.*has none; use activations='auto'"):
        load_model(path, quantized=False, activations="int8")
    assert isinstance(load_model(path, quantized=False).layers[0].wo, torch.Tensor)
    wo = load_model(path, activations="int8").layers[0].wo
    assert isinstance(wo, QuantizedWeight) and wo.quantize_x


def _op_args(model: Model, dtype: torch.dtype, g: torch.Generator) -> list:
    """Arguments of ops.decode_layers for one step of B = 3 rows (the last a padding row), over a cache of
    random K/V, with the model's (packed) per-layer matrices."""
    c = model.config
    cache = model.new_cache(N, S)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    tables = torch.tensor(_tables(), dtype=torch.int32)
    lens = torch.tensor([10, 23, 0], dtype=torch.int32)
    slots = torch.tensor([int(tables[0, 9 // S]) * S + 9 % S, int(tables[1, 22 // S]) * S + 22 % S, -1])
    ls = model.layers
    return [torch.randn(3, c.dim, generator=g).to(dtype), torch.randn(3, c.dim, generator=g).to(dtype),
            [ly.attn_norm for ly in ls], [ly.qkv for ly in ls], [ly.wo for ly in ls], [ly.ffn_norm for ly in ls],
            [ly.w13 for ly in ls], [ly.w2 for ly in ls], cache.k, cache.v, [0, 5], torch.tensor([9, 22, 0]),
            slots, tables, lens, model.rope.covering(64), c.n_heads, c.norm_eps, c.head_dim ** -0.5, c.rope_is_neox]


def _clone(args: list) -> list:
    def one(a: object) -> object:
        if isinstance(a, torch.Tensor):
            return a.clone()
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            return [t.clone() for t in a]
        return a
    return [one(a) for a in args]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind", ["Q4_K_M", "INT8"])
def test_decode_layers_packed_matches_reference(gguf_files: dict[str, Path], kind: str,
                                                dtype: torch.dtype) -> None:
    """One op call vs reference.decode_layers (gguf's dequantization, fp32 matmuls, the same rounding points):
    fp32 / fp16 activations take the fp32 GEMV (activations not quantized), equal up to fp32 summation order."""
    model = _model(gguf_files, kind, dtype, None)
    args = _op_args(model, dtype, torch.Generator().manual_seed(3))
    ref = _clone(args)
    ops.decode_layers(*args)
    reference.decode_layers(*ref)
    # fp32: summation order only; fp16: design.md's fp16 tolerance (both paths round to fp16 at the same points)
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-3, "rtol": 1e-3}
    assert ref[0].abs().max() > 1e-2  # a meaningful comparison (the K-quant weights are small: |w| ≲ 0.05)
    for got, want in zip([args[0], args[1], *args[8], *args[9]], [ref[0], ref[1], *ref[8], *ref[9]]):
        torch.testing.assert_close(got, want, **tol)


def test_fallback_and_mixed_dense_packed(gguf_files: dict[str, Path]) -> None:
    """A layer may mix dense and packed matrices (e.g. a matrix dequantized at load); a packed matrix off the
    CPU or an expert stack keeps the per-op layers."""
    model = _model(gguf_files, "Q4_K", torch.float32, None)
    dense = _model(gguf_files, "Q4_K", torch.float32, None)
    dense.layers[1].wo = dense.layers[1].wo.dequantize(torch.float32)  # layer 1's wo dense, the rest packed
    dense.cpu_decode = FusedCpuDecode.build(dense.config, dense.layers, ops, dense.device, dense.dtype)
    assert dense.cpu_decode is not None and dense.cpu_decode.matrices.qtypes[3] == -1
    args = _op_args(model, torch.float32, torch.Generator().manual_seed(5))
    mixed = _clone(args)
    mixed[4] = [ly.wo for ly in dense.layers]
    ops.decode_layers(*args)
    ops.decode_layers(*mixed)
    # the dense wo holds gguf's decoding of the same blocks: equal up to fp32 summation order
    torch.testing.assert_close(mixed[0], args[0], atol=1e-4, rtol=1e-4)
    stack = QuantizedWeight(model.layers[0].w2.qweight.unsqueeze(0), model.layers[0].w2.qtype,
                            (1, *model.layers[0].w2.shape))
    model.layers[0].w2 = stack
    assert FusedCpuDecode.build(model.config, model.layers, ops, model.device, model.dtype) is None


@pytest.mark.parametrize("case,match", [
    ("qtypes_length", r"qtypes has 3 entries; need one per part"),
    ("bad_qtype", r"qtypes\[0\] = 7 \(qkv\[0\]\) is not -1 \(dense\) or a qlinear format"),
    ("rows_overflow", r"the parts of layer 0's qkv have more than its 512 rows"),
    ("missing_layer", r"qkv has 3 tensors but attn_norm has 2"),
    ("int8_scales", r"scales\[\d+\] \(fp32 \[N_g\]\) is required for the INT8_ROWWISE wo\[0\]"),
    ("packed_width", r"w2\[1\]\.shape\[1\] must be 210 \(K / QK \* bytes per block\)"),
])
def test_bad_packed_arguments_raise(gguf_files: dict[str, Path], case: str, match: str) -> None:
    from mistral_kernels.ops.decode import LayerMatrices, decode_layers_prepared

    model = _model(gguf_files, "Q4_K_M", torch.float32, None)
    args = _op_args(model, torch.float32, torch.Generator().manual_seed(4))
    m = LayerMatrices.of(args[3], args[4], args[6], args[7])
    if case == "qtypes_length":
        m = dataclasses.replace(m, qtypes=m.qtypes[:3])
    elif case == "bad_qtype":
        m = dataclasses.replace(m, qtypes=[7, *m.qtypes[1:]])
    elif case == "rows_overflow":  # layer 0's wv part replaced by a second wq | wk part (384 + 384 > 512)
        m = dataclasses.replace(m, qkv=[m.qkv[0], m.qkv[0], *m.qkv[2:]], qtypes=[m.qtypes[0], *m.qtypes[:1], *m.qtypes[2:]])
    elif case == "missing_layer":  # layer 1's Q6_K wv part dropped
        m = dataclasses.replace(m, qkv=m.qkv[:3], qtypes=m.qtypes[:3] + m.qtypes[4:], scales=m.scales[:3] + m.scales[4:])
    elif case == "int8_scales":
        int8 = _model(gguf_files, "INT8", torch.float32, None)
        m = LayerMatrices.of(args[3], [ly.wo for ly in int8.layers], args[6], args[7])
        m = dataclasses.replace(m, scales=[None] * len(m.scales))
    elif case == "packed_width":
        m = dataclasses.replace(m, w2=[m.w2[0], m.w2[1][:, :-1].contiguous()])
    with pytest.raises(RuntimeError, match=match):
        decode_layers_prepared(args[0], args[1], args[2], m, args[5], *args[8:])
