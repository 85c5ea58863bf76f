// Element math of the `qsgd` codec (stochastic-rounding quantisation, Alistarh et al., NIPS'17),
// shared by the CPU loops (scalar, AVX2, AVX-512) and the CUDA kernels so that all of them give
// the same codes and the same decoded bits. Only integer and round-to-nearest f32 operations,
// in the order written here (the build has no FMA contraction).
//
// Elements are split into buckets of `bucket` elements (the last one may be shorter); each
// bucket carries one f32 scale and every element one `bits`-bit code.
//
// Scale: scale = max |x| over the bucket, computed on the bit patterns (|x| as an unsigned
// integer orders like the float, +Inf above every finite value, NaN above +Inf), so it is exact
// and independent of the order of evaluation. Non-finite buckets:
//   - a NaN anywhere in the bucket makes scale the canonical quiet NaN 0x7FC00000;
//   - otherwise an Inf makes scale +Inf;
//   - every code of a bucket whose scale is not finite is 0, and the whole bucket decodes to the
//     quiet NaN. (A gradient holding Inf/NaN is broken; decoding to NaN keeps it visibly broken
//     for the caller's overflow check, e.g. a loss scaler, instead of inventing numbers.)
//
// bits >= 2 (signed magnitude): s = 2^(bits-1) - 1 levels.
//   encode: y = (|x| * prescale) * inv, inv = s / (scale * prescale); u = uniform_unit(word);
//           q = clamp(floor(y + u), 0, s); code = q | (x < 0 && q != 0 ? 2^(bits-1) : 0).
//           P(q = floor(y) + 1) = y - floor(y), so E[q] = y and E[decode] = x (up to rounding).
//   decode: step = scale / s; value = ±min(q * step, scale).
//   |decode - x| <= step (plus f32 rounding).
// bits == 1 (stochastic sign): decoded values are -scale or +scale.
//   encode: y = (x * prescale) * inv + 0.5, inv = 0.5 / (scale * prescale), so y = (1 + x/scale)/2;
//           code = q = clamp(floor(y + u), 0, 1): P(code = 1) = y, E[decode] = scale (2y - 1) = x.
//   decode: code 1 -> +scale, code 0 -> 0 - scale (+0 when scale == 0).
//   |decode - x| <= 2 scale.
// scale == 0: inv = 0 and the offset is 0, so every code is 0 and the bucket decodes to +0.
// prescale is 2^64 when scale < 2^-64 and 1 otherwise: it keeps inv finite for tiny (subnormal)
// scales; multiplying by a power of two is exact, so for normal scales the math is the plain
// y = |x| * (s / scale).
//
// Random words: element e of a tensor (e = ctx.element_offset + index in the chunk) draws
// philox_element(seed, step, tensor_id, e) (kernels/philox_math.h), so a tensor encoded in
// chunks whose boundaries are multiples of `bucket` gives the codes of the whole tensor.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/philox_math.h"

namespace gradzip::kernels {

inline constexpr int kQsgdMinBits = 1;
inline constexpr int kQsgdMaxBits = 8;
inline constexpr std::uint32_t kQsgdCanonicalNan = 0x7FC00000u;
inline constexpr std::uint32_t kF32InfBits = 0x7F800000u;
// Scales below 2^-64 are multiplied by 2^64 before inv is computed (see above).
inline constexpr float kQsgdTinyScale = 5.42101086242752217e-20f;  // 2^-64
inline constexpr float kQsgdTinyPrescale = 18446744073709551616.0f;  // 2^64

// Levels of the magnitude for bits >= 2 (2^(bits-1) - 1), 1 for the 1-bit sign code.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_top_level(int bits) {
  return bits == 1 ? 1u : (1u << (bits - 1)) - 1u;
}

// The sign bit of a code (0 for bits == 1, which has no sign bit).
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_sign_bit(int bits) {
  return bits == 1 ? 0u : 1u << (bits - 1);
}

// |x| as the bit pattern that orders like the float (NaN above +Inf).
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_abs_bits(float x) { return float_bits(x) & 0x7FFFFFFFu; }

// The bucket scale from the largest qsgd_abs_bits of the bucket: NaNs become the canonical NaN.
GZ_HOST_DEVICE GZ_INLINE float qsgd_scale_from_abs_max_bits(std::uint32_t abs_max_bits) {
  return bits_float(abs_max_bits > kF32InfBits ? kQsgdCanonicalNan : abs_max_bits);
}

GZ_HOST_DEVICE GZ_INLINE bool qsgd_scale_is_finite(float scale) {
  return float_bits(scale) < kF32InfBits;
}

// A scale encode can produce: +0 .. +Inf, or the canonical NaN. Decoders reject anything else.
GZ_HOST_DEVICE GZ_INLINE bool qsgd_scale_is_valid(float scale) {
  const std::uint32_t bits = float_bits(scale);
  return bits <= kF32InfBits || bits == kQsgdCanonicalNan;
}

