// grouped_gemm_tc.cuh — tensor-core grouped "NT" GEMM over row segments whose bounds stay on the device, for
// fp16 / bf16 (CUDA, framework-free; emulated by csrc/simt). The expert projections of fused_moe /
// moe_expert_ffn (glue/moe.h); fp32 and shapes outside the rule below keep the SIMT kernel of grouped_gemm.cuh.
//
// Shapes: M rows, G groups (experts), N outputs, K reduction; BM × BN × BK the block tile (BN counts weight
// rows in shared memory), S pipeline stages, LD = BK + 8 the padded shared row (elements).
//   A [M, K] (row stride lda), W [G, N, K] contiguous, offsets int64 [G+1] on the device (nullptr: one group
//   covering [0, M)), C [M, ·] (row stride ldc). Rows outside every segment are not written.
//   plain:  C[r, n] = Σ_κ A[r, κ] · W[g, n, κ]                          (w2: N = H, K = I)
//   gated:  C[r, n] = swiglu(round(Σ_κ A[r, κ]·W[g, n, κ]), round(Σ_κ A[r, κ]·W3[g, n, κ]))   (w1 | w3: N = I, K = H)
//           for offsets[g] ≤ r < offsets[g+1]; round = to T and back, so gate and up are rounded where the
//           unfused path (and reference.py) stores h13: the SwiGLU epilogue moves no rounding point, and the
//           [M, 2I] intermediate is never written.
//
// Blocks: grid (slots, N-tiles). x = the M-tile "slot" (grouped_tile of grouped_gemm.cuh: each block walks the
// device-side offsets to find its group and rows, no host sync; slots past the last tile exit at once; there
// are grouped_slots = floor(M / BM) + min(G, M) of them), y = the output-column tile. Slots run fastest, so
// the blocks resident at once share a weight tile: in prefill an expert's weight tile comes from HBM about
// once and is reused from L2 by its M-tiles resident at the same time (all of them up to ~200 per expert,
// i.e. ~25k rows per expert on a 108-SM A100 at 2 blocks/SM); in decode the grid is wide over N (split-N) so a few rows still
// put hundreds of blocks to work streaming each touched expert's weights exactly once.
// Gated: the W part of a stage holds BN/2 rows of W (gate) then BN/2 rows of W3 (up) for the same BN/2
// output columns; warp (wm, wn) owns NT/2 gate and NT/2 up n-tiles of the same columns, so its epilogue
// forms silu(gate)·up from its own accumulators.
//
// Per block and k-tile (S-stage cp.async pipeline, ≤ S-1 tiles in flight while the oldest is multiplied):
//   cp.async 16-byte chunks of the A rows and W rows of the tile into stage kt % S (zero-filled past the
//   segment, past N and past K: predicated loads, any M, N, K with K % 8 == 0). As CUTLASS's iterators do, each
//   thread's source pointers, their row predicates (in the segment / below N) and its chunk's k offset are
//   computed once per block; a k-tile costs one cp.async and one pointer increment per chunk, and the
//   ldmatrix offsets are two lane constants plus compile-time distances;
//   warp (wm, wn) of WARPS_M × WARPS_N: rows wm·BM/WARPS_M … (MT m-tiles of 16), NT n-tiles of 8 weight rows;
//   per 16-deep k-step: MT ldmatrix.x4 (A), NT/2 ldmatrix.x4 (B from the [n][k] rows: mma's "col" layout),
//   MT·NT mma.sync.m16n8k16 into fp32 accumulators. A warp whose rows all lie past the segment skips its mma.
// Epilogue: fragments straight from the accumulators, 4-byte stores (2 columns) per lane; rows past the
// segment and columns past N are not stored. A store instruction writes 16 contiguous bytes in each of 8 rows
// (half of each 32-byte sector); a block stores ≤ BM·BN / ((BM + BN)·K) of the bytes it loads (1/64 for the
// prefill tile at K = 4096), so the epilogue is not staged through shared memory.
//
// Tiles (GemmTcTile below), chosen from the EXPECTED rows per group, M / G (fused_moe: T·k / E; moe_expert_ffn:
// M over every bucket of its offsets), not from T:
//   decode   BM 16,  BN 64,  BK 64, 4 warps 1 × 4, 4 stages, 46,080 B smem   (M / G ≤ 16)
//   medium   BM 64,  BN 128, BK 32, 4 warps 2 × 2, 3 stages, 46,080 B smem   (16 < M / G ≤ 64)
//   prefill  BM 128, BN 128, BK 32, 8 warps 2 × 4, 3 stages, 61,440 B smem   (M / G > 64)
// Shared memory = S·(BM + BN)·LD·2 bytes. Bank conflicts: LD = 40 (BK 32) or 72 (BK 64) elements is a row of
// 20 or 36 words; 8 consecutive rows at one column start at banks 20r or 36r mod 32 = 8 distinct multiples of
// 4, so every ldmatrix phase is conflict-free. cp.async stores: BK 64 fills one row per 8-thread phase
// (conflict-free); BK 32 spans two rows per phase, one 2-way conflict on the asynchronous store side.
//
// Registers (per lane): fp32 accumulators MT·NT·4 (decode 8, medium 64, prefill 64), A fragments MT·4, B 4.
// Budgets (MIN_BLOCKS, __launch_bounds__): decode 3 blocks/SM (≤ 170 registers; 3 × 45 KiB smem on A100),
// medium 3 (≤ 170; 3 × 45 KiB), prefill 2 (≤ 128 registers at 256 threads; 2 × 60 KiB; on sm_86 / sm_89,
// 100 KiB of shared memory per SM, one prefill block resides). nvcc 13, fp16 and
// bf16 alike, plain / gated: sm_80 decode 57 / 60, medium 145 / 146, prefill 123 / 124 registers; sm_90 57 / 60,
// 145 / 146, 127 / 128; 0 spills — checked by tests/test_nvcc_ptxas.py (no spills, the promised blocks per SM).
//
// Steady-state k-loop (sm_90 SASS, nvcc 13, bf16, instructions per k-tile per warp; before → after the
// precomputed addressing): prefill 300 → 118 (32 HMMA: 10.7 → 27 % of the instructions; address / predicate
// integer ops 198 → 56; sm_80: 111), medium 435 → 132 (32 HMMA), decode 312 → ~90 (8 HMMA; 181 per two k-tiles, which the compiler unrolls).
// The rest per
// prefill k-tile: 12 ldmatrix.x4, 4 cp.async, the wait / barrier / commit, stage rotation. HMMA.16816 occupies
// its tensor pipe for several issue slots, so at 27 % of the instructions the loop is tensor-bound, not
// issue-bound (the issue-share metric of scripts/sass_budget.py weighs this).
// Measured (NVIDIA H200, 2026-11-27, benchmarks/results/gpu_kernels.md, fused_moe, bf16 Mixtral layer):
//   T = 4096 tokens (8 experts) 11.9 ms = 243 TFLOP/s (25 % of the 989 TFLOP/s dense peak), T = 512 186
//   TFLOP/s (19 %); decode T = 1 71 % and T = 16 91 % of the 4221 GB/s copy bandwidth. The prefill figure is
//   below the 30–40 % estimated next.
// Roofline (design estimates, unmeasured on a GPU):
//   prefill tile, per k-tile: 2·BM·BN·BK = 1.05 MFLOP; global (L2) 16 KiB → 64 FLOP/B; shared reads by
//     ldmatrix 8 warps × (64 + 32)·32·2 B = 48 KiB → 21 FLOP/B. HBM: weights once per expert and N-tile wave,
//     A once per N-tile wave; Mixtral-8x7B 4k-token prefill (M = 8192 rows, H 4096, I 14336): 1.9 TFLOP per
//     w1|w3 GEMM at ≈ 450 FLOP per HBM byte — compute-bound.
//     A100 (312 TFLOP/s dense mma, ~19.5 TB/s smem, ridge 16 FLOP/B): tensor-core bound, expect 55–70 % of
//       the mma.sync peak (no epilogue staging, simple raster; CUTLASS-class mma.sync GEMMs reach ~70–80 %).
//     H100 (~660 TFLOP/s reachable with mma.sync, ~31 TB/s smem, ridge ~21 FLOP/B): at the shared-memory
//       ridge, expect 45–60 % of the mma.sync rate (≈ 30–40 % of the 990 TFLOP/s wgmma peak; wgmma / TMA are
//       outside what the emulator verifies).
//   medium tile: 21 FLOP/B of shared memory as prefill; per expert the weights are read once per 64-row
//     M-tile, ≤ 64 FLOP per weight byte: bandwidth-bound below the ridge, expect ≈ 70 % of HBM bandwidth.
//   decode tile: bytes = touched experts × 3·I·H·2 (each weight byte once per M-tile, ≤ 16 rows per expert),
//     FLOPs negligible. Mixtral-8x7B, T = 1, k = 2: 2 × 3 × 14336 × 4096 × 2 B = 704 MB per layer, 0.35 ms at
//     A100's 2.0 TB/s, 0.21 ms at H100's 3.35 TB/s. w1|w3: I / 32 = 448 N-tiles × 2 experts = 896 working
//     blocks; w2: H / 64 = 64 N-tiles × 2 experts = 128 blocks of 224 k-tiles. In flight per block
//     (S-1)·(BM + BN)·BK·2 B = 30 KiB (Little's law needs ≈ 11 KiB per SM on A100, ≈ 18 KiB on H100):
//     expect 75–85 % of HBM bandwidth for w1|w3 and 60–75 % for w2 at T = 1 (about one block per SM; a
//     split-K w2 would lift it — not done).
//
// Rule (grouped_gemm_tc_supported): T fp16 / bf16, K % 8 == 0 and N even (16-byte chunks, 4-byte stores),
// lda % 8 == 0, ldc % 8 == 0, A, W, W3, C 16-byte aligned, N-tiles ≤ 65535 (grid.y). Otherwise the glue runs
// grouped_gemm.cuh (e.g. H or I not a multiple of 8).
#pragma once

