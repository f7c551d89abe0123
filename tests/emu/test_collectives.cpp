// test_collectives.cpp — barrier, static/dynamic shared memory, shuffles (all modes and widths),
// votes, __syncthreads_count, block_sum, atomics: each kernel's result is checked against values
// computed here directly from the definitions, under every schedule order.
#include <numeric>
#include <vector>

#include "emu_check.h"

// Barrier + static shared memory: each thread writes, then reads its mirror's slot.
__global__ void mirror_kernel(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = static_cast<int>(threadIdx.x * 3 + blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// Dynamic shared memory, several barriers in a loop: prefix sum (Hillis–Steele).
__global__ void scan_kernel(const int* in, int* out, int n) {
  SIMT_DYN_SMEM(int, buf);
  const int t = threadIdx.x;
  buf[t] = in[t];
  __syncthreads();
  for (int off = 1; off < n; off *= 2) {
    const int add = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += add;
    __syncthreads();
  }
  out[t] = buf[t];
}

// Every shuffle flavour on 64 threads (2 warps). Values are lane-tagged: v = 1000·warp + lane.
__global__ void shuffle_kernel(int* out, int width) {
  const int lane = threadIdx.x & 31;
  const int v = 1000 * static_cast<int>(threadIdx.x >> 5) + lane;
  int* o = out + threadIdx.x * 8;
  o[0] = simt::shfl(v, (lane * 7 + 3) & 31);
  o[1] = simt::shfl_xor(v, 5);
  o[2] = simt::shfl_up(v, 3u);
  o[3] = simt::shfl_down(v, 3u);
  o[4] = __shfl_sync(0xffffffffu, v, lane + 1, width);
  o[5] = __shfl_xor_sync(0xffffffffu, v, width + 1, width);  // may reach a lower segment, never a higher one
  o[6] = __shfl_up_sync(0xffffffffu, v, 2, width);
  o[7] = __shfl_down_sync(0xffffffffu, v, 2, width);
}

__global__ void shuffle64_kernel(double* out) {
  const double v = 0.5 + threadIdx.x;
  out[threadIdx.x] = simt::shfl_xor(v, 1) + __shfl_sync(0xffffffffu, static_cast<long long>(threadIdx.x) << 40, 31);
}

__global__ void vote_kernel(unsigned* out) {
  const int lane = threadIdx.x & 31;
  out[threadIdx.x * 4 + 0] = simt::ballot(lane % 3 == 0);
  out[threadIdx.x * 4 + 1] = simt::all(lane < 32);
  out[threadIdx.x * 4 + 2] = simt::any(lane == 17 && threadIdx.x < 32);
  out[threadIdx.x * 4 + 3] = static_cast<unsigned>(__syncthreads_count(threadIdx.x % 5 == 0)) +
                             1000u * static_cast<unsigned>(__syncthreads_and(threadIdx.x < 1000)) +
                             10000u * static_cast<unsigned>(__syncthreads_or(threadIdx.x == 77));
}

__global__ void block_sum_kernel(const float* in, float* out) {
  __shared__ float scratch[32];
  const float total = simt::block_sum(in[blockIdx.x * blockDim.x + threadIdx.x], scratch);
  __syncwarp();
  if (threadIdx.x == 5) out[blockIdx.x] = total;
}

__global__ void atomics_kernel(int* counter, float* fsum, int* imax) {
  atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f);
  atomicMax(imax, static_cast<int>(blockIdx.x * 1000 + threadIdx.x));
}

// What the PTX shfl modes return, written from the CUDA programming guide's description.
int expect_shfl(int mode, int tid, int b, int width) {
  const int lane = tid & 31, base = tid & ~31, seg = lane / width * width;
  auto val = [&](int l) { return 1000 * (tid >> 5) + l; };
  switch (mode) {
    case 0: return val(seg + (b % width));                                  // idx within segment
    case 1: return (lane ^ b) < seg + width ? val(lane ^ b) : val(lane);    // xor, no access upward
    case 2: return lane - seg >= b ? val(lane - b) : val(lane);             // up
    case 3: return lane - seg + b < width ? val(lane + b) : val(lane);      // down
  }
  (void)base;
  return -1;
}

void test_mirror_and_scan() {
  std::vector<int> out(4 * 256);
  CHECK_OK(simt::launch(mirror_kernel, dim3(4), dim3(256), 0, nullptr, out.data()));
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 256; ++t) CHECK(out[b * 256 + t] == (255 - t) * 3 + b, "block %d thread %d", b, t);

  const int n = 200;
  std::vector<int> in(n), scan(n);
  for (int i = 0; i < n; ++i) in[i] = (i * 37) % 11 - 5;
  CHECK_OK(simt::launch(scan_kernel, dim3(1), dim3(n), n * sizeof(int), nullptr, in.data(), scan.data(), n));
  int acc = 0;
  for (int i = 0; i < n; ++i) CHECK(scan[i] == (acc += in[i]), "scan[%d] = %d", i, scan[i]);
}

