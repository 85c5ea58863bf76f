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

// The wire-range test (the Communicator's overflow check before a narrowing codec): a FINITE
// element whose magnitude bit pattern is at or above `above`, the first magnitude pattern whose
// value exceeds the limit (kernels/cpu/nonfinite_cpu.h, beyond_threshold_bits). Magnitudes
// order like their bit patterns, so this is |x| > limit, exactly, on the bits.
GZ_HOST_DEVICE GZ_INLINE bool f32_bits_beyond(std::uint32_t bits, std::uint32_t above) {
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  return magnitude >= above && magnitude < 0x7F800000u;
}
GZ_HOST_DEVICE GZ_INLINE bool f16_bits_beyond(std::uint16_t bits, std::uint16_t above) {
  const std::uint16_t magnitude = static_cast<std::uint16_t>(bits & 0x7FFFu);
  return magnitude >= above && magnitude < 0x7C00u;
}
GZ_HOST_DEVICE GZ_INLINE bool bf16_bits_beyond(std::uint16_t bits, std::uint16_t above) {
  const std::uint16_t magnitude = static_cast<std::uint16_t>(bits & 0x7FFFu);
  return magnitude >= above && magnitude < 0x7F80u;
}

// The error-feedback residual guard: residuals never hold non-finite values. A residual
// element that comes out NaN or Inf (a non-finite input, or a finite one whose encode
// overflowed) is stored as +0.
GZ_HOST_DEVICE GZ_INLINE float finite_or_zero(float value) {
  return f32_bits_nonfinite(float_bits(value)) ? 0.0f : value;
}

}  // namespace gradzip::kernels
