// fast_div_check.cpp — FastDiv (csrc/kernels/fast_div.h) against the hardware divide, exhaustively over
// divisors 1 … 4096 for numerators near every multiple boundary and the ends of [0, 2^31), plus random
// pairs. Prints "ok <checked>" or the first mismatch; tests/test_fast_div.py runs it (plain g++).
#include <cstdint>
#include <cstdio>
#include <random>

#include "kernels/fast_div.h"

int main() {
  int64_t checked = 0;
  const auto check = [&](int d, int n) {
    const mk::FastDiv f(d);
    ++checked;
    if (f.div(n) != n / d) {
      std::printf("mismatch: %d / %d: fast %d, exact %d\n", n, d, f.div(n), n / d);
      return false;
    }
    return true;
  };
  constexpr int kMax = 2147483647;
  for (int d = 1; d <= 4096; ++d) {
    for (int n : {0, 1, d - 1, d, d + 1, kMax, kMax - 1, kMax - d, kMax / d * d, kMax / d * d - 1})
      if (n >= 0 && !check(d, n)) return 1;
    for (int q = 1; q < 64; ++q)
      for (int e : {-1, 0, 1})
        if (const int64_t n = static_cast<int64_t>(q) * d + e; n >= 0 && n <= kMax && !check(d, static_cast<int>(n)))
          return 1;
  }
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 2000000; ++i) {
    const int d = 1 + static_cast<int>(rng() % (i % 2 ? 65536u : 2147483647u));
    const int n = static_cast<int>(rng() % 2147483648u);
    if (!check(d, n)) return 1;
  }
  std::printf("ok %lld\n", static_cast<long long>(checked));
  return 0;
}
