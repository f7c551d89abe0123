"""Small launches of every CUDA kernel family, each checked against mistral_kernels.reference.

Run by scripts/gpu_check.sh under ``compute-sanitizer`` (memcheck, racecheck) on a GPU, and with
``--backend emu`` (the same kernels under the SIMT emulator, on the CPU) in CI, so the script cannot rot.
Shapes are tiny on purpose (a sanitizer slows kernels ~100×) but reach every code path that matters for
memory safety: split-K decode with an empty sequence and padded rows, the SIMT (fp32) and tensor-core
(bf16) prefill with a cached prefix, an empty-query sequence and a sliding window (on a GPU also tiles
whose key range is empty), reshape_and_cache with a skipped slot, RoPE, the norms and the fused MoE block.

    python scripts/gpu_launches.py [--backend cuda|emu]

Exit status 0 when every launch matches the reference; the first mismatch raises.
"""

from __future__ import annotations

import argparse
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


def run(ops: ModuleType, dev: str) -> None:
    g = torch.Generator().manual_seed(0)
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
    # RoPE (in place), norms, SwiGLU
    pos = torch.tensor([0, 5, 9], device=dev)
    q, kk = torch.randn(3, HQ, D, generator=g).to(dev), torch.randn(3, HKV, D, generator=g).to(dev)
    cs = public_ops.rope_cos_sin_cache(16, D, 1e4, device=dev)
    qr, kr = q.cpu().clone(), kk.cpu().clone()
    ops.rotary_embedding(pos, q, kk, cs, True)
    ref.rotary_embedding(pos.cpu(), qr, kr, cs.cpu(), True)
    _close(q, qr, "rotary_embedding", 1e-5)
    # RoPE fused with the cache write (a skipped slot): equal to the two ops
    q, kk = torch.randn(3, HQ, D, generator=g).to(dev), torch.randn(3, HKV, D, generator=g).to(dev)
    vv = torch.randn(3, HKV, D, generator=g).to(dev)
    kc, vc = torch.zeros(4, S, HKV, D, device=dev), torch.zeros(4, S, HKV, D, device=dev)
    qr, kr, vr, kcr, vcr = q.cpu().clone(), kk.cpu().clone(), vv.cpu(), kc.cpu().clone(), vc.cpu().clone()
    fused_slots = torch.tensor([6, -1, 13], device=dev)
    ops.rotary_embedding_and_cache(pos, q, kk, vv, cs, True, kc, vc, fused_slots)
    ref.rotary_embedding_and_cache(pos.cpu(), qr, kr, vr, cs.cpu(), True, kcr, vcr, fused_slots.cpu())
    _close(q, qr, "rotary_embedding_and_cache q", 1e-5)
    _close(kc, kcr, "rotary_embedding_and_cache k_cache", 1e-5)
    _close(vc, vcr, "rotary_embedding_and_cache v_cache", 0)
    x, w = torch.randn(6, 96, generator=g).to(dev), torch.randn(96, generator=g).to(dev)
    _close(ops.rms_norm(x, w), ref.rms_norm(x.cpu(), w.cpu()), "rms_norm", 1e-5)
    _close(ops.silu_and_mul(x), ref.silu_and_mul(x.cpu()), "silu_and_mul", 1e-5)
    # fused MoE: 4 experts, top-2, 7 tokens
    e, h, i = 4, 64, 32
    x = torch.randn(7, h, generator=g).to(dev)
    gate = torch.randn(e, h, generator=g).to(dev)
    w1, w3 = (torch.randn(e, i, h, generator=g).to(dev) * 0.1 for _ in range(2))
    w2 = (torch.randn(e, h, i, generator=g) * 0.1).to(dev)
    got = ops.fused_moe(x, gate, w1, w2, w3, 2, True)
    want = ref.fused_moe(x.cpu(), gate.cpu(), w1.cpu(), w2.cpu(), w3.cpu(), 2, True)
    _close(got, want, "fused_moe", 1e-4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["cuda", "emu"], default="cuda")
    args = ap.parse_args()
    if args.backend == "cuda":
        from mistral_kernels import ops

        run(ops, "cuda")
        torch.cuda.synchronize()
    else:
        from mistral_kernels import emulated

        run(emulated, "cpu")
    print("all launches match the reference")


if __name__ == "__main__":
    main()