#include <type_traits>

#include "../simt/portable.cuh"
#include "activation.cuh"
#include "common.cuh"
#include "grouped_gemm.cuh"
#include "tc_fragments.cuh"

namespace mk::inline MK_ABI {

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct GemmTcTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;  // resident blocks per SM the registers are budgeted for
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int LD = BK + 8;             // padded shared row (elements), see the header
  static constexpr int CH = BK / 8;             // 16-byte chunks per row
  static constexpr int MT = BM / WARPS_M / 16;  // 16-row m-tiles per warp
  static constexpr int NT = BN / WARPS_N / 8;   // 8-row n-tiles per warp
  static constexpr int KSTEPS = BK / 16;
  static_assert(BM % (16 * WARPS_M) == 0 && BN % (8 * WARPS_N) == 0 && BK % 16 == 0, "tile / warp grid mismatch");
  static_assert(NT % 2 == 0, "n-tiles go in pairs (one ldmatrix.x4); gated: NT/2 gate + NT/2 up");
  static_assert((BM + BN) * CH % THREADS == 0, "every thread issues the same number of cp.async per stage");
  static_assert(STAGES >= 2, "a pipeline needs two stages");
  template <typename T>
  static constexpr size_t smem_bytes() {
    return static_cast<size_t>(STAGES) * (BM + BN) * LD * sizeof(T);
  }
};

