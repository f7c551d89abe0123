// test_asan.cpp — built with -fsanitize=address by tests/test_emulator.py. `inbounds` reads every
// element of a heap array; `oob` makes blockIdx (2,0,0) threadIdx (5,0,0) read one past the end. ASan
// must report the overflow, and the emulator's hook must name the simulated thread.
#include <cstring>

#include "emu_check.h"

__global__ void copy_kernel(const float* in, float* out, int n, bool overflow) {
  int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (overflow && blockIdx.x == 2 && threadIdx.x == 5) i = n;  // one past the end
  __syncthreads();
  if (i <= n - 1 || overflow) out[blockIdx.x * blockDim.x + threadIdx.x] = in[i] * 2.f;
}

int main(int argc, char** argv) {
  const bool overflow = argc > 1 && std::strcmp(argv[1], "oob") == 0;
  const int n = 4 * 32;
  float* in = new float[n];
  float* out = new float[n];
  for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i);
  CHECK_OK(simt::launch(copy_kernel, dim3(4), dim3(32), 0, nullptr, in, out, n, overflow));
  for (int i = 0; i < n; ++i) CHECK(out[i] == 2.f * i, "out[%d] = %f", i, out[i]);
  delete[] in;
  delete[] out;
  return check_summary("test_asan");
}
