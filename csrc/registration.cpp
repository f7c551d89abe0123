// registration.cpp — every op schema, once. The same schemas are registered in two namespaces:
//   mistral_kernels      CPU (csrc/cpu) and CUDA (csrc/cuda) implementations
//   mistral_kernels_emu  the CUDA kernels run on CPU tensors by the SIMT emulator (csrc/emu)
// `Tensor!` marks arguments the op writes. Ops write into caller-allocated outputs; the Python
// wrappers in mistral_kernels/ops.py allocate them and register the fake (meta) implementations.
#include <torch/library.h>

namespace {

constexpr const char* kSchemas[] = {
    // norm / activation / rope  (csrc/kernels/{norm,activation,rope}.cuh, csrc/cpu/{norm,rope}.cpp)
    "rms_norm(Tensor! out, Tensor x, Tensor weight, float eps) -> ()",
    "fused_add_rms_norm(Tensor! x, Tensor! residual, Tensor weight, float eps) -> ()",
    "silu_and_mul(Tensor! out, Tensor x) -> ()",
    "rotary_embedding(Tensor positions, Tensor! q, Tensor! k, Tensor cos_sin_cache, bool is_neox) -> ()",
};

void define_all(torch::Library& m) {
  for (const char* schema : kSchemas) m.def(schema);
}

}  // namespace

TORCH_LIBRARY(mistral_kernels, m) { define_all(m); }
TORCH_LIBRARY(mistral_kernels_emu, m) { define_all(m); }
