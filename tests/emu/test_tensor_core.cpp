// test_tensor_core.cpp — mma.sync m16n8k16 (bf16, f16), ldmatrix x1/x2/x4 (+ .trans) and cp.async.
// References are computed here independently: a naive double-precision matmul for mma, and the
// PTX ISA's statement of each lane's ldmatrix elements for ldmatrix.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "emu_check.h"

template <typename T>
uint16_t bits(T x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return b;
}
template <typename T>
uint32_t pack(T lo, T hi) {
  return bits(lo) | static_cast<uint32_t>(bits(hi)) << 16;
}

// (1) Fragments built by hand from global memory, per the PTX ISA layout table (g = lane/4, t = lane%4).
// A: [16][16] row-major, B: [16][8] row-major (K×N), C, D: [16][8].
template <typename T, bool BF16>
__global__ void mma_manual_kernel(const T* A, const T* B, const float* C, float* D) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const uint32_t a[4] = {pack(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                         pack(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                         pack(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                         pack(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b[2] = {pack(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]),
                         pack(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
  const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  if constexpr (BF16) simt::mma_m16n8k16_bf16(d, a, b, c);
  else simt::mma_m16n8k16_f16(d, a, b, c);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// (2) The FlashAttention-style pipeline: cp.async global → shared, ldmatrix_x4 for A, ldmatrix_x2_trans
// for row-major B, mma accumulating over K in place (d aliases c). Warp w computes rows 16w..16w+15 of
// D[32][8] = A[32][K] · B[K][8] for K = 32. Shared rows are padded to 40 elements (80 bytes).
constexpr int kK = 32, kPad = 40;
__global__ void mma_pipeline_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* D) {
  __shared__ __align__(16) __nv_bfloat16 sA[32 * kPad];
  __shared__ __align__(16) __nv_bfloat16 sB[kK * kPad];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int chunk = tid; chunk < 32 * kK / 8; chunk += blockDim.x) {  // 16-byte chunks of 8 elements
    const int r = chunk / (kK / 8), c = chunk % (kK / 8) * 8;
    simt::cp_async_16(&sA[r * kPad + c], &A[r * kK + c]);
  }
  simt::cp_async_commit();
  for (int chunk = tid; chunk < kK; chunk += blockDim.x) simt::cp_async_cg(&sB[chunk * kPad], &B[chunk * 8]);
  simt::cp_async_commit();
  simt::cp_async_wait<0>();
  __syncthreads();

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < kK; k0 += 16) {
    uint32_t a[4], b[2];
    // x4 quadrants: lanes 0-7 rows 0-7 / cols 0-7, 8-15 rows 8-15 / cols 0-7, 16-23 rows 0-7 / cols 8-15, ...
    const int arow = 16 * warp + (lane & 15), acol = k0 + (lane >> 4) * 8;
    simt::ldmatrix_x4(a, &sA[arow * kPad + acol]);
    simt::ldmatrix_x2_trans(b, &sB[(k0 + (lane & 15)) * kPad]);  // lanes 0-15: rows k0..k0+15
    simt::mma_m16n8k16_bf16(acc, a, b, acc);
  }
  const int g = lane >> 2, t = lane & 3, row = 16 * warp + g;
  D[row * 8 + 2 * t] = acc[0];
  D[row * 8 + 2 * t + 1] = acc[1];
  D[(row + 8) * 8 + 2 * t] = acc[2];
  D[(row + 8) * 8 + 2 * t + 1] = acc[3];
}

// (3) ldmatrix, every variant: four 8×8 uint16 matrices in shared memory whose rows are scattered
// (row r of matrix i at slot perm(i, r)); element value = 256·i + 8·r + c. out[lane][variant][reg].
constexpr int kVariants = 6;
__device__ int row_slot(int i, int r) { return (i * 8 + r) * 5 % 32; }  // a permutation of 0..31
__global__ void ldmatrix_kernel(uint32_t* out) {
  __shared__ __align__(16) uint16_t rows[32][8];
  const int lane = threadIdx.x;
  for (int c = 0; c < 8; ++c) rows[row_slot(lane / 8, lane % 8)][c] = static_cast<uint16_t>(256 * (lane / 8) + 8 * (lane % 8) + c);
  __syncwarp();
  const void* my_row = rows[row_slot(lane / 8, lane % 8)];
  uint32_t* o = out + lane * kVariants * 4;
  uint32_t r1[1], r2[2], r4[4];
  simt::ldmatrix_x1(r1, my_row);        o[0 * 4] = r1[0];
  simt::ldmatrix_x2(r2, my_row);        for (int i = 0; i < 2; ++i) o[1 * 4 + i] = r2[i];
  simt::ldmatrix_x4(r4, my_row);        for (int i = 0; i < 4; ++i) o[2 * 4 + i] = r4[i];
  simt::ldmatrix_x1_trans(r1, my_row);  o[3 * 4] = r1[0];
  simt::ldmatrix_x2_trans(r2, my_row);  for (int i = 0; i < 2; ++i) o[4 * 4 + i] = r2[i];
  simt::ldmatrix_x4_trans(r4, my_row);  for (int i = 0; i < 4; ++i) o[5 * 4 + i] = r4[i];
}

// (4) cp.async sizes, zero-fill, and group accounting: group 0 = ca<4>, ca<8>, ca<16>; group 1 = cg +
// zfill(6 of 16 bytes). wait<1> must complete group 0 only (the emulator performs copies at the wait,
// so group 1's destination still holds the 0xff poison); wait<0> completes both.
__global__ void cp_async_kernel(const unsigned char* src, unsigned char* out) {
  SIMT_DYN_SMEM(unsigned char, s);
  if (threadIdx.x == 0) {
    simt::cp_async_ca<4>(s + 0, src + 0);
    simt::cp_async_ca<8>(s + 8, src + 8);
    simt::cp_async_ca<16>(s + 16, src + 16);
    simt::cp_async_commit();
    simt::cp_async_cg(s + 32, src + 32);
    simt::cp_async_16_zfill(s + 48, src + 48, 6);
    simt::cp_async_commit();
    simt::cp_async_wait<1>();
    std::memcpy(out, s, 64);
    simt::cp_async_wait<0>();
    std::memcpy(out + 64, s, 64);
  }
}

template <typename T>
void check_mma_manual(bool bf16, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<T> A(256), B(128);
  std::vector<float> C(128), D(128);
  for (auto& x : A) x = T(nd(rng));
  for (auto& x : B) x = T(nd(rng));
  for (auto& x : C) x = nd(rng);
  cudaError_t err = bf16 ? simt::launch(mma_manual_kernel<T, true>, dim3(1), dim3(32), 0, nullptr, A.data(), B.data(), C.data(), D.data())
                         : simt::launch(mma_manual_kernel<T, false>, dim3(1), dim3(32), 0, nullptr, A.data(), B.data(), C.data(), D.data());
  CHECK_OK(err);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double ref = C[i * 8 + j], mag = std::fabs(ref);
      for (int k = 0; k < 16; ++k) {
        ref += static_cast<double>(float(A[i * 16 + k])) * float(B[k * 8 + j]);
        mag += std::fabs(static_cast<double>(float(A[i * 16 + k])) * float(B[k * 8 + j]));
      }
      CHECK(std::fabs(D[i * 8 + j] - ref) <= 1e-6 * mag, "%s mma D[%d][%d] = %.9g, naive %.9g", bf16 ? "bf16" : "f16",
            i, j, D[i * 8 + j], ref);
    }
}

void check_mma_pipeline(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<__nv_bfloat16> A(32 * kK), B(kK * 8);
  std::vector<float> D(32 * 8);
  for (auto& x : A) x = __nv_bfloat16(nd(rng));
  for (auto& x : B) x = __nv_bfloat16(nd(rng));
  CHECK_OK(simt::launch(mma_pipeline_kernel, dim3(1), dim3(64), 0, nullptr, A.data(), B.data(), D.data()));
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 8; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < kK; ++k) {
        const double p = static_cast<double>(float(A[i * kK + k])) * float(B[k * 8 + j]);
        ref += p;
        mag += std::fabs(p);
      }
      // two mma steps, each rounded to fp32 once
      CHECK(std::fabs(D[i * 8 + j] - ref) <= 2e-6 * mag, "pipeline D[%d][%d] = %.9g, naive %.9g", i, j, D[i * 8 + j], ref);
    }
}

