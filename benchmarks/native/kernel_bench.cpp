// benchmarks/native/kernel_bench.cpp — a ctypes-loaded driver for the per-ISA decode kernels (csrc/cpu/isa:
// gemv_rows, quant_gemv), built with them into a standalone shared library by benchmarks/bench_cpu_kernels.py
// (no torch: nothing between the timer and the kernel). Each pass walks a pool of weight matrices larger than
// the L3 cache, so every byte comes from memory as in a decode step; with T threads each thread computes its
// column slice of one matrix (the split of csrc/cpu/decode_step.h) between two spin barriers, and the
// fastest such call is reported (on a loaded machine the least disturbed one). Also the read and copy
// bandwidth of the same threads in items of the same kind, the bounds of the tables.
// Shapes: M rows of x, N out features, K in features; nmat matrices in the pool.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu/isa/gemv.h"
#include "cpu/isa/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using namespace mk::cpu;

#define MKB_LEVELS(fn) \
  { &isa_avx512bf16::fn, &isa_avx512::fn, &isa_avx2::fn, &isa_generic::fn }

const decltype(&isa_generic::gemv_rows) kGemv[4] = MKB_LEVELS(gemv_rows);
const decltype(&isa_generic::quant_gemv) kQGemv[4] = MKB_LEVELS(quant_gemv);
const decltype(&isa_generic::quant_prepare_x) kQPrep[4] = MKB_LEVELS(quant_prepare_x);
const decltype(&isa_generic::quant_bf16_path) kQPath[4] = MKB_LEVELS(quant_bf16_path);
#if defined(MK_QUANT_PREPARE_X8K)  // trees with the K-quants' per-256 path (absent in older baselines)
const decltype(&isa_generic::quant_prepare_x8k) kQPrep8k[4] = MKB_LEVELS(quant_prepare_x8k);
#endif

// Sense-reversing spin barrier (yields after a while: the machine may be shared).
struct Barrier {
  std::atomic<int> count{0};
  std::atomic<int> sense{0};
  int n;
  explicit Barrier(int n_) : n(n_) {}
  void wait(int& local) {
    local ^= 1;
    if (count.fetch_add(1) == n - 1) {
      count.store(0);
      sense.store(local);
    } else {
      int spins = 0;
      while (sense.load(std::memory_order_acquire) != local)
        if (++spins > 2000) std::this_thread::yield();
    }
  }
};

// Runs item(t, i) for i in [0, nitems) on `threads` threads, `reps` passes, the threads meeting at a barrier
// around every item; returns the fastest item in seconds. On a shared machine the fastest of many short
// items is the least disturbed one (a pass of many items rarely runs uninterrupted).
template <typename F>
double timed_items(int threads, int reps, int nitems, F&& item) {
  Barrier bar(threads);
  double best = 1e30;
  auto worker = [&](int t) {
    int local = 0;
    for (int r = 0; r < reps + 1; ++r)  // pass 0: warm-up (page faults, frequency)
      for (int i = 0; i < nitems; ++i) {
        bar.wait(local);
        const auto t0 = std::chrono::steady_clock::now();
        item(t, i);
        bar.wait(local);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0 && t == 0) best = std::min(best, s);
      }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  return best;
}

// decode_step.h's split: [n0, n1) of thread t, multiples of `align` columns.
void split(int64_t n, int t, int team, int64_t align, int64_t& n0, int64_t& n1) {
  const int64_t units = (n + align - 1) / align;
  const int64_t per = units / team, extra = units % team;
  const int64_t u0 = t * per + std::min<int64_t>(t, extra), u1 = u0 + per + (t < extra ? 1 : 0);
  n0 = std::min(n, u0 * align);
  n1 = std::min(n, u1 * align);
}

// Columns per timed call: the whole matrix up to 4 MB, else the largest divisor of N that is a multiple of 64
// with at most 4 MB (a long call on a shared machine is rarely undisturbed; the kernel's contract is any
// column range, so a large matrix is timed as consecutive column blocks, the time scaled back up).
int64_t column_block(int64_t N, int64_t row_bytes) {
  if (N * row_bytes <= (4 << 20)) return N;
  for (int64_t nc = (4 << 20) / row_bytes / 64 * 64; nc >= 64; nc -= 64)
    if (N % nc == 0) return nc;
  return N;
}