using GemmTcDecode = GemmTcTile<16, 64, 64, 1, 4, 4, 3>;
using GemmTcMedium = GemmTcTile<64, 128, 32, 2, 2, 3, 3>;
using GemmTcPrefill = GemmTcTile<128, 128, 32, 2, 4, 3, 2>;

// Expected rows per group at or below which each tile runs (above the medium bound: prefill).
inline constexpr int64_t kGemmTcDecodeRows = 16, kGemmTcMediumRows = 64;

template <typename T>
struct GroupedGemmTcArgs {
  T* C;
  int64_t ldc;
  const T* A;
  int64_t lda;
  const T* W;   // [G, N, K]; gated: the gate projection (w1)
  const T* W3;  // gated: the up projection [G, N, K] (w3); plain: nullptr
  const int64_t* offsets;
  int G;
  int64_t M, N, K;
};

// Rounds to T's precision and back (where the unfused path stores h13).
template <typename T>
__device__ __forceinline__ float tc_round(float x) {
  return simt::to_float(simt::from_float<T>(x));
}

template <typename T, typename C, bool GATED>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
grouped_gemm_tc_kernel(const GroupedGemmTcArgs<T> p) {
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, LD = C::LD, CH = C::CH, MT = C::MT, NT = C::NT;
  constexpr int S = C::STAGES, THREADS = C::THREADS;
  constexpr int BNO = GATED ? BN / 2 : BN;  // output columns per block
  constexpr int NTO = GATED ? NT / 2 : NT;  // output n-tiles per warp
  SIMT_DYN_SMEM(T, smem);                   // [S][BM + BN][LD]: the tile's A rows, then its W rows

  int g;
  int64_t row0, row_end;
  if (!grouped_tile(p.offsets, p.G, p.M, BM, blockIdx.x, g, row0, row_end)) return;  // block-uniform
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * BNO, K = p.K, N = p.N;
  const T* Wg = p.W + static_cast<int64_t>(g) * N * K;
  const T* W3g = GATED ? p.W3 + static_cast<int64_t>(g) * N * K : nullptr;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::WARPS_N, wn = warp % C::WARPS_N;

  // Loads: thread tid copies chunk c = tid % CH (k offset 8c) of the tile rows tid / CH + it·RS, it < LOADS —
  // rows < BM are A rows row0 + …, rows ≥ BM the W rows of the tile (gated: gate rows n0 … for i < BN/2, up rows
  // n0 … above). Which operand an `it` reads is compile-time (BM, BN/2 multiples of RS), and the source pointers
  // and their validity (row in the segment / below N) are computed here once: per k-tile a load is one cp.async
  // and a pointer increment. Rows outside the segment / past N point at the tile's first row (in bounds) and copy
  // 0 bytes (zero fill); chunks past K (the last tile when K % BK ≠ 0) copy 0 bytes from p.A.
  constexpr int RS = THREADS / CH, LOADS = (BM + BN) * CH / THREADS, A_LOADS = BM / RS;
  static_assert(THREADS % CH == 0 && BM % RS == 0 && BNO % RS == 0, "a load's operand must be compile-time");
  const int lr = tid / CH, kc = (tid % CH) * 8;
  const T* src[LOADS];
  unsigned bytes[LOADS];
#pragma unroll
  for (int it = 0; it < LOADS; ++it) {
    if (it < A_LOADS) {
      const int64_t r = row0 + lr + it * RS;
      bytes[it] = r < row_end ? 16u : 0u;
      src[it] = p.A + (r < row_end ? r : row0) * p.lda + kc;
    } else {
      const int i = lr + (it - A_LOADS) * RS, io = GATED ? i % BNO : i;  // i ≥ BNO is compile-time per it
      const int64_t n = n0 + io;
      bytes[it] = n < N ? 16u : 0u;
      src[it] = (GATED && (it - A_LOADS) * RS >= BNO ? W3g : Wg) + (n < N ? n : n0) * K + kc;
    }
  }
  T* const dst0 = smem + lr * LD + kc;  // + stage · (BM + BN)·LD + it · RS·LD
  int64_t k_left = K - kc;  // this thread's chunk is inside K while k_left > 0
  auto load = [&](int s) {
    T* dst = dst0 + s * (BM + BN) * LD;
    const bool k_ok = k_left > 0;
#pragma unroll
    for (int it = 0; it < LOADS; ++it) {
      simt::cp_async_16_zfill(dst + it * RS * LD, k_ok ? src[it] : p.A, k_ok ? bytes[it] : 0u);
      src[it] += BK;
    }
    k_left -= BK;
  };

  // This lane's ldmatrix element offsets in a stage: A rows of m-tile 0 (+ i·16·LD), B rows of n-tile pair jp
  // (gated, NT = 2: a gate and an up tile need not be adjacent; lanes 0-15 address n-tile 2jp, 16-31 2jp+1).
  auto wrow = [&](int j) {  // shared W row of this warp's n-tile j (gated: j < NT/2 gate, j ≥ NT/2 up)
    if constexpr (GATED) return (j < NTO ? 0 : BNO) + wn * NTO * 8 + (j % NTO) * 8;
    else return wn * NT * 8 + j * 8;
  };
  const int wrow0 = wm * MT * 16;  // this warp's first row in the tile
  const int a_off = (wrow0 + (lane & 15)) * LD + (lane >> 4) * 8;
  const int b_off = (BM + wrow((lane & 16) ? 1 : 0) + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;  // pair 0
  // Pair jp lies wrow(2jp) - wrow(0) rows further for both halves of the warp (a pair never straddles gate and
  // up), a compile-time distance: the lane's offsets stay two registers.
  constexpr auto b_pair = [](int jp) {
    if constexpr (GATED) return ((2 * jp < NTO ? 0 : BNO) + (2 * jp % NTO) * 8) * LD;
    else return 16 * jp * LD;
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  const bool warp_rows = row0 + wrow0 < row_end;  // warp-uniform: any of its rows in the segment
  const int ktiles = static_cast<int>(ceil_div(K, BK));
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < ktiles) load(s);
    simt::cp_async_commit();
  }
  int rd = 0, wr = S - 1;  // the stage multiplied / refilled at iteration kt: kt % S, (kt + S - 1) % S
  for (int kt = 0; kt < ktiles; ++kt) {
    // Tile kt's group retired (at most S-2 newer ones in flight); the barrier also tells every warp is done
    // with stage (kt-1) % S, which the prefetch below refills.
    simt::cp_async_wait<S - 2>();
    __syncthreads();
    if (kt + S - 1 < ktiles) load(wr);
    simt::cp_async_commit();
    wr = wr + 1 == S ? 0 : wr + 1;
    const T* st = smem + rd * (BM + BN) * LD;
    rd = rd + 1 == S ? 0 : rd + 1;
    if (!warp_rows) continue;
#pragma unroll
    for (int kk = 0; kk < C::KSTEPS; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) simt::ldmatrix_x4(a[i], st + a_off + i * 16 * LD + kk * 16);
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t b[4];
        simt::ldmatrix_x4(b, st + b_off + b_pair(jp) + kk * 16);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          tc_mma<T>(acc[i][2 * jp], a[i], b0);
          tc_mma<T>(acc[i][2 * jp + 1], a[i], b1);
        }
      }
    }
  }
  simt::cp_async_wait<0>();  // the trailing groups are empty; nothing may be in flight at exit

  // Epilogue: lane (g8, t4) holds rows g8, g8 + 8 of each m-tile, columns 2·t4, 2·t4 + 1 of each n-tile.
  const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + wrow0 + i * 16 + g8 + 8 * h;
      if (r >= row_end) continue;
      T* crow = p.C + r * p.ldc;
