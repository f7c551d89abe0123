// cpu/isa_select.cpp — which ISA level of the CPU kernels runs (isa_dispatch.h): CPUID through
// __builtin_cpu_supports, MK_CPU_ISA to force one. Also the C entry point mk_cpu_isa that Python reads
// (mistral_kernels.cpu_isa(), `mistral-kernels info`).
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

constexpr Isa kAll[] = {Isa::avx512bf16, Isa::avx512, Isa::avx2, Isa::generic};

bool supported(Isa isa) {
#if MK_CPU_X86_ISAS
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  switch (isa) {
    case Isa::avx512bf16:
      return avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
    case Isa::avx512: return avx512;
    case Isa::avx2: return avx2;
    case Isa::generic: return true;
  }
  return false;
#else
  return isa == Isa::generic;  // the only level compiled off x86-64
#endif
}

std::string level_list() {
  std::string s;
  for (Isa isa : kAll) s += std::string(s.empty() ? "" : ", ") + isa_name(isa) + (supported(isa) ? "" : " (not on this CPU)");
  return s;
}

// The chosen level, or the error message (kept: every call of active_isa() reports it again).
struct Choice {
  Isa isa = Isa::generic;
  std::string error;
};

Choice choose() {
  Choice c;
  const char* env = std::getenv("MK_CPU_ISA");
  if (env != nullptr && *env != '\0') {
    for (Isa isa : kAll) {
      if (std::strcmp(env, isa_name(isa)) != 0) continue;
      if (!supported(isa))
        c.error = std::string("MK_CPU_ISA=") + env + ": this CPU does not support that level; levels: " + level_list();
      c.isa = isa;
      return c;
    }
    c.error = std::string("MK_CPU_ISA=") + env + " is not a CPU ISA level; expected one of: " + level_list();
    return c;
  }
  for (Isa isa : kAll)
    if (supported(isa)) {
      c.isa = isa;
      break;
    }
  return c;
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

// Level set at run time by mk_cpu_isa_set (tests and benchmarks compare levels in one process); -1: none.
std::atomic<int> g_forced{-1};

bool parse(const char* name, Isa& out) {
  for (Isa isa : kAll)
    if (std::strcmp(name, isa_name(isa)) == 0) {
      out = isa;
      return true;
    }
  return false;
}

void write(char* buf, size_t n, const std::string& s) {
  if (n == 0) return;
  std::strncpy(buf, s.c_str(), n - 1);
  buf[n - 1] = '\0';
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
#define MK_ISA_NAME_CASE_(name) \
  case Isa::name: return #name;
    MK_CPU_ISAS(MK_ISA_NAME_CASE_)
#undef MK_ISA_NAME_CASE_
  }
  return "?";
}

Isa active_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Isa>(forced);
  const Choice& c = choice();
  TORCH_CHECK(c.error.empty(), c.error);
  return c.isa;
}

}  // namespace mk::cpu

// The level in use as its name (return 0), or the error message (return 1), written to buf (NUL-terminated,
// truncated to n bytes). For ctypes: python/mistral_kernels/_library.py.
extern "C" __attribute__((visibility("default"))) int mk_cpu_isa(char* buf, size_t n) {
  const int forced = mk::cpu::g_forced.load();
  if (forced >= 0) {
    mk::cpu::write(buf, n, mk::cpu::isa_name(static_cast<mk::cpu::Isa>(forced)));
    return 0;
  }
  const auto& c = mk::cpu::choice();
  mk::cpu::write(buf, n, c.error.empty() ? mk::cpu::isa_name(c.isa) : c.error);
  return c.error.empty() ? 0 : 1;
}

// Forces the level `name` for every later CPU op call (null or "": back to MK_CPU_ISA / CPUID). Returns 0,
// or 1 with the error message in err (unknown level, or one this CPU lacks).
extern "C" __attribute__((visibility("default"))) int mk_cpu_isa_set(const char* name, char* err, size_t n) {
  if (name == nullptr || *name == '\0') {
    mk::cpu::g_forced.store(-1);
    return 0;
  }
  mk::cpu::Isa isa;
  if (!mk::cpu::parse(name, isa)) {
    mk::cpu::write(err, n, std::string(name) + " is not a CPU ISA level; expected one of: " + mk::cpu::level_list());
    return 1;
  }
  if (!mk::cpu::supported(isa)) {
    mk::cpu::write(err, n, std::string(name) + ": this CPU does not support that level; levels: " + mk::cpu::level_list());
    return 1;
  }
  mk::cpu::g_forced.store(static_cast<int>(isa));
  return 0;
}

// 1 when this CPU supports the level `name` (and the build has it), 0 when not, -1 for an unknown name.
extern "C" __attribute__((visibility("default"))) int mk_cpu_isa_supported(const char* name) {
  mk::cpu::Isa isa;
  return mk::cpu::parse(name, isa) ? (mk::cpu::supported(isa) ? 1 : 0) : -1;
}
