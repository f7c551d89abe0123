// test_prefill_tc_pipeline.cpp — the cp.async double buffering of csrc/kernels/paged_prefill_tc.cuh under
// the emulator's poison-at-issue rule: a case where the warps of one block do unequal work (warp 3 has no
// rows, warp 0's rows stop seeing keys early under a window), so a warp that skips the mma work of a tile
// reaches the next prefetch while the other warps still read the stage it refills. With the kernel's
// trailing __syncthreads the result matches naive attention; tests/test_emu_mutations.py compiles this
// same program against a copy of the kernel without that barrier and expects it to fail (the prefetch
// poisons a stage that is still being read).
#include <cstring>
#include <random>
#include <vector>

#include "emu_check.h"
#include "kernels/paged_prefill_tc.cuh"
#include "prefill_naive.h"

template <typename T>
void check(std::mt19937& rng, int window) {
  constexpr int D = 128, Hq = 2, Hkv = 1, S = 16, N = 16, M = 14, G = Hq / Hkv;
  const int q_len = 20, seq_len = 200;  // 40 rows: warps 0-2 have rows, warp 3 none; 7 K/V tiles of 32
  std::vector<int32_t> table(M), cu = {0, q_len}, lens = {seq_len};
  for (int i = 0; i < M; ++i) table[i] = (i * 5 + 3) % N;  // shuffled physical blocks
  std::normal_distribution<float> nd;
  std::vector<T> kc(static_cast<size_t>(N) * S * Hkv * D), vc(kc.size()), q(q_len * Hq * D), out(q.size());
  for (auto& x : kc) x = T(nd(rng));
  for (auto& x : vc) x = T(nd(rng));
  for (auto& x : q) x = T(nd(rng));
  mk::PrefillParams<T> p{};
  p.out = out.data();
  p.q = q.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.block_tables = table.data();
  p.cu_seqlens_q = cu.data();
  p.seq_lens = lens.data();
  p.q_stride = Hq * D;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.S = S;
  p.M = M;
  p.N = N;
  p.window = window;
  p.scale = 0.088f;
  const cudaError_t err = mk::launch_paged_prefill_tc(p, q_len, 1, D, nullptr);
  CHECK_OK(err);
  if (err != cudaSuccess) return;
  const NaivePrefill ref{Hq, Hkv, D, S, M, window, p.scale};
  auto elem = [&](const std::vector<T>& c, int j, int d) {
    return static_cast<double>(float(c[(static_cast<size_t>(table[j / S]) * S + j % S) * Hkv * D + d]));
  };
  int bad = 0;
  for (int i = 0; i < q_len; ++i)
    for (int hq = 0; hq < Hq; ++hq) {
      const auto o = ref.row(q_len, seq_len, i, hq, [&](int d) { return double(float(q[(i * Hq + hq) * D + d])); },
                             [&](int j, int d) { return elem(kc, j, d); }, [&](int j, int d) { return elem(vc, j, d); });
      for (int d = 0; d < D; ++d) {
        const double got = float(out[(i * Hq + hq) * D + d]);
        if (!(std::fabs(got - o[d]) <= (std::is_same_v<T, __half> ? 2e-3 : 2e-2)) && bad++ < 3)
          CHECK(false, "window %d out[i%d h%d d%d] = %.6g, naive %.6g", window, i, hq, d, got, o[d]);
      }
    }
}

int main() {
  std::mt19937 rng(11);
  for (const char* schedule : {"forward", "reverse", "random:3"}) {
    set_schedule(schedule);
    for (int window : {0, 24}) {
      check<__half>(rng, window);
      check<__nv_bfloat16>(rng, window);
    }
  }
  return check_summary("test_prefill_tc_pipeline");
}
