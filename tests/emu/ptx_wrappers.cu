// ptx_wrappers.cu — compiled (not run) by nvcc in tests/test_emulator.py for sm_80 and sm_90: every
// portable.cuh wrapper must produce valid inline PTX. The same source also builds under g++ with the
// emulator, which is what the other tests here exercise.
#include "simt/fast_exp.cuh"
#include "simt/portable.cuh"

__global__ void every_wrapper_kernel(const __nv_bfloat16* gmem, float* out) {
  __shared__ __align__(16) __nv_bfloat16 tile[32 * 16];
  SIMT_DYN_SMEM(float, dyn);
  const int lane = threadIdx.x & 31;
  simt::cp_async_ca<4>(&tile[8 * lane], &gmem[8 * lane]);
  simt::cp_async_ca<8>(&tile[8 * lane], &gmem[8 * lane]);
  simt::cp_async_ca<16>(&tile[8 * lane], &gmem[8 * lane]);
  simt::cp_async_cg(&tile[8 * lane + 256], &gmem[8 * lane + 256]);
  simt::cp_async_16(&tile[8 * lane + 256], &gmem[8 * lane + 256]);
  simt::cp_async_16_zfill(&tile[8 * lane], &gmem[8 * lane], lane < 16 ? 16u : 0u);
  simt::cp_async_commit();
  simt::cp_async_wait<1>();
  simt::cp_async_wait<0>();
  simt::cp_async_wait_all();
  __syncthreads();

  uint32_t a[4], b[2], r1[1];
  simt::ldmatrix_x4(a, &tile[16 * (lane & 15) + 8 * (lane >> 4)]);
  simt::ldmatrix_x4_trans(a, &tile[16 * (lane & 15) + 8 * (lane >> 4)]);
  simt::ldmatrix_x2(b, &tile[16 * (lane & 15)]);
  simt::ldmatrix_x2_trans(b, &tile[16 * (lane & 15)]);
  simt::ldmatrix_x1(r1, &tile[16 * (lane & 7)]);
  simt::ldmatrix_x1_trans(r1, &tile[16 * (lane & 7)]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  simt::mma_m16n8k16_bf16(acc, a, b, acc);
  simt::mma_m16n8k16_f16(acc, a, b, acc);
  a[0] = simt::pack_bf16x2(acc[0], acc[1]) ^ simt::pack_half2(acc[2], acc[3]) ^ r1[0];

  float v = acc[0] + static_cast<float>(a[0] & 1u) + simt::ex2_ftz(acc[1]) + simt::exp_ftz(acc[2]);
  v += simt::shfl(v, 3) + simt::shfl_xor(v, 1) + simt::shfl_up(v, 1u) + simt::shfl_down(v, 1u);
  v += simt::warp_sum(v) + simt::warp_max(v);
  v += static_cast<float>(simt::ballot(v > 0.f)) + (simt::all(v > 0.f) ? 1.f : 0.f) + (simt::any(v > 0.f) ? 1.f : 0.f);
  dyn[threadIdx.x] = v;
  __syncwarp();
  out[blockIdx.x * blockDim.x + threadIdx.x] = simt::block_sum(dyn[threadIdx.x], dyn + blockDim.x);
}

cudaError_t launch_every_wrapper(const __nv_bfloat16* gmem, float* out) {
  return simt::launch(every_wrapper_kernel, dim3(1), dim3(64), 96 * sizeof(float), nullptr, gmem, out);
}
