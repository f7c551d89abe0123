// test_failures.cpp — what must fail cleanly instead of hanging or crashing: deadlocks (partial-mask
// collective, a collective half the warp never reaches, __syncthreads with exited threads or at
// different call sites), kernel faults (misaligned ldmatrix), invalid launch configurations. Each
// returns an error whose cudaGetErrorString names the cause and the threads' states; the runtime
// keeps working afterwards.
#include <vector>

#include "emu_check.h"

__global__ void partial_mask_kernel(float* out) {
  float v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_xor_sync(0x0000ffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void half_warp_collective_kernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = simt::shfl_xor(1.0f, 1);
}

__global__ void barrier_after_exit_kernel(int* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x % 2) {
    out[threadIdx.x] = 1;
    __syncthreads();
  } else {
    out[threadIdx.x] = 2;
    __syncthreads();
  }
}

// One shuffle per branch of a divergent `if`: same kind, two call sites — not one warp instruction.
__global__ void split_collective_kernel(float* out) {
  float v = threadIdx.x;
  if (threadIdx.x & 1)
    v = simt::shfl_xor(v, 1);
  else
    v = simt::shfl_xor(v, 1);
  out[threadIdx.x] = v;
}

// __syncwarp may be reached at different call sites (sm_70+ semantics): accepted.
__global__ void split_syncwarp_kernel(int* out) {
  if (threadIdx.x & 1) {
    out[threadIdx.x] = 1;
    __syncwarp();
  } else {
    out[threadIdx.x] = 2;
    __syncwarp();
  }
}

__global__ void misaligned_ldmatrix_kernel(uint32_t* out) {
  __shared__ __align__(16) uint16_t rows[33][8];
  uint32_t r[1];
  simt::ldmatrix_x1(r, &rows[threadIdx.x][1]);  // 2-byte offset: misaligned
  out[threadIdx.x] = r[0];
}

// A 16-byte vector load at a 4-byte offset: fine on x86, a fault on the GPU (-fsanitize=alignment check).
__global__ void misaligned_vector_kernel(const float* in, float* out) {
  const float4 v = *reinterpret_cast<const float4*>(in + 4 * threadIdx.x + (threadIdx.x == 5 ? 1 : 0));
  out[threadIdx.x] = v.x + v.w;
}

__global__ void ok_kernel(int* out) {
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = static_cast<int>(simt::shfl(threadIdx.x, 0));
}

void expect_failure(cudaError_t err, cudaError_t code, std::initializer_list<const char*> needles, const char* what) {
  const char* msg = cudaGetErrorString(err);
  CHECK(err == code, "%s: got error %d (%s)", what, static_cast<int>(err), msg);
  for (const char* n : needles) CHECK(contains(msg, n), "%s: report lacks '%s':\n%s", what, n, msg);
}

void check_runtime_still_works() {
  std::vector<int> out(2 * 64, -1);
  CHECK_OK(simt::launch(ok_kernel, dim3(2), dim3(64), 0, nullptr, out.data()));
  for (int i = 0; i < 128; ++i) CHECK(out[i] == (i % 64 < 32 ? 0 : 32), "ok_kernel[%d] = %d", i, out[i]);
}

