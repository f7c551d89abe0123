// emu_types.h — CUDA runtime vocabulary for the SIMT emulator, without the CUDA toolkit:
// dim3 / uint3, cudaError_t (+ strings), cudaStream_t, the vector types (float2 … uint4) and make_*.
// Values and alignments match the CUDA headers so that code moving 16-byte vectors behaves the same.
#pragma once

#include <cstddef>
#include <cstdint>

// ---- grid geometry ----------------------------------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

// ---- errors (numeric values as in driver_types.h) ------------------------------------------------------
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError cudaError_t;

// The generic CUDA message, followed by the emulator's detail (e.g. the DEADLOCK report) when `err` is
// the error of the last failed launch on this OS thread.
const char* cudaGetErrorString(cudaError_t err);
// Error of the last launch on this OS thread; cudaGetLastError also resets it.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
// Launches are synchronous under the emulator.
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

struct CUstream_st;
typedef CUstream_st* cudaStream_t;

// ---- vector types ------------------------------------------------------------------------------------
struct alignas(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) double2 { double x, y; };

inline constexpr float2 make_float2(float x, float y) { return {x, y}; }
inline constexpr float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline constexpr float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline constexpr int2 make_int2(int x, int y) { return {x, y}; }
inline constexpr int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline constexpr uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline constexpr uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline constexpr uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline constexpr double2 make_double2(double x, double y) { return {x, y}; }