#pragma unroll
      for (int j = 0; j < NTO; ++j) {
        const int64_t col = n0 + wn * NTO * 8 + j * 8 + 2 * t4;
        if (col >= N) continue;  // N even: col + 1 < N as well
        float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if constexpr (GATED) {
          v0 = swiglu(tc_round<T>(v0), tc_round<T>(acc[i][j + NTO][2 * h]));
          v1 = swiglu(tc_round<T>(v1), tc_round<T>(acc[i][j + NTO][2 * h + 1]));
        }
        *reinterpret_cast<uint32_t*>(crow + col) = tc_pack<T>(v0, v1);
      }
    }
}

// True when launch_grouped_gemm_tc handles these arguments (the rule in the header).
template <typename T>
inline bool grouped_gemm_tc_supported(const GroupedGemmTcArgs<T>& p) {
  if constexpr (!kTcType<T>) {
    return false;
  } else {
    const bool aligned = aligned16(p.A) && aligned16(p.W) && aligned16(p.C) && (!p.W3 || aligned16(p.W3));
    return aligned && p.K % 8 == 0 && p.N % 2 == 0 && p.lda % 8 == 0 && p.ldc % 8 == 0 &&
           ceil_div(p.N, GemmTcDecode::BN / 2) <= 65535;
  }
}

