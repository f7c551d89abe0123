// sass_padded.cu — one streaming loop, plain (PAD = 0) and padded with a chain of integer operations, for
// tests/test_sass_budget.py: the padded instance must measure below a bytes-per-instruction budget the plain
// one meets, so the budget check is shown to fail on a loop that spends its issue slots on bookkeeping.
#include <cstdint>

template <int PAD>
__global__ void __launch_bounds__(128) stream_sum_kernel(const int4* __restrict__ x, int n, unsigned salt,
                                                         int* __restrict__ out) {
  int acc = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int4 v = x[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
#pragma unroll
    for (int p = 0; p < PAD; ++p) salt = (salt ^ (salt >> 7)) * 0x9E3779B1u + static_cast<unsigned>(i);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc + static_cast<int>(salt);
}

template __global__ void stream_sum_kernel<0>(const int4*, int, unsigned, int*);
template __global__ void stream_sum_kernel<16>(const int4*, int, unsigned, int*);
