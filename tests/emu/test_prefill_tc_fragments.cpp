// test_prefill_tc_fragments.cpp — the fragment arithmetic of csrc/kernels/paged_prefill_tc.cuh, exactly as
// the kernel uses it (its own addressing helpers tc_a_row / tc_b_nk_row / tc_b_kn_row / tc_acc_to_a, its
// padded row stride LD = D + 8), against naive double-precision products:
//   (1) S = Q·Kᵀ for a 16×32 Q tile and 16 keys: ldmatrix.x4 A, ldmatrix.x4 (non-trans) B from K rows,
//       two k-steps accumulated in place;
//   (2) O = P·V for a 16×16 P held in the S accumulator layout, re-packed as the A operand, and V rows
//       read as B with ldmatrix.x4.trans (two 8-wide output tiles);
//   (3) the whole kernel through launch_paged_prefill_tc on a tiny paged case (GQA 2, window on/off, a
//       poisoned unused block) vs naive attention, and the support rule;
// for fp16 and bf16, under the forward / reverse / random schedules.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "emu_check.h"
#include "kernels/paged_prefill_tc.cuh"

constexpr int kD = 32, kLD = kD + 8, kKeys = 16;

template <typename T>
__global__ void qk_kernel(const T* Q, const T* K, float* S) {  // Q [16][kD], K [kKeys][kD], S [16][kKeys]
  __shared__ __align__(16) T Qs[16 * kLD];
  __shared__ __align__(16) T Ks[kKeys * kLD];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  for (int i = lane; i < 16 * kD; i += 32) Qs[i / kD * kLD + i % kD] = Q[i];
  for (int i = lane; i < kKeys * kD; i += 32) Ks[i / kD * kLD + i % kD] = K[i];
  __syncwarp();
  float s[2][4] = {};
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4], bk[4];
    simt::ldmatrix_x4(a, mk::tc_a_row(Qs + kk * 16, kLD, lane));
    simt::ldmatrix_x4(bk, mk::tc_b_nk_row(Ks + kk * 16, kLD, lane));
    const uint32_t b0[2] = {bk[0], bk[1]}, b1[2] = {bk[2], bk[3]};
    mk::tc_mma<T>(s[0], a, b0);
    mk::tc_mma<T>(s[1], a, b1);
  }
  for (int j = 0; j < 2; ++j) {  // accumulator layout: c[0..1] row g, c[2..3] row g+8, columns 8j+2t+{0,1}
    S[g * kKeys + 8 * j + 2 * t] = s[j][0];
    S[g * kKeys + 8 * j + 2 * t + 1] = s[j][1];
    S[(g + 8) * kKeys + 8 * j + 2 * t] = s[j][2];
    S[(g + 8) * kKeys + 8 * j + 2 * t + 1] = s[j][3];
  }
}

template <typename T>
__global__ void pv_kernel(const float* P, const T* V, float* O) {  // P [16][16] fp32, V [16][16], O [16][16]
  __shared__ __align__(16) T Vs[16 * kLD];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  for (int i = lane; i < 256; i += 32) Vs[i / 16 * kLD + i % 16] = V[i];
  __syncwarp();
  float s[2][4];  // P in the S accumulator layout, as the kernel holds it after the softmax
  for (int j = 0; j < 2; ++j) {
    s[j][0] = P[g * 16 + 8 * j + 2 * t];
    s[j][1] = P[g * 16 + 8 * j + 2 * t + 1];
    s[j][2] = P[(g + 8) * 16 + 8 * j + 2 * t];
    s[j][3] = P[(g + 8) * 16 + 8 * j + 2 * t + 1];
  }
  uint32_t a[4], bv[4];
  mk::tc_acc_to_a<T>(a, s[0], s[1]);
  simt::ldmatrix_x4_trans(bv, mk::tc_b_kn_row(Vs, kLD, lane));
  const uint32_t b0[2] = {bv[0], bv[1]}, b1[2] = {bv[2], bv[3]};
  float o[2][4] = {};
  mk::tc_mma<T>(o[0], a, b0);
  mk::tc_mma<T>(o[1], a, b1);
  for (int j = 0; j < 2; ++j) {
    O[g * 16 + 8 * j + 2 * t] = o[j][0];
    O[g * 16 + 8 * j + 2 * t + 1] = o[j][1];
    O[(g + 8) * 16 + 8 * j + 2 * t] = o[j][2];
    O[(g + 8) * 16 + 8 * j + 2 * t + 1] = o[j][3];
  }
}

