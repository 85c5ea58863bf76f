// Element math of error feedback shared by the CPU tests and the CUDA kernels
// (kernels/cuda/ef_cuda.h): the fused update of the cast codecs, c = g + e, h = RNE(c),
// e = c - widen(h), with the same f32 operations as error_feedback/error_feedback_codec.cpp,
// and the same guard: a residual that comes out non-finite is stored as 0
// (kernels/nonfinite_math.h finite_or_zero; residuals never hold NaN or Inf).
#pragma once

#include <cstdint>

#include "kernels/cast_math.h"
#include "kernels/host_device.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels {

// One element of the fused cast update: c = g + e; returns the payload bits h = RNE(c) in
// f16 or bf16, and sets e = finite_or_zero(c - widen(h)).
GZ_HOST_DEVICE GZ_INLINE std::uint16_t ef_cast_element(float g, float& e, bool bf16) {
  const float c = g + e;
  if (bf16) {
    const std::uint16_t h = f32_to_bf16_bits(c);
    e = finite_or_zero(c - bf16_bits_to_f32(h));
    return h;
  }
  const std::uint16_t h = f32_to_f16_bits(c);
  e = finite_or_zero(c - f16_bits_to_f32(h));
  return h;
}

}  // namespace gradzip::kernels
