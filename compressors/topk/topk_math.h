// Element math of the top-k codec, shared by the CPU loops (topk_cpu.*) and the CUDA kernels
// (cuda/topk_kernels.cu), so that both select the same entries.
//
// Magnitude key. An element's rank is decided by its magnitude key: the f32 bit pattern with
// the sign bit cleared, read as an unsigned 32-bit integer. For non-NaN values the key order is
// the order of |x| (IEEE 754 magnitudes are ordered like their bit patterns), with -0 and +0
// equal (key 0) and +-Inf the largest finite-or-infinite key, 0x7F800000. A NaN has a key above
// 0x7F800000, so NaNs outrank every number, Inf included; NaNs among themselves are ordered by
// payload. f16/bf16 inputs are widened to f32 exactly first, so their keys order the same way.
// Keys are integers: no float comparison, no NaN-dependent branch, no undefined behaviour.
//
// Ordering rule (what "top-k" means): element a ranks before element b iff
//   key(a) > key(b), or key(a) == key(b) and index(a) < index(b).
// This is a strict total order, so the top-k set is unique: among equal magnitudes the lowest
// indices win.
//
// Sampling (how the threshold of the candidate pass is estimated, see topk_cpu.h). Tensors of
// at most kTopkSampleAllCount elements are sampled whole. Larger tensors are split into
// kTopkSampleGroups equal segments of floor(n / kTopkSampleGroups) elements (the last
// n mod kTopkSampleGroups elements belong to no segment); the sample holds kTopkSampleRun
// consecutive elements of every segment, starting at an offset drawn with Philox under
// gradzip's keying (kernels/philox_math.h), the segment number playing the element:
//   word   = philox_element(seed, step, tensor_id, segment)
//   span   = segment length - kTopkSampleRun + 1 (the possible offsets)
//   offset = (word * span) >> 32 when span <= 2^32, else word itself (segments of more than
//            2^32 elements, i.e. tensors of more than 2^44)
// Runs of consecutive elements keep the sample to a few thousand cache lines; the random
// offsets keep a periodic structure of the tensor (rows of a matrix) from aliasing with a fixed
// stride. The threshold is the r-th largest key of the sample, r = topk_sample_rank(), or 0
// when r exceeds the sample size.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/philox_math.h"

namespace gradzip::kernels {

inline constexpr std::uint32_t kTopkKeyMask = 0x7FFFFFFFu;

// Tensors up to this many elements are sampled whole (the threshold is then the exact k-th key).
inline constexpr std::uint64_t kTopkSampleAllCount = 65536;
// Larger tensors: this many segments, kTopkSampleRun consecutive elements sampled in each
// (kTopkSampleGroups * kTopkSampleRun = 65536 sampled elements).
inline constexpr std::uint64_t kTopkSampleGroups = 4096;
inline constexpr std::uint64_t kTopkSampleRun = 16;

// The magnitude key of f32 bits / of a float (see above).
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_key_of_bits(std::uint32_t bits) {
  return bits & kTopkKeyMask;
}
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_key(float value) {
  return topk_key_of_bits(float_bits(value));
}

// True when (key_a, index_a) ranks before (key_b, index_b) under the ordering rule. (The CPU
// selection applies the rule without pairwise comparisons: it finds the k-th key K, keeps
// every key > K and the keys == K in increasing index order until it has k.)
GZ_HOST_DEVICE GZ_INLINE bool topk_ranks_before(std::uint32_t key_a, std::uint64_t index_a,
                                                std::uint32_t key_b, std::uint64_t index_b) {
  return key_a > key_b || (key_a == key_b && index_a < index_b);
}

// Radix selection over keys works on three digits, most significant first: bits 30..20 (the
// sign bit is always 0 in a key), bits 19..9 and bits 8..0.
inline constexpr int kTopkDigitLevels = 3;
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_digit_bins(int level) { return level < 2 ? 2048u : 512u; }
GZ_HOST_DEVICE GZ_INLINE int topk_digit_shift(int level) { return level == 0 ? 20 : (level == 1 ? 9 : 0); }
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_key_digit(std::uint32_t key, int level) {
  return (key >> topk_digit_shift(level)) & (topk_digit_bins(level) - 1u);
}

// Number of elements in the sample of an n-element tensor.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_sample_count(std::uint64_t n) {
  return n <= kTopkSampleAllCount ? n : kTopkSampleGroups * kTopkSampleRun;
}

// First element of the sampled run of `segment` (n > kTopkSampleAllCount). The run
// [start, start + kTopkSampleRun) lies inside the segment.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_sample_run_start(std::uint64_t n, std::uint64_t segment,
                                                             std::uint64_t seed, std::uint32_t step,
                                                             std::uint32_t tensor_id) {
  const std::uint64_t segment_length = n / kTopkSampleGroups;  // >= 16 since n > 65536
  const std::uint64_t span = segment_length - kTopkSampleRun + 1;
  const std::uint64_t word = philox_element(seed, step, tensor_id, segment);
  const std::uint64_t offset = span <= (std::uint64_t{1} << 32) ? (word * span) >> 32 : word;
  return segment * segment_length + offset;
}

// floor(sqrt(value)) for value < 2^52, by bisection on integers (no library call, the same
// result on every device).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_isqrt(std::uint64_t value) {
  std::uint64_t low = 0, high = std::uint64_t{1} << 26;  // high * high > value
  while (high - low > 1) {
    const std::uint64_t mid = low + (high - low) / 2;
    if (mid * mid <= value) low = mid; else high = mid;
  }
  return low;
}

// ceil(k * s / n) for 1 <= k <= n, s <= 2^16, without overflow for any n < 2^64: the number of
// sample elements expected at or above the true k-th key.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_expected_in_sample(std::uint64_t k, std::uint64_t n,
                                                               std::uint64_t s) {
  if (k <= (~std::uint64_t{0}) / s) {
    const std::uint64_t product = k * s;
    return product / n + (product % n != 0 ? 1 : 0);
  }
  // k > 2^48, so n > 2^48 too: drop 16 low bits of both (an estimate is all this feeds).
  return ((k >> 16) * s) / (n >> 16) + 1;
}

// The rank r (1-based, may exceed s) of the sample key used as the candidate threshold.
//  - Whole-tensor sample (n <= kTopkSampleAllCount): r = k, the threshold is the exact k-th key.
//  - exact: r = e + 4 * floor(sqrt(e)) + 16 with e = ceil(k * s / n). The count of sample
//    elements at or above the true k-th key is about Binomial(s, k / n), standard deviation
//    <= sqrt(e); four of them plus 16 make a threshold above the true k-th key (fewer than k
//    candidates, a second pass) very unlikely unless the data is far from exchangeable.
//  - approx: r = e, the plain estimate of the k-th key (DGC): about k candidates, either side.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_sample_rank(std::uint64_t k, std::uint64_t n,
                                                        bool approx) {
  if (n <= kTopkSampleAllCount) return k;
  const std::uint64_t s = topk_sample_count(n);
  const std::uint64_t e = topk_expected_in_sample(k, n, s);
  if (approx) return e;
  return e + 4 * topk_isqrt(e) + 16;
}

}  // namespace gradzip::kernels
