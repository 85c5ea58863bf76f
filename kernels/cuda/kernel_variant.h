// Which implementation of a family of CUDA kernels a call runs (qsgd, sign, top-k, ...). Both
// variants keep the same contract (the bytes and bits of the CPU codec, asynchronous on the
// stream, no allocation, no synchronisation); they differ only in speed.
//
// The rule: `fast` is the default. `reference` (the first, simpler kernels) stays until a GPU
// run has shown the fast kernels byte-identical to the CPU codec in tests/gpu (which check
// both variants); then it may go.
#pragma once

namespace gradzip::kernels::cuda {

enum class KernelVariant {
  reference,  // the first kernels: simple, more passes over memory
  fast,       // the tuned kernels (the default)
};

}  // namespace gradzip::kernels::cuda