template <typename T>
const char* tname() {
  return std::is_same_v<T, __half> ? "f16" : "bf16";
}

template <typename T>
void check_qk(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<T> Q(16 * kD), K(kKeys * kD);
  std::vector<float> S(16 * kKeys, NAN);
  for (auto& x : Q) x = T(nd(rng));
  for (auto& x : K) x = T(nd(rng));
  CHECK_OK(simt::launch(qk_kernel<T>, dim3(1), dim3(32), 0, nullptr, Q.data(), K.data(), S.data()));
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < kKeys; ++j) {
      double ref = 0, mag = 0;
      for (int d = 0; d < kD; ++d) {
        const double pr = static_cast<double>(float(Q[i * kD + d])) * float(K[j * kD + d]);
        ref += pr;
        mag += std::fabs(pr);
      }
      CHECK(std::fabs(S[i * kKeys + j] - ref) <= 2e-6 * mag + 1e-30, "%s Q·Kᵀ [%d][%d] = %.9g, naive %.9g",
            tname<T>(), i, j, S[i * kKeys + j], ref);
    }
}

template <typename T>
void check_pv(std::mt19937& rng) {
  std::uniform_real_distribution<float> ud(0.f, 1.f);  // softmax probabilities
  std::normal_distribution<float> nd;
  std::vector<float> P(256), O(256, NAN);
  std::vector<T> V(256);
  for (auto& x : P) x = ud(rng);
  for (auto& x : V) x = T(nd(rng));
  CHECK_OK(simt::launch(pv_kernel<T>, dim3(1), dim3(32), 0, nullptr, P.data(), V.data(), O.data()));
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double ref = 0, mag = 0;
      for (int k = 0; k < 16; ++k) {  // P enters the tensor core rounded to T
        const double pr = static_cast<double>(float(T(P[i * 16 + k]))) * float(V[k * 16 + j]);
        ref += pr;
        mag += std::fabs(pr);
      }
      CHECK(std::fabs(O[i * 16 + j] - ref) <= 1e-6 * mag + 1e-30, "%s P·V [%d][%d] = %.9g, naive %.9g", tname<T>(), i,
            j, O[i * 16 + j], ref);
    }
}

