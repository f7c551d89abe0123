// test_threads.cpp — blocks spread over OS threads (MK_SIMT_THREADS): all blocks run exactly once,
// more than one OS thread takes part, __shared__ stays private to each block while blocks run
// concurrently, and atomics combine across OS threads. Results equal the single-threaded run's.
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "emu_check.h"

__global__ void busy_block_kernel(int* out, size_t* os_thread, int* counter, int rounds) {
  __shared__ int owner[128];
  for (int r = 0; r < rounds; ++r) {
    owner[threadIdx.x] = static_cast<int>(blockIdx.x);
    __syncthreads();
    // Another block writing our shared array (if it were shared between OS threads) would show here.
    if (owner[(threadIdx.x + r) % blockDim.x] != static_cast<int>(blockIdx.x)) out[blockIdx.x] = -1;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (out[blockIdx.x] == 0) out[blockIdx.x] = static_cast<int>(blockIdx.x) + 1;
    os_thread[blockIdx.x] = std::hash<std::thread::id>{}(std::this_thread::get_id());
  }
  atomicAdd(counter, 1);
}

int main() {
  const int blocks = 64, threads = 128, rounds = 100;  // ~0.1 s: long enough for a worker to wake
  for (const char* n : {"1", "2", "3"}) {
    setenv("MK_SIMT_THREADS", n, 1);
    std::vector<int> out(blocks, 0);
    std::vector<size_t> os_thread(blocks, 0);
    int counter = 0;
    CHECK_OK(simt::launch(busy_block_kernel, dim3(blocks), dim3(threads), 0, nullptr, out.data(), os_thread.data(),
                          &counter, rounds));
    for (int b = 0; b < blocks; ++b) CHECK(out[b] == b + 1, "MK_SIMT_THREADS=%s block %d: %d", n, b, out[b]);
    CHECK(counter == blocks * threads, "MK_SIMT_THREADS=%s: counter %d", n, counter);
    const std::set<size_t> distinct(os_thread.begin(), os_thread.end());
    if (n[0] == '1') CHECK(distinct.size() == 1, "one OS thread expected, saw %zu", distinct.size());
    else CHECK(distinct.size() >= 2, "MK_SIMT_THREADS=%s: blocks ran on %zu OS thread(s)", n, distinct.size());
  }
  return check_summary("test_threads");
}
