// cpu/isa/attention.cpp — attn_scan (attention.h) for one ISA level: rebuilds the PagedKV view and the
// rows of attention_core.h from the plain arguments and runs the scan for the cache dtype.
#include "attention.h"

#include "attention_core.h"
#include "target.h"

MK_ISA_BEGIN

static_assert(attn::kChunk == kAttnScanChunk);
static_assert(sizeof(OnlineSoftmax) == 2 * sizeof(float));

namespace {
template <typename T>
void scan_as(const AttnScan& a) {
  const attn::Rows rows{a.R, a.D, a.q, a.acc, static_cast<OnlineSoftmax*>(a.softmax), a.lo, a.hi,
                        static_cast<const bf16*>(std::is_same_v<T, bf16> ? a.q_raw : nullptr), a.q_scale};
  const PagedKV<const T> kv{static_cast<const T*>(a.k), static_cast<const T*>(a.v), a.block_table, a.slot_stride,
                            a.block_size, a.num_blocks};
  attn::Scratch sc{a.scores, a.kbuf, a.vbuf};
  attn::scan_keys<T>(rows, kv, a.kbeg, a.kend, sc);
}
}  // namespace

void attn_scan(const AttnScan& a) {
  switch (a.elem) {
    case Elem::f32: return scan_as<float>(a);
    case Elem::bf16: return scan_as<bf16>(a);
    case Elem::f16: return scan_as<f16>(a);
  }
}

MK_ISA_END