void test_shuffles() {
  for (int width : {32, 16, 8, 4}) {
    std::vector<int> out(64 * 8);
    CHECK_OK(simt::launch(shuffle_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), width));
    for (int t = 0; t < 64; ++t) {
      const int lane = t & 31;
      const int* o = &out[t * 8];
      CHECK(o[0] == expect_shfl(0, t, (lane * 7 + 3) & 31, 32), "shfl t=%d got %d", t, o[0]);
      CHECK(o[1] == expect_shfl(1, t, 5, 32), "shfl_xor t=%d got %d", t, o[1]);
      CHECK(o[2] == expect_shfl(2, t, 3, 32), "shfl_up t=%d got %d", t, o[2]);
      CHECK(o[3] == expect_shfl(3, t, 3, 32), "shfl_down t=%d got %d", t, o[3]);
      CHECK(o[4] == expect_shfl(0, t, lane + 1, width), "width %d shfl t=%d got %d", width, t, o[4]);
      CHECK(o[5] == expect_shfl(1, t, width + 1, width), "width %d xor t=%d got %d", width, t, o[5]);
      CHECK(o[6] == expect_shfl(2, t, 2, width), "width %d up t=%d got %d", width, t, o[6]);
      CHECK(o[7] == expect_shfl(3, t, 2, width), "width %d down t=%d got %d", width, t, o[7]);
    }
  }
  std::vector<double> d(32);
  CHECK_OK(simt::launch(shuffle64_kernel, dim3(1), dim3(32), 0, nullptr, d.data()));
  for (int t = 0; t < 32; ++t) {
    const double expect = 0.5 + (t ^ 1) + static_cast<double>(31LL << 40);
    CHECK(d[t] == expect, "64-bit shuffle t=%d got %f", t, d[t]);
  }
}

void test_votes() {
  std::vector<unsigned> out(96 * 4);
  CHECK_OK(simt::launch(vote_kernel, dim3(1), dim3(96), 0, nullptr, out.data()));
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  const unsigned count = 20;  // t % 5 == 0 for t < 96
  for (int t = 0; t < 96; ++t) {
    CHECK(out[t * 4 + 0] == ballot, "ballot t=%d %08x", t, out[t * 4]);
    CHECK(out[t * 4 + 1] == 1, "all t=%d", t);
    CHECK(out[t * 4 + 2] == (t < 32 ? 1u : 0u), "any t=%d", t);
    CHECK(out[t * 4 + 3] == count + 1000 + 10000, "syncthreads_count/and/or t=%d got %u", t, out[t * 4 + 3]);
  }
}

void test_block_sum_and_atomics() {
  const int blocks = 3, threads = 512;
  std::vector<float> in(blocks * threads), out(blocks);
  for (int i = 0; i < blocks * threads; ++i) in[i] = static_cast<float>((i * 13) % 7);  // small ints: exact sums
  CHECK_OK(simt::launch(block_sum_kernel, dim3(blocks), dim3(threads), 0, nullptr, in.data(), out.data()));
  for (int b = 0; b < blocks; ++b) {
    const float expect = std::accumulate(in.begin() + b * threads, in.begin() + (b + 1) * threads, 0.f);
    CHECK(out[b] == expect, "block_sum block %d: %f vs %f", b, out[b], expect);
  }
  int counter = 0, imax = -1;
  float fsum = 0;
  CHECK_OK(simt::launch(atomics_kernel, dim3(7), dim3(64), 0, nullptr, &counter, &fsum, &imax));
  CHECK(counter == 7 * 64 && fsum == 7 * 64 * 0.5f && imax == 6063, "atomics %d %f %d", counter, fsum, imax);
}

int main() {
  for (const char* schedule : {"forward", "reverse", "random:7", "random"}) {
    set_schedule(schedule);
    test_mirror_and_scan();
    test_shuffles();
    test_votes();
    test_block_sum_and_atomics();
  }
  return check_summary("test_collectives");
}