void check_ldmatrix() {
  std::vector<uint32_t> out(32 * kVariants * 4);
  CHECK_OK(simt::launch(ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, out.data()));
  auto M = [](int i, int r, int c) { return static_cast<uint32_t>(256 * i + 8 * r + c); };
  const int nums[kVariants] = {1, 2, 4, 1, 2, 4};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int v = 0; v < kVariants; ++v) {
      const bool trans = v >= 3;
      for (int i = 0; i < nums[v]; ++i) {
        // PTX ISA: row g, columns 2t and 2t+1 (lower in the low half); .trans: rows 2t, 2t+1 of column g.
        const uint32_t expect = trans ? M(i, 2 * t, g) | M(i, 2 * t + 1, g) << 16 : M(i, g, 2 * t) | M(i, g, 2 * t + 1) << 16;
        const uint32_t got = out[(lane * kVariants + v) * 4 + i];
        CHECK(got == expect, "ldmatrix x%d%s lane %d reg %d: %08x, expected %08x", nums[v], trans ? ".trans" : "",
              lane, i, got, expect);
      }
    }
  }
}

void check_cp_async() {
  std::vector<unsigned char> src(64), out(128);
  for (int i = 0; i < 64; ++i) src[i] = static_cast<unsigned char>(i + 1);
  alignas(16) static unsigned char aligned_src[64];
  std::memcpy(aligned_src, src.data(), 64);
  CHECK_OK(simt::launch(cp_async_kernel, dim3(1), dim3(32), 64, nullptr, aligned_src, out.data()));
  for (int i = 0; i < 64; ++i) {
    const bool copied0 = i < 4 || (i >= 8 && i < 32);                   // group 0
    const unsigned expect_after_wait1 = copied0 ? i + 1 : 0xff;         // 0xff: the emulator's smem poison
    const unsigned expect_after_wait0 = i < 4 || (i >= 8 && i < 54) ? i + 1 : (i >= 54 ? 0 : 0xff);  // zfill
    CHECK(out[i] == expect_after_wait1, "after wait_group 1: byte %d = %u, expected %u", i, out[i], expect_after_wait1);
    CHECK(out[64 + i] == expect_after_wait0, "after wait_group 0: byte %d = %u, expected %u", i, out[64 + i],
          expect_after_wait0);
  }
}

int main() {
  std::mt19937 rng(42);
  for (const char* schedule : {"forward", "reverse", "random:3"}) {
    set_schedule(schedule);
    check_mma_manual<__nv_bfloat16>(true, rng);
    check_mma_manual<__half>(false, rng);
    check_mma_pipeline(rng);
    check_ldmatrix();
    check_cp_async();
  }
  return check_summary("test_tensor_core");
}
