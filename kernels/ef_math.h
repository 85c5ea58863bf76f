// Element math of error feedback shared by the CPU tests and the CUDA kernels
// (kernels/cuda/ef_cuda.h): the fused update of the cast codecs, c = g + e, h = RNE(c),
// e = c - widen(h), with the same f32 operations as error_feedback/error_feedback_codec.cpp.
#pragma once

#include <cstdint>

#include "kernels/cast_math.h"
#include "kernels/host_device.h"

namespace gradzip::kernels {

// One element of the fused cast update: c = g + e; returns the payload bits h = RNE(c) in
// f16 or bf16, and sets e = c - widen(h).
GZ_HOST_DEVICE GZ_INLINE std::uint16_t ef_cast_element(float g, float& e, bool bf16) {
  const float c = g + e;
  if (bf16) {
    const std::uint16_t h = f32_to_bf16_bits(c);
    e = c - bf16_bits_to_f32(h);
    return h;
  }
  const std::uint16_t h = f32_to_f16_bits(c);
  e = c - f16_bits_to_f32(h);
  return h;
}

}  // namespace gradzip::kernels
