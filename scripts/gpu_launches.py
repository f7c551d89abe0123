"""Small launches of every CUDA kernel family, each checked against mistral_kernels.reference.

Run by scripts/gpu_check.sh under ``compute-sanitizer`` (memcheck, racecheck, synccheck) on a GPU, and with
``--backend emu`` (the same kernels under the SIMT emulator, on the CPU) in CI, so the script cannot rot.
Shapes are tiny on purpose (a sanitizer slows kernels ~100×) but reach every code path that matters for
memory safety:
  attention  split-K decode with an empty sequence and padded rows, the SIMT (fp32) and tensor-core (bf16)
             prefill with a cached prefix, an empty-query sequence and a sliding window (on a GPU also tiles
             whose key range is empty), reshape_and_cache with a skipped slot
  norm_rope  RoPE, rms_norm, fused_add_rms_norm, silu_and_mul
  moe        topk_softmax, moe_permute (both scan paths: E ≤ 32 and E > 32), moe_unpermute, the fused MoE block,
             moe_expert_ffn on the SIMT (fp32) and tensor-core (bf16: decode, medium and prefill tiles) grouped GEMMs
  quant      qlinear GEMV (M 1, 3) and GEMM (M 17) in every packed format, moe_qgemm grouped GEMV and GEMM,
             plain and gated (needs the ``gguf`` package for the reference: skipped, and said so, without it)

    python scripts/gpu_launches.py [--backend cuda|emu] [--families attention,norm_rope,moe,quant]

Exit status 0 when every launch matches the reference; the first mismatch raises.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from mistral_kernels import ops as public_ops, reference as ref

D, HQ, HKV, S = 64, 4, 2, 8  # head_dim, q heads, kv heads, block size


def _close(got: torch.Tensor, want: torch.Tensor, what: str, tol: float) -> None:
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")
    print(f"ok  {what}", flush=True)


def _paged(g: torch.Generator, lens: list[int], dtype: torch.dtype, dev: str):
    need = [max(1, -(-n // S)) for n in lens]
    perm = torch.randperm(sum(need) + 2, generator=g)
    tables = torch.zeros(len(lens), max(need) + 1, dtype=torch.int32)  # one spare column: never read
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used:used + n]
        used += n
    shape = (sum(need) + 2, S, HKV, D)
    kc = torch.randn(shape, generator=g).to(dtype)
    vc = torch.randn(shape, generator=g).to(dtype)
    return kc.to(dev), vc.to(dev), tables.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev)


def attention(ops: ModuleType, dev: str, g: torch.Generator) -> None:
    # decode: split-K (partition_size 16 → several partitions), an empty sequence, GQA, a window
    for dtype, window in ((torch.float32, None), (torch.bfloat16, 12)):
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        lens = [37, 0, 5, 64]
        kc, vc, tables, sl = _paged(g, lens, dtype, dev)
        q = torch.randn(len(lens), HQ, D, generator=g).to(dev, dtype)
        got = ops.paged_decode_attention(q, kc, vc, tables, sl, D ** -0.5, window, partition_size=16)
        want = ref.paged_decode_attention(q.cpu(), kc.cpu(), vc.cpu(), tables.cpu(), sl.cpu(), D ** -0.5, window)
        _close(got, want, f"paged_decode_attention {dtype} W={window}", tol)
    # prefill: fp32 → SIMT kernel, bf16 → tensor-core kernel; a cached prefix, an empty query, a window
    for dtype, window in ((torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, 9)):
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        lens, qlens = [20, 7, 33], [20, 0, 13]
        kc, vc, tables, sl = _paged(g, lens, dtype, dev)
        cu = torch.tensor([0, 20, 20, 33], dtype=torch.int32, device=dev)
        q = torch.randn(sum(qlens), HQ, D, generator=g).to(dev, dtype)
        got = ops.paged_prefill_attention(q, kc, vc, tables, cu, sl, D ** -0.5, window)
        want = ref.paged_prefill_attention(q.cpu(), kc.cpu(), vc.cpu(), tables.cpu(), cu.cpu(), sl.cpu(), D ** -0.5,
                                           window)
        _close(got, want, f"paged_prefill_attention {dtype} W={window}", tol)
    if dev == "cuda":  # unchecked bad input (device checks off): seq_lens < q_b leaves blocks an empty key
        # range; the tensor-core kernel must still wait for its Q copies before its epilogue (racecheck)
        kc, vc, tables, _ = _paged(g, [8], torch.bfloat16, dev)
        q = torch.randn(70, HQ, D, generator=g).to(dev, torch.bfloat16)
        with public_ops.device_index_checks(False):
            out = ops.paged_prefill_attention(q, kc, vc, tables, torch.tensor([0, 70], dtype=torch.int32, device=dev),
                                              torch.tensor([8], dtype=torch.int32, device=dev), D ** -0.5)
        torch.cuda.synchronize()
        print(f"ok  paged_prefill_attention empty key ranges (finite: {bool(torch.isfinite(out).all())})")
    # reshape_and_cache with a skipped (-1) slot
    k = torch.randn(5, HKV, D, generator=g).to(dev)
    v = torch.randn(5, HKV, D, generator=g).to(dev)
    kc, vc = torch.zeros(4, S, HKV, D, device=dev), torch.zeros(4, S, HKV, D, device=dev)
    slots = torch.tensor([3, -1, 17, 8, 31], device=dev)
    ops.reshape_and_cache(k, v, kc, vc, slots)
    kr, vr = kc.cpu().zero_(), vc.cpu().zero_()
    ref.reshape_and_cache(k.cpu(), v.cpu(), kr, vr, slots.cpu())
    _close(kc, kr, "reshape_and_cache", 0)


def norm_rope(ops: ModuleType, dev: str, g: torch.Generator) -> None:
    # RoPE (in place), norms, SwiGLU
    pos = torch.tensor([0, 5, 9], device=dev)
    q, kk = torch.randn(3, HQ, D, generator=g).to(dev), torch.randn(3, HKV, D, generator=g).to(dev)
    cs = public_ops.rope_cos_sin_cache(16, D, 1e4, device=dev)
    qr, kr = q.cpu().clone(), kk.cpu().clone()
    ops.rotary_embedding(pos, q, kk, cs, True)
    ref.rotary_embedding(pos.cpu(), qr, kr, cs.cpu(), True)
    _close(q, qr, "rotary_embedding", 1e-5)
    x, w = torch.randn(6, 96, generator=g).to(dev), torch.randn(96, generator=g).to(dev)
    _close(ops.rms_norm(x, w), ref.rms_norm(x.cpu(), w.cpu()), "rms_norm", 1e-5)
    _close(ops.silu_and_mul(x), ref.silu_and_mul(x.cpu()), "silu_and_mul", 1e-5)
    res = torch.randn(6, 96, generator=g).to(dev)
    xr, rr = x.cpu().clone(), res.cpu().clone()
    ops.fused_add_rms_norm(x, res, w)
    ref.fused_add_rms_norm(xr, rr, w.cpu())
    _close(x, xr, "fused_add_rms_norm (out)", 1e-5)
    _close(res, rr, "fused_add_rms_norm (residual)", 1e-5)


def moe(ops: ModuleType, dev: str, g: torch.Generator) -> None:
    # router and permutation: E 8 (one-block scan) and E 40 (the grid scan), a token count that leaves experts empty
    for t, e, k in ((7, 8, 2), (5, 40, 3)):
        logits = torch.randn(t, e, generator=g).to(dev)
        wts, ids = ops.topk_softmax(logits, k)
        w_ref, i_ref = ref.topk_softmax(logits.cpu(), k)
        _close(wts, w_ref, f"topk_softmax E={e}", 1e-5)
        x = torch.randn(t, 24, generator=g).to(dev)
        permuted, offsets, inv = ops.moe_permute(x, i_ref.to(dev), e)
        p_ref, o_ref, inv_ref = ref.moe_permute(x.cpu(), i_ref, e)
        _close(offsets, o_ref, f"moe_permute offsets E={e}", 0)
        _close(permuted, p_ref, f"moe_permute rows E={e}", 0)
        _close(ops.moe_unpermute(permuted, w_ref.to(dev), inv), ref.moe_unpermute(p_ref, w_ref, inv_ref),
               f"moe_unpermute E={e}", 1e-5)
    # fused MoE: 4 experts, top-2, 7 tokens
    e, h, i = 4, 64, 32
    x = torch.randn(7, h, generator=g).to(dev)
    gate = torch.randn(e, h, generator=g).to(dev)
    w1, w3 = (torch.randn(e, i, h, generator=g).to(dev) * 0.1 for _ in range(2))
    w2 = (torch.randn(e, h, i, generator=g) * 0.1).to(dev)
    got = ops.fused_moe(x, gate, w1, w2, w3, 2, True)
    want = ref.fused_moe(x.cpu(), gate.cpu(), w1.cpu(), w2.cpu(), w3.cpu(), 2, True)
    _close(got, want, "fused_moe", 1e-4)
    # expert FFN over given segments: fp32 → SIMT grouped GEMM; bf16 (H, I multiples of 8) → tensor-core tiles
    # picked by the expected rows per expert M / G (grouped_gemm_tc.cuh): 0.75 (decode, ≤ 16), 20 (medium, ≤ 64),
    # 67 (prefill)
    h, i = 40, 24
    for dtype, offsets in ((torch.float32, [0, 3, 3, 9]), (torch.bfloat16, [0, 1, 2, 2, 3]),
                           (torch.bfloat16, [0, 0, 30, 60]), (torch.bfloat16, [0, 100, 101, 200])):
        n_e = len(offsets) - 1
        x = torch.randn(offsets[-1], h, generator=g).to(dtype)
        w1, w3 = ((torch.randn(n_e, i, h, generator=g) / h**0.5).to(dtype) for _ in range(2))
        w2 = (torch.randn(n_e, h, i, generator=g) / i**0.5).to(dtype)
        off = torch.tensor(offsets)
        got = ops.moe_expert_ffn(x.to(dev), off.to(dev), w1.to(dev), w2.to(dev), w3.to(dev))
        want = ref.moe_expert_ffn(x, off, w1, w2, w3)
        _close(got, want, f"moe_expert_ffn {dtype} offsets={offsets}", 1e-4 if dtype == torch.float32 else 2e-2)


def quant(ops: ModuleType, dev: str, g: torch.Generator) -> None:
    if importlib.util.find_spec("gguf") is None:
        print("SKIPPED quant: the gguf package is not installed (the references need it; pip install gguf)")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from mistral_kernels.ops import reference as qref
    from mistral_kernels.ops.quant import QFORMATS
    from tests.helpers.quant_data import FORMATS, random_qweight

    n = 13  # a tail of the GEMV's row blocks and of the GEMM's 64-column tile
    for fi, name in enumerate(FORMATS):
        qtype = QFORMATS[name].qtype
        k = 37 if QFORMATS[name].block == 1 else 2 * max(QFORMATS[name].block, 128)
        q, s = random_qweight(name, n, k, seed=fi)
        for m in (1, 3, 17):  # GEMV MR 1 / 4, the GEMM
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            got = ops.qlinear(x.to(dev), q.to(dev), qtype, None if s is None else s.to(dev))
            want = qref.qlinear(x.float(), q, qtype, s)
            _close(got, want, f"qlinear {name} M={m}", 1.6e-2 * max(1.0, want.abs().max().item()))
    # moe_qgemm: decode-sized segments (grouped GEMV) and a prefill-sized one (grouped GEMM), plain and gated
    for name in ("Q4_K", "Q8_0", "INT8_ROWWISE"):
        qtype = QFORMATS[name].qtype
        k = 37 if QFORMATS[name].block == 1 else 256
        stacks = []
        for seed in (1, 2):
            parts = [random_qweight(name, n, k, seed=seed * 10 + e) for e in range(3)]
            stacks.append((torch.stack([p for p, _ in parts]),
                           None if parts[0][1] is None else torch.stack([sc for _, sc in parts])))
        (q1, s1), (q3, s3) = stacks
        for offsets in ([0, 2, 2, 5], [1, 1, 3, 40]):  # rows outside every segment stay 0
            x = torch.randn(offsets[-1] + 1, k, generator=g).to(torch.bfloat16) * 0.1
            off = torch.tensor(offsets)
            for gated in (False, True):
                extra = (q3, s3) if gated else (None, None)
                args = [None if t is None else t.to(dev) for t in (x, off, q1, s1, *extra)]
                got = ops.moe_qgemm(args[0], args[1], args[2], qtype, *args[3:])
                want = qref.moe_qgemm(x, off, q1, qtype, s1, *extra)
                _close(got, want, f"moe_qgemm {name} offsets={offsets} gated={gated}",
                       1.6e-2 * max(1.0, want.abs().max().item()))


FAMILIES = {"attention": attention, "norm_rope": norm_rope, "moe": moe, "quant": quant}


def run(ops: ModuleType, dev: str, families: list[str] | None = None) -> None:
    for name in families or list(FAMILIES):
        FAMILIES[name](ops, dev, torch.Generator().manual_seed(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["cuda", "emu"], default="cuda")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"comma-separated subset of {', '.join(FAMILIES)} (default: all)")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"--families: unknown {', '.join(unknown)} (choose from {', '.join(FAMILIES)})")
    if args.backend == "cuda":
        from mistral_kernels import ops

        run(ops, "cuda", families)
        torch.cuda.synchronize()
    else:
        from mistral_kernels import emulated

        run(emulated, "cpu", families)
    print("all launches match the reference")


if __name__ == "__main__":
    main()
