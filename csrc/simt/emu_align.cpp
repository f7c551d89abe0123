// emu_align.cpp — misaligned plain loads / stores in emulated kernels become launch failures, as on the GPU.
//
// x86 tolerates a misaligned 16-byte vector access; a GPU faults (cudaErrorMisalignedAddress). The
// emulated translation units are compiled with -fsanitize=alignment -fno-sanitize-recover=alignment
// (CMakeLists.txt, tests/test_emulator.py): the compiler checks every typed load / store against its
// type's alignment and calls the UBSan handler below on a mismatch. We provide the handler ourselves (no
// UBSan runtime is linked): inside a kernel it fails the launch with the access, its source location and
// the thread; outside kernels (glue code) it reports and aborts, like -fno-sanitize-recover would.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emu_block.h"

namespace {
// The UBSan ABI (gcc / clang): the data the compiler passes with a failed type check.
struct UbsanSourceLocation {
  const char* file;
  uint32_t line, column;
};
struct UbsanTypeDescriptor {
  uint16_t kind, info;
  char name[1];
};
struct UbsanTypeMismatch {
  UbsanSourceLocation loc;
  const UbsanTypeDescriptor* type;
  unsigned char log_alignment, type_check_kind;
};

const char* access_kind(unsigned char k) {
  static const char* const kinds[] = {"load of",         "store to",         "reference binding to", "member access within",
                                      "member call on",  "constructor call on", "downcast of",       "downcast of",
                                      "upcast of",       "cast to virtual base of"};
  return k < sizeof kinds / sizeof *kinds ? kinds[k] : "access to";
}

[[noreturn]] void misaligned(const UbsanTypeMismatch* d, uintptr_t ptr) {
  const char* slash = d->loc.file ? std::strrchr(d->loc.file, '/') : nullptr;
  char buf[512];
  std::snprintf(buf, sizeof buf, "misaligned %s %s at address 0x%zx (needs %u-byte alignment) at %s:%u:%u",
                access_kind(d->type_check_kind), d->type ? d->type->name : "?", static_cast<size_t>(ptr),
                1u << d->log_alignment, slash ? slash + 1 : (d->loc.file ? d->loc.file : "?"), d->loc.line,
                d->loc.column);
  if (simt::emu::BlockRunner* r = simt::emu::BlockRunner::active()) r->fault(cudaErrorMisalignedAddress, buf);
  std::fprintf(stderr, "SIMT emulator: %s (outside any kernel)\n", buf);
  std::abort();
}
}  // namespace

extern "C" {
// -fno-sanitize-recover=alignment calls the _abort form; the recoverable one is defined too so that a TU
// built with recovery still fails instead of needing the UBSan runtime. A null pointer is not an alignment
// error (-fsanitize=null is not enabled); only misalignment reaches here.
// (void*, void*): the signature gcc declares for these built-ins.
[[gnu::visibility("default")]] void __ubsan_handle_type_mismatch_v1_abort(void* data, void* ptr) {
  misaligned(static_cast<const UbsanTypeMismatch*>(data), reinterpret_cast<uintptr_t>(ptr));
}
[[gnu::visibility("default")]] void __ubsan_handle_type_mismatch_v1(void* data, void* ptr) {
  misaligned(static_cast<const UbsanTypeMismatch*>(data), reinterpret_cast<uintptr_t>(ptr));
}
}