// Per-bucket constants of the encoder, computed once per bucket.
struct QsgdEncodeBucket {
  bool finite;             // false: every code of the bucket is 0
  std::uint32_t magnitude_mask;  // 0x7FFFFFFF (bits >= 2: quantise |x|) or 0xFFFFFFFF (bits == 1: x)
  float prescale;          // 1, or 2^64 for scales below 2^-64
  float inv;               // s / (scale * prescale), 0.5 / (scale * prescale); 0 when scale == 0
  float offset;            // 0.5 for bits == 1 with scale != 0, else 0
  float top;               // s as a float (1 for bits == 1)
  std::uint32_t top_level;     // s
  std::uint32_t sign_bit;      // qsgd_sign_bit(bits)
};

GZ_HOST_DEVICE GZ_INLINE QsgdEncodeBucket qsgd_encode_bucket(float scale, int bits) {
  QsgdEncodeBucket bucket;
  bucket.finite = qsgd_scale_is_finite(scale);
  bucket.magnitude_mask = bits == 1 ? 0xFFFFFFFFu : 0x7FFFFFFFu;
  bucket.top_level = qsgd_top_level(bits);
  bucket.top = static_cast<float>(bucket.top_level);
  bucket.sign_bit = qsgd_sign_bit(bits);
  bucket.prescale = scale < kQsgdTinyScale ? kQsgdTinyPrescale : 1.0f;
  const bool usable = bucket.finite && scale > 0.0f;
  const float numerator = bits == 1 ? 0.5f : bucket.top;
  bucket.inv = usable ? numerator / (scale * bucket.prescale) : 0.0f;
  bucket.offset = usable && bits == 1 ? 0.5f : 0.0f;
  return bucket;
}

// floor(v) clamped to [0, top_level], written so that a NaN gives 0 and never reaches the
// float -> integer conversion. For 1 <= v < top, truncation is floor.
// (The SIMD paths compute trunc(min(v, top)): in a finite bucket v is never NaN and v > -1 --
// y >= 0 for bits >= 2, y >= -2^-24 for bits == 1 -- so truncation toward 0 gives the same.)
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_level(float v, const QsgdEncodeBucket& bucket) {
  if (!(v >= 1.0f)) return 0u;
  if (v >= bucket.top) return bucket.top_level;
  return static_cast<std::uint32_t>(v);
}

// The code of element x of a bucket, drawing the random word `word`.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_encode_code(float x, std::uint32_t word,
                                                        const QsgdEncodeBucket& bucket) {
  if (!bucket.finite) return 0u;
  const float magnitude = bits_float(float_bits(x) & bucket.magnitude_mask);
  const float y = magnitude * bucket.prescale * bucket.inv + bucket.offset;
  const float v = y + uniform_unit(word);
  const std::uint32_t q = qsgd_level(v, bucket);
  const bool negative = (float_bits(x) >> 31) != 0u;
  return (negative && q != 0u) ? (q | bucket.sign_bit) : q;
}

// Per-bucket constants of the decoder.
struct QsgdDecodeBucket {
  bool finite;           // false: the bucket decodes to the quiet NaN
  float scale;
  float step;            // bits >= 2: scale / s; bits == 1: unused
  float negative_scale;  // bits == 1: 0 - scale (+0 when scale == 0)
  std::uint32_t top_level;  // s: mask of the magnitude field
  int sign_shift;           // bits - 1: the sign field's position (bits >= 2)
};

GZ_HOST_DEVICE GZ_INLINE QsgdDecodeBucket qsgd_decode_bucket(float scale, int bits) {
  QsgdDecodeBucket bucket;
  bucket.finite = qsgd_scale_is_finite(scale);
  bucket.scale = scale;
  bucket.top_level = qsgd_top_level(bits);
  bucket.step = scale / static_cast<float>(bucket.top_level);
  bucket.negative_scale = 0.0f - scale;
  bucket.sign_shift = bits - 1;
  return bucket;
}

// The decoded value of one code (bits >= 2). The min() keeps |value| <= scale: q * step can
// round above scale, and above FLT_MAX for scales near it (e.g. 127 * (FLT_MAX / 127) -> Inf).
GZ_HOST_DEVICE GZ_INLINE float qsgd_decode_multibit(std::uint32_t code,
                                                    const QsgdDecodeBucket& bucket) {
  if (!bucket.finite) return bits_float(kQsgdCanonicalNan);
  const float product = static_cast<float>(code & bucket.top_level) * bucket.step;
  const float magnitude = product < bucket.scale ? product : bucket.scale;
  return bits_float(float_bits(magnitude) | (((code >> bucket.sign_shift) & 1u) << 31));
}

GZ_HOST_DEVICE GZ_INLINE float qsgd_decode_sign(std::uint32_t code, const QsgdDecodeBucket& bucket) {
  if (!bucket.finite) return bits_float(kQsgdCanonicalNan);
  return code != 0u ? bucket.scale : bucket.negative_scale;
}

GZ_HOST_DEVICE GZ_INLINE float qsgd_decode_code(std::uint32_t code, const QsgdDecodeBucket& bucket,
                                                int bits) {
  return bits == 1 ? qsgd_decode_sign(code, bucket) : qsgd_decode_multibit(code, bucket);
}

}  // namespace gradzip::kernels