int main() {
  std::vector<float> f(64);
  std::vector<int> n(64);
  std::vector<uint32_t> u(64);
  for (const char* threads : {"1", "2"}) {
    setenv("MK_SIMT_THREADS", threads, 1);
    for (const char* schedule : {"forward", "reverse", "random:5"}) {
      set_schedule(schedule);
      expect_failure(simt::launch(partial_mask_kernel, dim3(3), dim3(32), 0, nullptr, f.data()), cudaErrorLaunchFailure,
                     {"DEADLOCK", "partial-mask", "mask=0x0000ffff", "test_failures.cpp:", "threadIdx", "blockIdx",
                      "partial_mask_kernel"},
                     "partial mask");
      check_runtime_still_works();
      expect_failure(simt::launch(half_warp_collective_kernel, dim3(1), dim3(32), 0, nullptr, f.data()),
                     cudaErrorLaunchFailure,
                     {"DEADLOCK", "threadIdx (0,0,0)..(15,0,0) [16 threads]: waiting at __shfl_xor_sync",
                      "16 of 32 lanes arrived", "threadIdx (16,0,0)..(31,0,0) [16 threads]: exited"},
                     "half-warp collective");
      expect_failure(simt::launch(barrier_after_exit_kernel, dim3(2), dim3(64), 0, nullptr, n.data()),
                     cudaErrorLaunchFailure,
                     {"DEADLOCK", "(0,0,0)..(39,0,0) [40 threads]: waiting at __syncthreads() test_failures.cpp:",
                      "(40,0,0)..(63,0,0) [24 threads]: exited", "schedule"},
                     "barrier after exit");
      expect_failure(simt::launch(divergent_barrier_kernel, dim3(1), dim3(8), 0, nullptr, n.data()),
                     cudaErrorLaunchFailure, {"DEADLOCK", "different barriers", "threadIdx (1,0,0): waiting at __syncthreads()"},
                     "divergent barrier");
      expect_failure(simt::launch(split_collective_kernel, dim3(1), dim3(64), 0, nullptr, f.data()),
                     cudaErrorLaunchFailure,
                     {"DEADLOCK", "reach __shfl_xor_sync at different call sites: test_failures.cpp:", "split_collective_kernel"},
                     "collective split across two call sites");
      CHECK_OK(simt::launch(split_syncwarp_kernel, dim3(1), dim3(64), 0, nullptr, n.data()));
      expect_failure(simt::launch(misaligned_ldmatrix_kernel, dim3(1), dim3(32), 0, nullptr, u.data()),
                     cudaErrorMisalignedAddress, {"not 16-byte aligned", "ldmatrix"}, "misaligned ldmatrix");
      std::vector<float> in(4 * 64 + 4, 1.f);
      expect_failure(simt::launch(misaligned_vector_kernel, dim3(1), dim3(32), 0, nullptr, in.data(), f.data()),
                     cudaErrorMisalignedAddress,
                     {"SIMT emulator: misaligned ", "float4", "needs 16-byte alignment", "test_failures.cpp:",
                      "misaligned_vector_kernel", "threadIdx (5,0,0): faulted here"},
                     "misaligned vector load");
      check_runtime_still_works();
    }
  }
  set_schedule("forward");
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(1025), 0, nullptr, n.data()), cudaErrorInvalidConfiguration,
                 {"(1025,1,1)"}, "1025 threads");
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(32, 32, 2), 0, nullptr, n.data()),
                 cudaErrorInvalidConfiguration, {"(32,32,2)"}, "2048 threads");
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(1, 1, 65), 0, nullptr, n.data()), cudaErrorInvalidConfiguration,
                 {"z ≤ 64"}, "block z 65");
  expect_failure(simt::launch(ok_kernel, dim3(1, 70000), dim3(32), 0, nullptr, n.data()),
                 cudaErrorInvalidConfiguration, {"gridDim (1,70000,1)"}, "grid y 70000");
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(32), 200 * 1024, nullptr, n.data()), cudaErrorInvalidValue,
                 {"204800 bytes of dynamic shared memory exceed the sm_80 limit of 166912"}, "200 KiB smem");
  // Per-target limit: sm_86 / sm_89 run sm_80 cubins with 99 KiB; a list takes the smallest.
  setenv("MK_SIMT_MAX_DYN_SMEM", "sm_80,sm_86", 1);
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(32), 99 * 1024 + 16, nullptr, n.data()), cudaErrorInvalidValue,
                 {"101392 bytes of dynamic shared memory exceed the sm_86 limit of 101376", "ok_kernel"}, "sm_86 limit");
  CHECK_OK(simt::launch(ok_kernel, dim3(1), dim3(32), 99 * 1024, nullptr, n.data()));
  setenv("MK_SIMT_MAX_DYN_SMEM", "sm_90", 1);
  CHECK_OK(simt::launch(ok_kernel, dim3(1), dim3(32), 200 * 1024, nullptr, n.data()));
  setenv("MK_SIMT_MAX_DYN_SMEM", "4096", 1);
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(32), 4100, nullptr, n.data()), cudaErrorInvalidValue,
                 {"exceed the limit of 4096 (MK_SIMT_MAX_DYN_SMEM)"}, "byte limit");
  setenv("MK_SIMT_MAX_DYN_SMEM", "sm_75", 1);
  expect_failure(simt::launch(ok_kernel, dim3(1), dim3(32), 0, nullptr, n.data()), cudaErrorInvalidValue,
                 {"MK_SIMT_MAX_DYN_SMEM='sm_75' is not"}, "unknown target");
  unsetenv("MK_SIMT_MAX_DYN_SMEM");
  CHECK(cudaGetLastError() == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
        "cudaGetLastError returns the last launch's error once");
  CHECK(simt::launch(ok_kernel, dim3(0), dim3(32), 0, nullptr, n.data()) == cudaSuccess, "an empty grid is a no-op");
  check_runtime_still_works();
  return check_summary("test_failures");
}
