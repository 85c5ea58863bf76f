// FP8 element math, shared by the CPU codec (fp8_codec.cpp) and the CUDA kernels
// (cuda/fp8_kernels.cu), so that both write the same bits: integer operations only.
//
// A message's elements travel in blocks of kFp8Block (32): each block has one shared scale,
// a power of two 2^s stored as an 8-bit biased exponent (E8M0, as in the OCP Microscaling
// formats: byte s + 127, s in [-127, 127]; byte 255 marks a block holding a NaN or an
// infinity), and each element is x / 2^s rounded to nearest, ties to even, in the element format:
//
//   format  bits (sign.exponent.mantissa)  bias  largest finite   smallest subnormal
//   e4m3    1.4.3                          7     448 = 1.75 * 2^8    2^-9
//   e5m2    1.5.2                          15    57344 = 1.75 * 2^15 2^-16
//
// The scale is the smallest power of two for which the block's largest |x| fits the largest
// finite element, so nothing is ever clipped: |x| / 2^s <= largest finite, and rounding a value
// at most that never goes past it. (The OCP recipe takes floor(log2 amax) - emax instead, and
// saturates the up to 12.5% of a block's range above the largest finite; we spend that bit of
// resolution to never saturate.) The largest |x| of a block is within a factor 2 of the largest
// finite element after scaling, so each element's error is at most half a unit in the last place
// of its format: 2^-4 |x| for e4m3 and 2^-3 |x| for e5m2, or, for elements that scale into the
// subnormal range, half the subnormal step times 2^s (fp8_error_bound says it in numbers).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/host_device.h"

