// Element math of the `sign` codec (1 bit per element plus one f32 scale per bucket), shared
// by the CPU loops (compressors/sign/sign_cpu*.cpp) and the CUDA kernels so that both give the
// same bits.
//
// Buckets: elements [b * bucket, min((b + 1) * bucket, n)) form bucket b; the last one may be
// shorter. Its length is `len`.
//
// Sign bit: bit = 1 when x < 0 (an ordered compare), else 0. So +0.0 and -0.0 give 0, -inf
// gives 1, and NaN (of either sign) gives 0.
//
// Scale: mean |x| of the bucket, scale = S / (float)len (or step 3's rescue when that is
// +inf), where S is the f32 sum of |x| in this CANONICAL ORDER (every path, scalar, AVX2,
// AVX-512 and a GPU block reduction, must follow it to give the same bits):
//   1. 16 lanes, all starting at +0.0f. Element j of the bucket (j counted from the bucket's
//      start) is added to lane j % 16; each lane adds its elements in increasing j:
//        lane[l] = (((0 + |x_l|) + |x_{l+16}|) + |x_{l+32}|) + ...
//   2. The lanes are combined by a fixed pairwise tree, halving the width each level:
//        s8[l] = lane[l] + lane[l + 8]   for l < 8
//        s4[l] = s8[l]   + s8[l + 4]     for l < 4
//        s2[l] = s4[l]   + s4[l + 2]     for l < 2
//        S     = s2[0]   + s2[1]
//      (what a 512 -> 256 -> 128 -> 64 -> 32-bit halving reduction of a 16-lane vector, or a
//      shuffle-down reduction with offsets 8, 4, 2, 1, computes).
//   Every partial sum is >= +0.0 (never -0.0), so adding +0.0 to a lane is exact: a vector
//   path may pad a short tail with zeros instead of masking it.
//   (float)len rounds to nearest even (exact for len <= 2^24); the division is IEEE, rounded
//   to nearest (CUDA: the default -prec-div=true). No FMA anywhere; denormals are not
//   flushed (CUDA: no -ftz).
//
// Overflow rescue: when S is +inf (step 3; buckets of finite elements near FLT_MAX whose sum
// overflows f32, or buckets holding an inf), the scale is computed again from the elements:
//   S' = the sum of |x_j| * 2^-32 in the same canonical order (16 lanes, then the tree);
//   scale = S' == +inf ? +inf : min((S' / (float)len) * 2^32, FLT_MAX).
// Every term is below 2^96 and a bucket holds at most 2^31 elements, so S' of finite elements
// stays finite; S' / len is then a normal number, so the * 2^32 is exact, and the min only
// absorbs the last rounding (the true mean |x| is at most FLT_MAX). Multiplying by 2^-32 is
// exact for |x| >= 2^-94 and rounds to nearest below that (such elements are 2^-222 of a sum
// that overflowed). A bucket holding an inf keeps +inf (inf * 2^-32 = inf). No NaN can be in
// a bucket whose S is +inf (a NaN makes S a NaN). Vector paths may compute steps 1-2 only
// and rescue afterwards the buckets whose scale came out +inf: the result is the same.
//
// Non-finite inputs (no undefined behaviour anywhere):
//   - an inf in a bucket makes the scale +inf;
//   - a NaN in a bucket makes the scale the canonical NaN 0x7FC00000 (NaN payloads are not
//     propagated: CPUs and GPUs pick different ones);
//   so such a bucket decodes to +-inf or +-NaN. Other buckets are unaffected. A bucket of
//   finite elements always has a finite scale.
//
// Decoded value: bit ? -scale : +scale, computed as the scale's bits XOR (bit << 31), which
// is IEEE negation (defined for NaN and zero too: a zero scale decodes to +0.0 or -0.0).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gradzip::kernels {

// Lanes of the canonical bucket sum (see above).
inline constexpr int kSignLanes = 16;

// The NaN every NaN scale is replaced by.
inline constexpr std::uint32_t kSignCanonicalNanBits = 0x7FC00000u;

// The overflow rescue's factors (see above): 2^-32 on every term, 2^32 on the mean.
inline constexpr float kSignRescueDown = 0x1p-32f;
inline constexpr float kSignRescueUp = 0x1p32f;
inline constexpr float kSignMaxFinite = 0x1.fffffep127f;  // FLT_MAX

// |x|: the sign bit cleared (exact for every input, NaN included).
GZ_HOST_DEVICE GZ_INLINE float sign_abs(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }

// 1 when x < 0 (ordered: NaN and -0.0 give 0), else 0.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t sign_bit(float x) { return x < 0.0f ? 1u : 0u; }

// Step 2 of the canonical order: the pairwise tree over the 16 lane sums.
GZ_HOST_DEVICE GZ_INLINE float sign_combine_lanes(const float* lanes) {
  float s8[8];
  for (int l = 0; l < 8; ++l) s8[l] = lanes[l] + lanes[l + 8];
  float s4[4];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  const float s2_0 = s4[0] + s4[2];
  const float s2_1 = s4[1] + s4[3];
  return s2_0 + s2_1;
}

// The scale of a bucket of `len` >= 1 elements whose canonical |x| sum is `sum`.
GZ_HOST_DEVICE GZ_INLINE float sign_scale_from_sum(float sum, std::uint64_t len) {
  const float scale = sum / static_cast<float>(len);
  return scale != scale ? bits_float(kSignCanonicalNanBits) : scale;
}

// Whether a scale from steps 1-2 needs the overflow rescue: it is exactly +inf.
GZ_HOST_DEVICE GZ_INLINE bool sign_scale_overflowed(float scale) {
  return float_bits(scale) == 0x7F800000u;
}

// The overflow rescue's scale of the bucket x[0, len), len >= 1 (see above).
GZ_HOST_DEVICE GZ_INLINE float sign_rescued_scale(const float* x, std::uint64_t len) {
  float lanes[kSignLanes];
  for (int l = 0; l < kSignLanes; ++l) lanes[l] = 0.0f;
  for (std::uint64_t j = 0; j < len; ++j) lanes[j % kSignLanes] += sign_abs(x[j]) * kSignRescueDown;
  const float sum = sign_combine_lanes(lanes);
  if (sign_scale_overflowed(sum)) return sum;
  const float scale = sum / static_cast<float>(len) * kSignRescueUp;
  return scale > kSignMaxFinite ? kSignMaxFinite : scale;
}

// The scale of the bucket x[0, len), len >= 1, in the canonical order, rescue included (the
// scalar reference).
GZ_HOST_DEVICE GZ_INLINE float sign_bucket_scale(const float* x, std::uint64_t len) {
  float lanes[kSignLanes];
  for (int l = 0; l < kSignLanes; ++l) lanes[l] = 0.0f;
  for (std::uint64_t j = 0; j < len; ++j) lanes[j % kSignLanes] += sign_abs(x[j]);
  const float scale = sign_scale_from_sum(sign_combine_lanes(lanes), len);
  return sign_scale_overflowed(scale) ? sign_rescued_scale(x, len) : scale;
}

// The decoded value of an element with sign bit `bit` (0 or 1) in a bucket of `scale`.
GZ_HOST_DEVICE GZ_INLINE float sign_decoded(float scale, std::uint32_t bit) {
  return bits_float(float_bits(scale) ^ (bit << 31));
}

}  // namespace gradzip::kernels
