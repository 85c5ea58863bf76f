// Element tests for non-finite values (NaN or +-Inf) on the raw bits of f32 / f16 / bf16: a
// value is non-finite exactly when its exponent field is all ones. Integer-only, so the answer
// does not depend on FTZ/DAZ or fast-math, and the CPU count (kernels/cpu/nonfinite_cpu.h) and
// the CUDA count (kernels/cuda/nonfinite_cuda.h) agree.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gradzip::kernels {

GZ_HOST_DEVICE GZ_INLINE bool f32_bits_nonfinite(std::uint32_t bits) {
  return (bits & 0x7F800000u) == 0x7F800000u;
}
GZ_HOST_DEVICE GZ_INLINE bool f16_bits_nonfinite(std::uint16_t bits) {
  return (bits & 0x7C00u) == 0x7C00u;
}
GZ_HOST_DEVICE GZ_INLINE bool bf16_bits_nonfinite(std::uint16_t bits) {
  return (bits & 0x7F80u) == 0x7F80u;
}

// The error-feedback residual guard: residuals never hold non-finite values. A residual
// element that comes out NaN or Inf (a non-finite input, or a finite one whose encode
// overflowed) is stored as +0.
GZ_HOST_DEVICE GZ_INLINE float finite_or_zero(float value) {
  return f32_bits_nonfinite(float_bits(value)) ? 0.0f : value;
}

}  // namespace gradzip::kernels