// Which tile runs for an expected `rows_per_group` (M / G; fused_moe: T·k / E).
enum class GemmTcShape { decode, medium, prefill };
inline GemmTcShape grouped_gemm_tc_shape(int64_t rows_per_group) {
  return rows_per_group <= kGemmTcDecodeRows   ? GemmTcShape::decode
         : rows_per_group <= kGemmTcMediumRows ? GemmTcShape::medium
                                               : GemmTcShape::prefill;
}

template <typename T, typename C, bool GATED>
cudaError_t launch_grouped_gemm_tc_tile(const GroupedGemmTcArgs<T>& p, cudaStream_t stream) {
  const int64_t slots = grouped_slots(p.M, p.G, C::BM, p.offsets != nullptr);
  const int64_t n_tiles = ceil_div(p.N, GATED ? C::BN / 2 : C::BN);
  if (slots > 0x7fffffff || n_tiles > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(n_tiles));
  return simt::launch(grouped_gemm_tc_kernel<T, C, GATED>, grid, dim3(C::THREADS), C::template smem_bytes<T>(),
                      stream, p);
}

// C = A·Wᵀ per segment (plain, p.W3 == nullptr) or swiglu(A·Wᵀ, A·W3ᵀ) (gated), tile picked from
// rows_per_group (grouped_gemm_tc_shape). cudaErrorInvalidValue when grouped_gemm_tc_supported(p) is false.
template <typename T>
cudaError_t launch_grouped_gemm_tc(const GroupedGemmTcArgs<T>& p, int64_t rows_per_group, cudaStream_t stream) {
  if constexpr (!kTcType<T>) {
    return cudaErrorInvalidValue;
  } else {
    if (!grouped_gemm_tc_supported(p) || p.G < 1) return cudaErrorInvalidValue;
    if (p.M == 0 || p.N == 0) return cudaSuccess;
    auto go = [&](auto tile) {
      using C = decltype(tile);
      return p.W3 ? launch_grouped_gemm_tc_tile<T, C, true>(p, stream)
                  : launch_grouped_gemm_tc_tile<T, C, false>(p, stream);
    };
    switch (grouped_gemm_tc_shape(rows_per_group)) {
      case GemmTcShape::decode: return go(GemmTcDecode{});
      case GemmTcShape::medium: return go(GemmTcMedium{});
      default: return go(GemmTcPrefill{});
    }
  }
}

}  // namespace mk::inline MK_ABI
