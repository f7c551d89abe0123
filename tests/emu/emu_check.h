// emu_check.h — tiny assertion harness for the standalone emulator tests (no torch, no gtest).
// CHECK(cond, fmt, ...) records a failure with a message; main() returns check_summary().
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "simt/portable.cuh"

inline int g_failures = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      ++g_failures;                                                   \
      std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                              \
      std::fprintf(stderr, "\n");                                     \
    }                                                                 \
  } while (0)

#define CHECK_OK(err) CHECK((err) == cudaSuccess, "launch failed: %s", cudaGetErrorString(err))

inline void set_schedule(const char* s) { setenv("MK_SIMT_SCHEDULE", s, 1); }

inline bool contains(const char* text, const char* needle) { return std::string(text).find(needle) != std::string::npos; }

inline int check_summary(const char* name) {
  if (g_failures) std::fprintf(stderr, "%s: %d check(s) failed\n", name, g_failures);
  else std::printf("%s: ok\n", name);
  return g_failures ? 1 : 0;
}
