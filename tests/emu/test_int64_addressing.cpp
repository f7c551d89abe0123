// test_int64_addressing.cpp — the attention kernels address caches of more than 2^31 elements: K/V caches
// [N, S, Hkv, D] of 2^31 + 16 blocks' worth of elements reserved as virtual memory only (mmap,
// MAP_NORESERVE; the untouched pages never exist), a few blocks with ids above 2^31 / (S·Hkv·D) written,
// then decode (fp16, fp32), the tensor-core prefill (fp16) and the SIMT prefill (fp32) against naive
// attention. An int32 overflow in a slot or row offset reads the wrong (unwritten, zero) page.
#include <sys/mman.h>

#include <cstring>
#include <random>
#include <vector>

#include "emu_check.h"
#include "kernels/paged_decode.cuh"
#include "kernels/paged_prefill.cuh"
#include "kernels/paged_prefill_tc.cuh"
#include "prefill_naive.h"

constexpr int S = 16, Hkv = 2, D = 128, Hq = 4;
constexpr int64_t kBlockElems = int64_t{S} * Hkv * D;
constexpr int64_t N = (int64_t{1} << 31) / kBlockElems + 16;  // > 2^31 elements in all
constexpr int M = 3;
const int32_t kTable[M] = {static_cast<int32_t>(N - 3), 7, static_cast<int32_t>(N - 14)};  // 2 of 3 above 2^31
constexpr int kSeqLen = 40;

template <typename T>
struct VirtualCache {
  T* data;
  size_t bytes;
  VirtualCache() : bytes(static_cast<size_t>(N * kBlockElems) * sizeof(T)) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<T*>(p);
  }
  ~VirtualCache() {
    if (data) munmap(data, bytes);
  }
  T& at(int j, int h, int d) { return data[(static_cast<int64_t>(kTable[j / S]) * S + j % S) * Hkv * D + h * D + d]; }
};

template <typename T>
double tol() {
  return std::is_same_v<T, float> ? 1e-4 : 2e-3;
}

template <typename T>
void fill(VirtualCache<T>& k, VirtualCache<T>& v, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  for (int j = 0; j < kSeqLen; ++j)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        k.at(j, h, d) = T(nd(rng));
        v.at(j, h, d) = T(nd(rng));
      }
}

template <typename T>
int compare(const char* what, const std::vector<T>& out, const std::vector<T>& q, int q_len, VirtualCache<T>& k,
            VirtualCache<T>& v, float scale) {
  const NaivePrefill ref{Hq, Hkv, D, S, M, 0, scale};
  int bad = 0;
  for (int i = 0; i < q_len; ++i)
    for (int hq = 0; hq < Hq; ++hq) {
      const int h = hq / (Hq / Hkv);
      const auto o = ref.row(q_len, kSeqLen, i, hq, [&](int d) { return double(float(q[(i * Hq + hq) * D + d])); },
                             [&](int j, int d) { return double(float(k.at(j, h, d))); },
                             [&](int j, int d) { return double(float(v.at(j, h, d))); });
      for (int d = 0; d < D; ++d) {
        const double got = float(out[(i * Hq + hq) * D + d]);
        if (!(std::fabs(got - o[d]) <= tol<T>()) && bad++ < 3)
          CHECK(false, "%s out[i%d h%d d%d] = %.6g, naive %.6g", what, i, hq, d, got, o[d]);
      }
    }
  return bad;
}

template <typename T>
void decode(std::mt19937& rng) {
  VirtualCache<T> k, v;
  CHECK(k.data && v.data, "mmap of %zu bytes failed", k.bytes);
  if (!k.data || !v.data) return;
  fill(k, v, rng);
  std::normal_distribution<float> nd;
  std::vector<T> q(Hq * D), out(q.size());
  for (auto& x : q) x = T(nd(rng));
  std::vector<int32_t> table(kTable, kTable + M), lens = {kSeqLen};
  mk::DecodeParams<T> p{};
  p.k_cache = k.data;
  p.v_cache = v.data;
  p.block_tables = table.data();
  p.Hkv = Hkv;
  p.S = S;
  p.M = M;
  p.N = static_cast<int>(N);
  p.out = out.data();
  p.q = q.data();
  p.seq_lens = lens.data();
  p.q_stride = Hq * D;
  p.B = 1;
  p.Hq = Hq;
  p.part_size = 1 << 20;
  p.P = 1;
  p.scale = 0.09f;
  CHECK_OK(mk::launch_paged_decode(p, D, nullptr));
  compare(std::is_same_v<T, float> ? "decode fp32" : "decode fp16", out, q, 1, k, v, p.scale);
}

template <typename T>
void prefill(std::mt19937& rng) {
  VirtualCache<T> k, v;
  CHECK(k.data && v.data, "mmap of %zu bytes failed", k.bytes);
  if (!k.data || !v.data) return;
  fill(k, v, rng);
  constexpr int q_len = 9;
  std::normal_distribution<float> nd;
  std::vector<T> q(q_len * Hq * D), out(q.size());
  for (auto& x : q) x = T(nd(rng));
  std::vector<int32_t> table(kTable, kTable + M), lens = {kSeqLen}, cu = {0, q_len};
  mk::PrefillParams<T> p{};
  p.k_cache = k.data;
  p.v_cache = v.data;
  p.block_tables = table.data();
  p.Hkv = Hkv;
  p.S = S;
  p.M = M;
  p.N = static_cast<int>(N);
  p.out = out.data();
  p.q = q.data();
  p.cu_seqlens_q = cu.data();
  p.seq_lens = lens.data();
  p.q_stride = Hq * D;
  p.Hq = Hq;
  p.scale = 0.09f;
  if constexpr (mk::kPrefillTcType<T>) {
    CHECK_OK(mk::launch_paged_prefill_tc(p, q_len, 1, D, nullptr));
    compare("prefill_tc fp16", out, q, q_len, k, v, p.scale);
  } else {
    CHECK_OK(mk::launch_paged_prefill(p, q_len, 1, D, nullptr));
    compare("prefill fp32", out, q, q_len, k, v, p.scale);
  }
}

int main() {
  std::mt19937 rng(13);
  static_assert(N * kBlockElems > (int64_t{1} << 31), "the cache must exceed 2^31 elements");
  decode<__half>(rng);
  decode<float>(rng);
  prefill<__half>(rng);
  prefill<float>(rng);
  return check_summary("test_int64_addressing");
}
