// fast_div.h — division of non-negative 31-bit integers by a run-time divisor without a divide: the
// divisor d ≥ 1 is turned once into a multiplier m and shift s, then n / d = (n · m) >> s, one wide
// multiply and a shift (a hardware-less integer divide costs ~20 instructions on a GPU).
// Exactness (Granlund & Montgomery; Hacker's Delight 10-9): with l = ceil(log2 d), m = ceil(2^(31+l) / d)
// gives 2^(31+l) ≤ m·d ≤ 2^(31+l) + 2^l, hence floor(m·n / 2^(31+l)) = floor(n / d) for 0 ≤ n < 2^31; and
// m ≤ 2^32 - 1 (m = 2^31 for powers of two), so it fits 32 bits.
#pragma once

#include <cstdint>

#include "../abi.h"

#if defined(__CUDACC__)
#define MK_FASTDIV_HD __host__ __device__ __forceinline__
#else
#define MK_FASTDIV_HD inline
#endif

namespace mk::inline MK_ABI {

struct FastDiv {
  uint32_t mul = 1u << 31;
  int shift = 31;  // 31 + l
  int d = 1;

  FastDiv() = default;
  // d ≥ 1 (callers validate their divisors; d ≤ 0 is treated as 1).
  MK_FASTDIV_HD explicit FastDiv(int divisor) : d(divisor < 1 ? 1 : divisor) {
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    const uint64_t num = uint64_t{1} << (31 + l);
    mul = static_cast<uint32_t>((num + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
    shift = 31 + l;
  }
  // n / d for 0 ≤ n < 2^31.
  MK_FASTDIV_HD int div(int n) const {
    return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> shift);
  }
};

}  // namespace mk::inline MK_ABI
