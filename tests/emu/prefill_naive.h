// prefill_naive.h — naive double-precision paged prefill attention for the standalone emulator tests: the
// reference the kernel programs (test_prefill_tc_pipeline.cpp, test_int64_addressing.cpp) compare against.
// Layout as csrc/kernels/paged_prefill.cuh: caches [N, S, Hkv, D], q / out [Tq, Hq, D], block table rows of M.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

struct NaivePrefill {
  int Hq, Hkv, D, S, M, window;
  double scale;
  // out[d] for query token i of sequence b (positions seq_len - q_len + i), head hq. `key(j, d)` / `val(j, d)`
  // return element d of logical key j of kv head hq / G.
  template <typename K, typename V, typename Q>
  std::vector<double> row(int q_len, int seq_len, int i, int hq, Q q, K key, V val) const {
    const int pos = seq_len - q_len + i, lo = window > 0 ? std::max(0, pos - window + 1) : 0;
    std::vector<double> w, o(D, 0.0);
    double mx = -INFINITY, sum = 0;
    for (int j = lo; j <= pos; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += q(d) * key(j, d);
      w.push_back(dot * scale);
      mx = std::max(mx, w.back());
    }
    for (double& x : w) sum += (x = std::exp(x - mx));
    for (int j = lo; j <= pos; ++j)
      for (int d = 0; d < D; ++d) o[d] += w[j - lo] * val(j, d) / sum;
    return o;
  }
};