// (3) Whole kernel: B = 2 sequences (q_lens 5, 21; seq_lens 5, 40 → a 19-token cached prefix), Hq 4,
// Hkv 2 (G 2), D 64, block_size 8, shuffled physical blocks, NaN in the one unused block and -1 in the
// unused table entries; a window of 9 and none.
template <typename T>
void check_kernel(std::mt19937& rng, int window) {
  constexpr int D = 64, Hq = 4, Hkv = 2, S = 8, N = 8, M = 6, G = Hq / Hkv;
  const int q_lens[2] = {5, 21}, seq_lens[2] = {5, 40}, cu[3] = {0, 5, 26};
  const int32_t tables[2][M] = {{6, -1, -1, -1, -1, -1}, {3, 0, 7, 1, 5, -1}};  // block 2, 4 unused
  std::normal_distribution<float> nd;
  std::vector<T> kc(N * S * Hkv * D), vc(kc.size()), q(cu[2] * Hq * D), out(q.size());
  for (size_t i = 0; i < kc.size(); ++i) {
    const int blk = static_cast<int>(i / (S * Hkv * D));
    const bool used = blk != 2 && blk != 4;
    kc[i] = T(used ? nd(rng) : NAN);
    vc[i] = T(used ? nd(rng) : NAN);
  }
  for (auto& x : q) x = T(nd(rng));
  std::vector<int32_t> bt(&tables[0][0], &tables[0][0] + 2 * M), cu_v(cu, cu + 3), sl(seq_lens, seq_lens + 2);
  mk::PrefillParams<T> p{};
  p.out = out.data();
  p.q = q.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.block_tables = bt.data();
  p.cu_seqlens_q = cu_v.data();
  p.seq_lens = sl.data();
  p.q_stride = Hq * D;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.S = S;
  p.M = M;
  p.N = N;
  p.window = window;
  p.scale = 0.125f;
  CHECK(mk::paged_prefill_tc_supported(p, D), "fp16/bf16 D 64 must take the tensor-core kernel");
  CHECK_OK(mk::launch_paged_prefill_tc(p, cu[2], 2, D, nullptr));
  auto at = [&](const std::vector<T>& c, int b, int j, int h, int d) {
    return static_cast<double>(float(c[((static_cast<size_t>(tables[b][j / S]) * S + j % S) * Hkv + h) * D + d]));
  };
  double worst = 0;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < q_lens[b]; ++i)
      for (int hq = 0; hq < Hq; ++hq) {
        const int pos = seq_lens[b] - q_lens[b] + i, lo = window > 0 ? std::max(0, pos - window + 1) : 0;
        const T* qr = &q[((cu[b] + i) * Hq + hq) * D];
        std::vector<double> w;
        double mx = -INFINITY, sum = 0;
        for (int j = lo; j <= pos; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += float(qr[d]) * at(kc, b, j, hq / G, d);
          w.push_back(dot * p.scale);
          mx = std::max(mx, w.back());
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int j = lo; j <= pos; ++j) o += w[j - lo] * at(vc, b, j, hq / G, d);
          const double got = float(out[((cu[b] + i) * Hq + hq) * D + d]);
          worst = std::max(worst, std::fabs(got - o / sum));
          CHECK(std::fabs(got - o / sum) <= (std::is_same_v<T, __half> ? 2e-3 : 2e-2), "%s W%d out[b%d i%d h%d d%d] = %.6g, naive %.6g",
                tname<T>(), window, b, i, hq, d, got, o / sum);
        }
      }
  std::printf("%s window %d: max |err| %.3g\n", tname<T>(), window, worst);
}

void check_rule() {
  alignas(16) static __half buf[64];
  mk::PrefillParams<__half> ph{};
  ph.out = buf;
  CHECK(mk::paged_prefill_tc_supported(ph, 128) && mk::paged_prefill_tc_supported(ph, 256), "fp16 D 128/256");
  CHECK(!mk::paged_prefill_tc_supported(ph, 48), "D 48 has no instantiation");
  ph.out = buf + 1;
  CHECK(!mk::paged_prefill_tc_supported(ph, 64), "out not 16-byte aligned → fallback");
  mk::PrefillParams<float> pf{};
  alignas(16) static float fbuf[4];
  pf.out = fbuf;
  CHECK(!mk::paged_prefill_tc_supported(pf, 64), "fp32 keeps the SIMT kernel");
  CHECK(mk::launch_paged_prefill_tc(pf, 1, 1, 64, nullptr) == cudaErrorInvalidValue, "fp32 launch refused");
}

int main() {
  std::mt19937 rng(7);
  for (const char* schedule : {"forward", "reverse", "random:5"}) {
    set_schedule(schedule);
    check_qk<__half>(rng);
    check_qk<__nv_bfloat16>(rng);
    check_pv<__half>(rng);
    check_pv<__nv_bfloat16>(rng);
    for (int window : {0, 9}) {
      check_kernel<__half>(rng, window);
      check_kernel<__nv_bfloat16>(rng, window);
    }
  }
  check_rule();
  return check_summary("test_prefill_tc_fragments");
}