uint16_t bf16_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// Bytes of one packed row of K weights and the offsets of the fp16 scale fields in a block.
struct QGeo {
  int qk, bytes, f16a, f16b;  // f16b < 0: one scale field
};
QGeo qgeo(int qtype) {
  switch (qtype) {
    case 2: return {32, 18, 0, -1};     // Q4_0
    case 3: return {32, 20, 0, 2};      // Q4_1
    case 8: return {32, 34, 0, -1};     // Q8_0
    case 12: return {256, 144, 0, 2};   // Q4_K
    case 13: return {256, 176, 0, 2};   // Q5_K
    case 14: return {256, 210, 208, -1};  // Q6_K
    default: return {1, 1, -1, -1};     // INT8_ROWWISE
  }
}

}  // namespace

extern "C" {

// GB/s of reading (sum of 64-bit words) or copying (reads + writes) items of `chunk` bytes of a `bytes`
// buffer, `threads` threads splitting each item; the fastest item.
__attribute__((visibility("default"))) double mkb_read_gbs(int threads, int64_t bytes, int64_t chunk, int reps) {
  const int64_t words = bytes / 8, cw = chunk / 8;
  std::vector<uint64_t> buf(words, 1);
  std::vector<uint64_t> sink(threads * 8);
  const double s = timed_items(threads, reps, static_cast<int>(words / cw), [&](int t, int i) {
    int64_t w0, w1;
    split(cw, t, threads, 64, w0, w1);
    const uint64_t* p = buf.data() + i * cw;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int64_t j = w0; j + 4 <= w1; j += 4) a0 += p[j], a1 += p[j + 1], a2 += p[j + 2], a3 += p[j + 3];
    sink[t * 8] = a0 + a1 + a2 + a3;
  });
  return static_cast<double>(cw * 8) / s / 1e9;
}

__attribute__((visibility("default"))) double mkb_copy_gbs(int threads, int64_t bytes, int64_t chunk, int reps) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  const double s = timed_items(threads, reps, static_cast<int>(bytes / chunk), [&](int t, int i) {
    int64_t b0, b1;
    split(chunk, t, threads, 4096, b0, b1);
    std::memcpy(b.data() + i * chunk + b0, a.data() + i * chunk + b0, b1 - b0);
  });
  return 2.0 * static_cast<double>(chunk) / s / 1e9;
}

// Seconds per matrix of gemv_rows (the fastest call, × column blocks) on one of nmat [N, K] matrices (elem 0 fp32, 1 bf16, 2 fp16), M rows of x.
__attribute__((visibility("default"))) double mkb_gemv(int level, int elem, int M, int64_t N, int64_t K, int threads,
                                                       int nmat, int reps) {
  const int es = elem == 0 ? 4 : 2;
  const int64_t mbytes = N * K * es;
  std::vector<uint8_t> pool(mbytes * nmat);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](uint8_t* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = u(rng);
      if (es == 4)
        std::memcpy(p + 4 * i, &v, 4);
      else {
        const uint16_t h = elem == 1 ? bf16_of(v) : static_cast<uint16_t>(0x3000 | (rng() & 0x3ff) | ((rng() & 1) << 15));
        std::memcpy(p + 2 * i, &h, 2);
      }
    }
  };
  fill(pool.data(), N * K);
  for (int i = 1; i < nmat; ++i) std::memcpy(pool.data() + i * mbytes, pool.data(), mbytes);
  std::vector<uint8_t> x(M * K * es), y(static_cast<size_t>(threads) * M * N * es);
  fill(x.data(), M * K);
  const auto fn = kGemv[level];
  const int64_t NC = column_block(N, K * es);
  return timed_items(threads, reps, nmat * static_cast<int>(N / NC), [&](int t, int i) {
    int64_t n0, n1;
    split(NC, t, threads, 8, n0, n1);
    const int64_t c0 = (i % (N / NC)) * NC;
    uint8_t* yt = y.data() + static_cast<size_t>(t) * M * N * es;
    fn(static_cast<Elem>(elem), yt, N, x.data(), K, pool.data() + (i / (N / NC)) * mbytes, K, M, c0 + n0, c0 + n1);
  }) * static_cast<double>(N / NC);
}

