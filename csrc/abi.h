// abi.h — the inline namespace that keeps each build of the shared headers apart in _C.so.
//
// csrc/kernels, csrc/glue and csrc/checks are header-only and end up in _C.so several times:
// compiled by nvcc for the CUDA backend (csrc/cuda), by g++ for the emulated backend (csrc/emu, where
// simt::launch runs the kernels on fibers), by g++ for the CPU glue (csrc/cpu, abi_cpu) and once per
// CPU ISA level for csrc/cpu/isa (abi_cpu_<level>, docs/kernels.md "CPU ISA levels").
// Their inline functions and templates have the same names in every build but not the same bodies, so
// each build puts them into its own inline namespace of mk:
//
//   namespace mk::inline MK_ABI::glue { ... }      // callers still write mk::glue::rms_norm
//
// and the symbols read mk::abi_cuda::glue::rms_norm, mk::abi_emu::glue::rms_norm, mk::abi_cpu::check::...
// (the linker would otherwise keep one body for all builds, or reject duplicate kernel stubs).
// CMakeLists.txt defines MK_ABI per source directory. Without it (the standalone programs of tests/emu
// and tests/nvcc), nvcc gets abi_cuda and any other compiler abi_emu.
#pragma once

#if !defined(MK_ABI)
#if defined(__CUDACC__)
#define MK_ABI abi_cuda
#else
#define MK_ABI abi_emu
#endif
#endif
