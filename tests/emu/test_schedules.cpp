// test_schedules.cpp — a kernel with a deliberately missing __syncthreads: each thread publishes a value
// in shared memory and reads its left neighbour's without a barrier in between. The forward schedule
// happens to run thread t-1 before thread t, so it hides the race; reverse and random orders expose it
// (the neighbour has not written yet: the read sees the emulator's 0xff shared-memory poison). With the
// barrier, every order gives the right answer.
#include <vector>

#include "emu_check.h"

template <bool WITH_BARRIER>
__global__ void neighbour_kernel(int* out) {
  SIMT_DYN_SMEM(int, s);
  const int t = threadIdx.x;
  s[t] = 10 * t + 1;
  if constexpr (WITH_BARRIER) __syncthreads();
  out[blockIdx.x * blockDim.x + t] = t > 0 ? s[t - 1] : -1;
}

template <bool WITH_BARRIER>
bool run_correct(const char* schedule) {
  set_schedule(schedule);
  const int blocks = 2, n = 64;
  std::vector<int> out(blocks * n, 0);
  const cudaError_t err =
      simt::launch(neighbour_kernel<WITH_BARRIER>, dim3(blocks), dim3(n), n * sizeof(int), nullptr, out.data());
  CHECK_OK(err);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t)
      if (out[b * n + t] != (t > 0 ? 10 * (t - 1) + 1 : -1)) return false;
  return true;
}

int main() {
  CHECK(run_correct<false>("forward"), "forward runs thread t-1 first: the race stays hidden");
  CHECK(!run_correct<false>("reverse"), "reverse order must expose the missing __syncthreads");
  for (const char* seed : {"random:1", "random:2", "random:3", "random"})
    CHECK(!run_correct<false>(seed), "%s must expose the missing __syncthreads", seed);
  for (const char* schedule : {"forward", "reverse", "random:1", "random"})
    CHECK(run_correct<true>(schedule), "with the barrier, %s must be correct", schedule);

  set_schedule("sideways");
  int dummy[64];
  const cudaError_t err = simt::launch(neighbour_kernel<true>, dim3(1), dim3(64), 256, nullptr, dummy);
  CHECK(err == cudaErrorInvalidValue && contains(cudaGetErrorString(err), "MK_SIMT_SCHEDULE"),
        "an unknown schedule is an error: %s", cudaGetErrorString(err));
  return check_summary("test_schedules");
}