// Packed bytes of one [N, K] matrix of format qtype (GGML code; 1000 INT8_ROWWISE, without its scales).
__attribute__((visibility("default"))) int64_t mkb_qbytes(int qtype, int64_t N, int64_t K) {
  const QGeo g = qgeo(qtype);
  return N * (K / g.qk) * g.bytes;
}

// Seconds per matrix of quant_gemv (as mkb_gemv) on one of nmat packed [N, K] matrices; x fp32 (xbf16 = 0: the fp32 path)
// or bf16 (the level's path for bf16 x: int8 / bf16 / fp32). x is prepared once, outside the timing.
__attribute__((visibility("default"))) double mkb_quant(int level, int qtype, int xbf16, int M, int64_t N, int64_t K,
                                                        int threads, int nmat, int reps, int* path_out) {
  const QGeo g = qgeo(qtype);
  const int64_t mbytes = mkb_qbytes(qtype, N, K);
  std::vector<uint8_t> pool(mbytes * nmat);
  std::mt19937 rng(2);
  for (int64_t i = 0; i < mbytes; ++i) pool[i] = static_cast<uint8_t>(rng());
  if (g.f16a >= 0)
    for (int64_t b = 0; b < mbytes / g.bytes; ++b) {  // finite, small scales
      const uint16_t d = 0x2000 | (rng() & 0x3ff);
      std::memcpy(&pool[b * g.bytes + g.f16a], &d, 2);
      if (g.f16b >= 0) std::memcpy(&pool[b * g.bytes + g.f16b], &d, 2);
    }
  for (int i = 1; i < nmat; ++i) std::memcpy(pool.data() + i * mbytes, pool.data(), mbytes);
  std::vector<float> scales(N, 0.01f);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> xf(M * K);
  std::vector<uint16_t> xb(M * K);
  for (int64_t i = 0; i < M * K; ++i) xf[i] = u(rng), xb[i] = bf16_of(xf[i]);
  const int64_t C = K / 32;
  std::vector<float> s0(M * C + 1), s1(M * C + 1);
  std::vector<int8_t> xq(M * K);
  const QPath path = xbf16 && qtype != 1000 ? static_cast<QPath>(kQPath[level](qtype)) : QPath::fp32;
  if (path_out) *path_out = static_cast<int>(path);
  const int16_t* bs = nullptr;
#if defined(MK_QUANT_PREPARE_X8K)
  if (path == QPath::int8k) {  // dk in s0, Σ q per 16 (int16) in s1's bytes
    bs = reinterpret_cast<const int16_t*>(s1.data());
    kQPrep8k[level](xb.data(), M, K, xq.data(), s0.data(), reinterpret_cast<int16_t*>(s1.data()));
  } else
#endif
  if (path != QPath::fp32) kQPrep[level](static_cast<int>(path), xb.data(), M, K, xq.data(), s0.data(), s1.data());
  std::vector<uint16_t> y(static_cast<size_t>(threads) * M * N * 2);
  const auto fn = kQGemv[level];
  const int64_t NC = column_block(N, mbytes / N);
  return timed_items(threads, reps, nmat * static_cast<int>(N / NC), [&](int t, int i) {
    int64_t n0, n1;
    split(NC, t, threads, 8, n0, n1);
    const int64_t c0 = (i % (N / NC)) * NC;
    QGemv a{path, qtype, pool.data() + (i / (N / NC)) * mbytes, scales.data(), K, M, xf.data(), xb.data(), xq.data(),
            s0.data(), s1.data(), xbf16 != 0, y.data() + static_cast<size_t>(t) * M * N * 2, N};
#if defined(MK_QUANT_PREPARE_X8K)
    a.bs = bs;
#endif
    fn(a, c0 + n0, c0 + n1);
  }) * static_cast<double>(N / NC);
}

}  // extern "C"
