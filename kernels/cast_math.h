// Scalar f32 <-> f16 / bf16 conversions, round to nearest even, bit-exact with IEEE 754 and
// with the F16C instructions (vcvtps2ph imm=0 / vcvtph2ps): integer-only, so the result does
// not depend on the floating-point environment (FTZ/DAZ) of the CPU or GPU running it.
//
// NaN handling: a NaN stays a NaN of the same sign, its payload truncated to the top bits
// and the quiet bit set (what F16C does).
//
// Two narrowings:
// - f32_to_f16_bits / f32_to_bf16_bits, for message payloads, SATURATE finite values: a finite
//   f32 beyond the format's largest finite value (f16: 65504; bf16: 0x7F7F, about 3.39e38),
//   which IEEE round-to-nearest would turn into Inf, becomes that largest value with its sign;
//   Inf stays Inf and NaN stays NaN. So a finite partial sum re-encoded by a codec stays finite
//   on the wire ("finite inputs give finite results"; the collectives send values beyond the
//   wire type's range as f32 instead, compression_spec.h's wire-range rule).
// - f32_to_f16_bits_ieee / f32_to_bf16_bits_ieee, for values stored into an f16 / bf16 TENSOR
//   (a collective's result, a decode's output): IEEE 754 round to nearest even, so a value
//   beyond the range becomes +-Inf (f16: |x| >= 65520; bf16: |x| >= 0x7F7F8000), as PyTorch's
//   .half() / .bfloat16() and its all-reduce give, and a loss scaler sees the overflow.
// Every path (the scalar code here, the F16C / AVX-512 loops in kernels/cpu/cast_cpu_*.cpp,
// the CUDA kernels) gives these bits.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gradzip::kernels {

GZ_HOST_DEVICE GZ_INLINE std::uint16_t f32_to_f16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // inf or NaN
    if (magnitude == 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  // Finite beyond 65504 (0x477FE000): saturate to 65504 (0x7BFF) instead of rounding to Inf.
  if (magnitude > 0x477FE000u) return static_cast<std::uint16_t>(sign | 0x7BFFu);
  if (magnitude >= 0x38800000u) {  // normal in f16 (>= 2^-14), at most 65504: stays finite
    const std::uint32_t mantissa_odd = (magnitude >> 13) & 1u;
    const std::uint32_t rebased = magnitude - (112u << 23) + 0xFFFu + mantissa_odd;
    return static_cast<std::uint16_t>(sign | (rebased >> 13));
  }
  // Subnormal or zero in f16: value / 2^-24, rounded to nearest even.
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 102u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to zero
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exponent;  // 14..24
  const std::uint32_t quotient = significand >> shift;
  const std::uint32_t remainder = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  const std::uint32_t round_up = (remainder > half || (remainder == half && (quotient & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (quotient + round_up));
}

GZ_HOST_DEVICE GZ_INLINE float f16_bits_to_f32(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) {
    if (mantissa == 0) return bits_float(sign | 0x7F800000u);
    return bits_float(sign | 0x7FC00000u | (mantissa << 13));
  }
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_float(sign);
  std::uint32_t f32_exponent = 113u;  // exponent of 2^-14, adjusted while normalising
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --f32_exponent;
  }
  return bits_float(sign | (f32_exponent << 23) | ((mantissa & 0x3FFu) << 13));
}

GZ_HOST_DEVICE GZ_INLINE std::uint16_t f32_to_bf16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  // Finite values from halfway above bf16's largest finite (0x7F7F8000) round up to Inf under
  // RNE: saturate them to 0x7F7F.
  if (magnitude >= 0x7F7F8000u && magnitude < 0x7F800000u)
    return static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | 0x7F7Fu);
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// IEEE round to nearest even into f16: the saturating conversion, except that finite values
// from the halfway point 65520 (0x477FF000) up, which IEEE rounds to the next binade, give Inf.
GZ_HOST_DEVICE GZ_INLINE std::uint16_t f32_to_f16_bits_ieee(float value) {
  const std::uint32_t magnitude = float_bits(value) & 0x7FFFFFFFu;
  if (magnitude >= 0x477FF000u && magnitude < 0x7F800000u)
    return static_cast<std::uint16_t>(((float_bits(value) >> 16) & 0x8000u) | 0x7C00u);
  return f32_to_f16_bits(value);
}

// IEEE round to nearest even into bf16: finite values from halfway above the largest finite
// (0x7F7F8000) up give Inf.
GZ_HOST_DEVICE GZ_INLINE std::uint16_t f32_to_bf16_bits_ieee(float value) {
  const std::uint32_t magnitude = float_bits(value) & 0x7FFFFFFFu;
  if (magnitude >= 0x7F7F8000u && magnitude < 0x7F800000u)
    return static_cast<std::uint16_t>(((float_bits(value) >> 16) & 0x8000u) | 0x7F80u);
  return f32_to_bf16_bits(value);
}

GZ_HOST_DEVICE GZ_INLINE float bf16_bits_to_f32(std::uint16_t value) {
  return bits_float(static_cast<std::uint32_t>(value) << 16);
}

}  // namespace gradzip::kernels
