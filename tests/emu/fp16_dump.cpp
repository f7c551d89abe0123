// fp16_dump.cpp — prints the emulator's 16-bit float conversions for tests/test_emulator.py, which
// compares them with numpy (float16) and torch (bfloat16).
//   fp16_dump narrow  < float bit patterns (hex, one per line)  → "<half bits> <bf16 bits>" per line
//   fp16_dump widen                                              → for b in 0..65535: "<float bits of half b> <float bits of bf16 b>"
#include <cstdio>
#include <cstring>

#include "simt/portable.cuh"

static unsigned bits_of(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "narrow") == 0) {
    unsigned u;
    while (std::scanf("%x", &u) == 1) {
      float f;
      std::memcpy(&f, &u, 4);
      std::printf("%04x %04x\n", __half_as_ushort(__float2half_rn(f)), __bfloat16_as_ushort(__float2bfloat16_rn(f)));
    }
    return 0;
  }
  for (unsigned b = 0; b < 65536; ++b) {
    const auto s = static_cast<unsigned short>(b);
    std::printf("%08x %08x\n", bits_of(__half2float(__ushort_as_half(s))), bits_of(__bfloat162float(__ushort_as_bfloat16(s))));
  }
  return 0;
}
