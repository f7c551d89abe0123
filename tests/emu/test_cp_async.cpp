// test_cp_async.cpp — the emulator's cp.async timing rules: the destination holds poison (0xff bytes)
// from issue until the wait that retires its group, the copy (with zero-fill) lands at that wait, an
// empty group may stay un-waited, and a thread that exits with copies in flight faults with its
// blockIdx / threadIdx — e.g. a prefill-style kernel that loads its Q tile, then finds an empty key range
// and skips the loop whose first wait would have retired the Q group.
#include <cstring>
#include <vector>

#include "emu_check.h"

__global__ void poison_then_copy_kernel(const float* src, uint32_t* before, float* after, float* zfill) {
  __shared__ __align__(16) float buf[32];
  __shared__ __align__(16) float wide[32][4];
  const int lane = threadIdx.x;
  buf[lane] = 1.0f;
  simt::cp_async_ca<4>(&buf[lane], &src[lane]);
  std::memcpy(&before[lane], &buf[lane], 4);  // between issue and wait: poison, never the old 1.0f
  simt::cp_async_16_zfill(wide[lane], &src[lane & ~3], 4 * (lane % 4));  // lane % 4 floats, then zeros
  simt::cp_async_commit();
  simt::cp_async_wait<0>();
  after[lane] = buf[lane];
  for (int i = 0; i < 4; ++i) zfill[lane * 4 + i] = wide[lane][i];
  simt::cp_async_commit();  // an empty group left pending at exit is harmless
}

// Q tile as the first group, then one wait per key tile; ntiles = 0 leaves the Q group in flight.
__global__ void q_then_tiles_kernel(const float* q, float* out, int ntiles, int only_block) {
  SIMT_DYN_SMEM(float, qs);
  const int tid = threadIdx.x;
  if (static_cast<int>(blockIdx.x) == only_block || only_block < 0) simt::cp_async_ca<4>(&qs[tid], &q[tid]);
  simt::cp_async_commit();
  float acc = 0.f;
  for (int it = 0; it < ntiles; ++it) {
    simt::cp_async_commit();
    simt::cp_async_wait<0>();
    __syncthreads();
    acc += qs[tid];
  }
  out[blockIdx.x * blockDim.x + tid] = acc;
}

int main() {
  std::vector<float> src(32), after(32), zfill(128), q(64, 2.f), out(128);
  std::vector<uint32_t> before(32);
  for (int i = 0; i < 32; ++i) src[i] = 10.f + i;
  for (const char* schedule : {"forward", "reverse", "random:9"}) {
    set_schedule(schedule);
    CHECK_OK(simt::launch(poison_then_copy_kernel, dim3(1), dim3(32), 0, nullptr, src.data(), before.data(),
                          after.data(), zfill.data()));
    for (int l = 0; l < 32; ++l) {
      CHECK(before[l] == 0xffffffffu, "lane %d reads %08x between issue and wait, want the poison ffffffff", l, before[l]);
      CHECK(after[l] == src[l], "lane %d after the wait: %g, want %g", l, after[l], src[l]);
      for (int i = 0; i < 4; ++i) {
        const float want = i < l % 4 ? src[(l & ~3) + i] : 0.f;
        CHECK(zfill[l * 4 + i] == want, "zfill lane %d [%d] = %g, want %g", l, i, zfill[l * 4 + i], want);
      }
    }
    CHECK_OK(simt::launch(q_then_tiles_kernel, dim3(2), dim3(64), 64 * sizeof(float), nullptr, q.data(), out.data(), 2, -1));
    CHECK(out[0] == 4.f && out[127] == 4.f, "two tiles: %g %g", out[0], out[127]);
    const cudaError_t err =
        simt::launch(q_then_tiles_kernel, dim3(2), dim3(64), 64 * sizeof(float), nullptr, q.data(), out.data(), 0, 1);
    const char* msg = cudaGetErrorString(err);
    CHECK(err == cudaErrorLaunchFailure, "empty key range: got %d", static_cast<int>(err));
    for (const char* needle : {"cp.async still pending at thread exit", "0,0) of blockIdx (1,0,0) has 1 copy",
                               "1 copy in flight (1 committed group(s) not waited for", "first issued at test_cp_async.cpp:",
                               "q_then_tiles_kernel", "faulted here at thread exit"})
      CHECK(contains(msg, needle), "report lacks '%s':\n%s", needle, msg);
  }
  return check_summary("test_cp_async");
}