namespace gradzip::compressors::fp8 {

inline constexpr std::size_t kFp8Block = 32;
inline constexpr std::uint8_t kScaleBias = 127;
inline constexpr std::uint8_t kNonfiniteScale = 255;  // the block holds a NaN or an infinity

enum class Format : std::uint8_t { e4m3 = 0, e5m2 = 1 };

struct FormatParams {
  int mantissa_bits;   // M
  int bias;            // B
  int max_exponent;    // unbiased exponent of the largest finite value (its mantissa is 1.75)
};

GZ_HOST_DEVICE GZ_INLINE FormatParams params_of(Format format) {
  return format == Format::e4m3 ? FormatParams{3, 7, 8} : FormatParams{2, 15, 15};
}

// The absolute bits of a finite f32 as (significand, exponent): value = significand *
// 2^(exponent - 23), significand in [2^23, 2^24) for every nonzero value (f32 subnormals are
// normalised here). significand == 0 for zero.
struct Unpacked {
  std::uint32_t significand;
  int exponent;
};

GZ_HOST_DEVICE GZ_INLINE Unpacked unpack(std::uint32_t abs_bits) {
  const int biased = static_cast<int>(abs_bits >> 23);
  std::uint32_t significand = abs_bits & 0x7fffffu;
  if (biased != 0) return Unpacked{significand | 0x800000u, biased - 127};
  if (significand == 0) return Unpacked{0, 0};
  int exponent = -126;
  while ((significand & 0x800000u) == 0) {  // f32 subnormal: at most 23 steps
    significand <<= 1;
    --exponent;
  }
  return Unpacked{significand, exponent};
}

// The block's scale exponent s for its largest |x| (the f32 bits of a finite value, sign bit
// clear): the smallest s >= -127 with amax <= 1.75 * 2^(max_exponent + s). 0 bits give -127.
GZ_HOST_DEVICE GZ_INLINE int scale_exponent(std::uint32_t amax_bits, Format format) {
  const Unpacked a = unpack(amax_bits);
  if (a.significand == 0) return -127;
  // amax = m * 2^e with m = significand / 2^23 in [1, 2); it fits 1.75 * 2^(emax + s) exactly
  // when e < emax + s, or e == emax + s and m <= 1.75 (significand <= 0xE00000).
  int s = a.exponent - params_of(format).max_exponent + (a.significand > 0xE00000u ? 1 : 0);
  return s < -127 ? -127 : s;  // amax < 2^-119 or so: the scale's floor (never above 127)
}

// The element code of x / 2^s (abs_bits: |x|'s f32 bits, finite; the sign is added by the
// caller), rounded to nearest, ties to even. The scale guarantees |x| / 2^s <= largest finite.
GZ_HOST_DEVICE GZ_INLINE std::uint8_t encode_magnitude(std::uint32_t abs_bits, int s,
                                                       Format format) {
  const FormatParams p = params_of(format);
  const Unpacked v = unpack(abs_bits);
  if (v.significand == 0) return 0;
  const int exponent = v.exponent - s;      // of x / 2^s (exact: a power-of-two scale)
  const int min_normal = 1 - p.bias;
  int shift = 23 - p.mantissa_bits;         // keep M fraction bits
  if (exponent < min_normal) shift += min_normal - exponent;  // subnormal: fewer bits kept
  if (shift > 24) return 0;                 // below half the smallest subnormal
  const std::uint32_t kept = v.significand >> shift;
  const std::uint32_t rest = v.significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  const std::uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  // Subnormal: the code is the rounded count of smallest steps (2^M of them is the smallest
  // normal, whose code is the same number). Normal: the biased exponent above the fraction; a
  // rounding carry (rounded == 2^(M+1)) moves into the exponent by the same addition.
  if (exponent < min_normal) return static_cast<std::uint8_t>(rounded);
  const std::uint32_t biased = static_cast<std::uint32_t>(exponent + p.bias);
  const std::uint32_t code = (biased << p.mantissa_bits) + rounded - (1u << p.mantissa_bits);
  // The one case where the nearest value is not kept: x within a 16th (e4m3; e5m2: an 8th) of
  // FLT_MAX rounding up to 2^128, which f32 cannot hold; it takes the code below (the largest
  // value the format and f32 share), so the decode stays finite and within fp8_error_bound.
  const int decoded_exponent = static_cast<int>(code >> p.mantissa_bits) - p.bias + s;
  return static_cast<std::uint8_t>(decoded_exponent > 127 ? code - 1u : code);
}

// The largest |D(E(x))_i - x_i| over a block whose largest |x| is y_max: half a unit in the last
// place of the element format, times 9/8 for the rounding-down case near FLT_MAX above (never
// reached elsewhere), plus half the smallest subnormal step at the scale's floor 2^-127.
inline double fp8_error_bound(Format format, double y_max) {
  const FormatParams p = params_of(format);
  const double half_ulp = 1.0 / static_cast<double>(1u << (p.mantissa_bits + 1));
  const double floor_step = std::ldexp(1.0, -(p.bias + p.mantissa_bits + 127));
  return 9.0 / 8.0 * half_ulp * y_max + floor_step;
}

// The f32 value of code * 2^s: exact (an element has at most 4 significant bits, and its last
// one is at least 2^(s - 16) >= 2^-143, within f32's subnormal range), built from the bits so
// that no device's flush-to-zero setting can change it; beyond FLT_MAX (codes the encoder
// never writes) an infinity. Codes that are NaN (e4m3: S.1111.111;
// e5m2: S.11111.xx with xx != 0) decode to NaN and e5m2's infinities to infinities.
GZ_HOST_DEVICE GZ_INLINE float decode_element(std::uint8_t code, int s, Format format) {
  const FormatParams p = params_of(format);
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t magnitude = code & 0x7fu;
  const std::uint32_t mantissa_mask = (1u << p.mantissa_bits) - 1u;
  const std::uint32_t field = magnitude >> p.mantissa_bits;
  const std::uint32_t mantissa = magnitude & mantissa_mask;
  if (format == Format::e4m3 && magnitude == 0x7fu) return kernels::bits_float(sign | 0x7fc00000u);
  if (format == Format::e5m2 && field == 0x1fu)
    return kernels::bits_float(sign | (mantissa == 0 ? 0x7f800000u : 0x7fc00000u));
  // value = significand * 2^(exponent - 23) with the significand's leading 1 at bit 23.
  std::uint32_t significand;
  int exponent;
  if (field != 0) {
    significand = (1u << 23) | (mantissa << (23 - p.mantissa_bits));
    exponent = static_cast<int>(field) - p.bias + s;
  } else {
    if (mantissa == 0) return kernels::bits_float(sign);
    // mantissa * 2^(1 - B - M): normalise the leading 1 to bit 23.
    significand = mantissa << (23 - p.mantissa_bits);
    exponent = 1 - p.bias + s;
    while ((significand & 0x800000u) == 0) {
      significand <<= 1;
      --exponent;
    }
  }
  // Past f32's range: only a message the encoder did not write gets here (it keeps decoded
  // values finite); the value is then infinite, as a float multiply by 2^s would make it.
  if (exponent > 127) return kernels::bits_float(sign | 0x7f800000u);
  if (exponent >= -126)
    return kernels::bits_float(sign | (static_cast<std::uint32_t>(exponent + 127) << 23) |
                               (significand & 0x7fffffu));
  // An f32 subnormal: shifting out only zero bits (see above), so the value stays exact.
  return kernels::bits_float(sign | (significand >> (-126 - exponent)));
}

}  // namespace gradzip::compressors::fp8
