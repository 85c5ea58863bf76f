// The per-thread work of the fast sign kernels (compressors/sign/cuda/sign_kernels.cu, KernelVariant::fast),
// as GZ_HOST_DEVICE functions that take the thread's coordinates explicitly, so that
// compressors/sign/tests/test_sign_fast_layout.cpp can run every simulated thread of a launch on the CPU
// and compare the payload with the CPU codec's. The element math and the canonical summation
// order of the scales are compressors/sign/sign_math.h's.
//
// Encode, one block per segment of whole buckets (kernels/run_fast_layout.h):
//   resident segments (bucket <= kFastResidentAligned, segment <= kFastResidentAligned elements):
//     0. the block stages the elements [begin, sign_fast_staged_end) in shared memory (the
//        segment plus up to 7 elements after it, which the segment's last sign byte needs);
//     1. buckets of >= 16 elements: thread (b, l) folds lane l of bucket b
//        (sign_fast_lane_fold: elements l, l + 16, ... in increasing order from +0.0f, exactly
//        the canonical lane l of sign_math.h);
//     2. one thread per bucket combines the 16 lanes with sign_combine_lanes and
//        sign_scale_from_sum, rescuing an overflowed sum with sign_rescued_scale over the staged
//        elements (sign_fast_scale_from_lanes); buckets of < 16 elements take
//        sign_bucket_scale, the scalar reference, over the staged elements;
//     3. the sign bytes the segment owns (sign_fast_owned_bytes: those whose first element is in
//        the segment), 32 elements (4 bytes) per warp step: lane j contributes the sign bit of
//        element 32 G + j (sign_fast_lane_bit), the warp ballot is the group's word, and the
//        bytes of it the segment owns are stored (sign_fast_group_mask).
//   one long bucket per segment: the block stages the bucket chunk by chunk, threads 0..15
//   continue their lane folds over each chunk; then step 2, and step 3 reading the input again.
// Every scale is computed with the reference's f32 operations on the reference's operands, in
// its order, and every sign byte is written by exactly one thread.
// Decode: per segment, the buckets' scales into shared memory; each thread decodes its run of
// 16 elements from the run's two sign bytes (sign_fast_decode_run).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/run_fast_layout.h"
#include "compressors/sign/sign_math.h"

namespace gradzip::kernels {

// The most buckets of >= 16 elements a resident segment holds (16 lane sums each).
inline constexpr std::uint64_t kSignFastMaxLaneBuckets = kFastResidentAligned / kSignLanes;
// Staged elements of a resident segment: the segment and the 7 that may follow it.
inline constexpr std::uint64_t kSignFastStaged = kFastResidentAligned + 8;

struct SignFastPlan {
  std::uint64_t segment_buckets;   // >= 1, <= kFastResidentAligned
  std::uint64_t segment_elements;  // segment_buckets * bucket
  std::uint64_t num_segments;      // ceil(count / segment_elements)
  // Segments of at most kFastResidentAligned elements, staged whole; otherwise each segment is
  // one bucket, staged chunk by chunk.
  bool resident;
};

GZ_HOST_DEVICE GZ_INLINE SignFastPlan sign_fast_plan(std::uint64_t count, std::uint64_t bucket) {
  SignFastPlan plan{};
  plan.resident = bucket <= kFastResidentAligned;
  plan.segment_buckets = plan.resident ? kFastResidentAligned / bucket : 1;
  plan.segment_elements = plan.segment_buckets * bucket;
  plan.num_segments = count == 0 ? 0 : (count - 1) / plan.segment_elements + 1;
  return plan;
}

// The buckets of segment s: [s * segment_buckets, + the returned count).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t sign_fast_segment_buckets(const SignFastPlan& plan,
                                                                 const FastSegment& segment,
                                                                 std::uint64_t bucket) {
  const std::uint64_t elements = segment.end - segment.begin;
  if (elements == plan.segment_elements) return plan.segment_buckets;
  return elements / bucket + (elements % bucket != 0 ? 1 : 0);
}

// The length of the segment's local bucket b.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t sign_fast_bucket_length(const FastSegment& segment,
                                                               std::uint64_t bucket, std::uint64_t b) {
  const std::uint64_t begin = b * bucket;
  const std::uint64_t elements = segment.end - segment.begin;
  return elements - begin < bucket ? elements - begin : bucket;
}

// ---- scales ------------------------------------------------------------------------------------

// Lane `lane` of the canonical sum, continued from `sum` over x[0, len) (x starts at a
// multiple of 16 elements from its bucket's start): sum + |x[lane]| + |x[lane + 16]| + ...,
// added in that order.
GZ_HOST_DEVICE GZ_INLINE float sign_fast_lane_fold(float sum, const float* x, std::uint64_t len,
                                                   unsigned lane) {
  for (std::uint64_t j = lane; j < len; j += kSignLanes) sum += sign_abs(x[j]);
  return sum;
}

// The scale of the bucket x[0, len) whose 16 canonical lane sums are lanes[0, 16):
// sign_bucket_scale's steps 2 and 3 (the overflow rescue reads x again).
GZ_HOST_DEVICE GZ_INLINE float sign_fast_scale_from_lanes(const float* lanes, const float* x,
                                                          std::uint64_t len) {
  const float scale = sign_scale_from_sum(sign_combine_lanes(lanes), len);
  return sign_scale_overflowed(scale) ? sign_rescued_scale(x, len) : scale;
}

// ---- sign bits ---------------------------------------------------------------------------------

// The elements a resident segment stages: [begin, min(8 * ceil(end / 8), count)), so that the
// last sign byte it owns has all its elements.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t sign_fast_staged_end(const FastSegment& segment, std::uint64_t count) {
  const std::uint64_t rounded = segment.end + (8 - segment.end % 8) % 8;
  return rounded < count ? rounded : count;
}

// The sign bytes a segment writes: [ceil(begin / 8), ceil(end / 8)), the bytes whose first
// element lies in the segment (the last one also holds up to 7 elements of the next segment).
struct SignFastBytes {
  std::uint64_t begin;
  std::uint64_t end;
};

GZ_HOST_DEVICE GZ_INLINE SignFastBytes sign_fast_owned_bytes(const FastSegment& segment) {
  return SignFastBytes{segment.begin / 8 + (segment.begin % 8 != 0 ? 1 : 0),
                       segment.end / 8 + (segment.end % 8 != 0 ? 1 : 0)};
}

// The 32-element groups (4 sign bytes each) holding the owned bytes: [first, end).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t sign_fast_first_group(const SignFastBytes& bytes) {
  return bytes.begin / 4;
}
GZ_HOST_DEVICE GZ_INLINE std::uint64_t sign_fast_end_group(const SignFastBytes& bytes) {
  return bytes.end / 4 + (bytes.end % 4 != 0 ? 1 : 0);
}

// Bit m: byte 4 G + m of group G is owned.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t sign_fast_group_mask(std::uint64_t group, const SignFastBytes& bytes) {
  std::uint32_t mask = 0;
  for (unsigned m = 0; m < 4; ++m) {
    const std::uint64_t byte = 4 * group + m;
    if (byte >= bytes.begin && byte < bytes.end) mask |= 1u << m;
  }
  return mask;
}

// Lane j's bit of group G's word: sign_bit of element i = 32 G + j when i is in [lo, hi) (the
// elements at hand: a resident segment's staged ones, or [0, count)), else 0. Elements past
// count thus give 0 (the unused high bits of the last byte); load(i) is called only inside
// [lo, hi).
template <class Load>
GZ_HOST_DEVICE GZ_INLINE std::uint32_t sign_fast_lane_bit(std::uint64_t group, unsigned lane, std::uint64_t lo,
                                                          std::uint64_t hi, Load&& load) {
  const std::uint64_t i = 32 * group + lane;
  return i >= lo && i < hi ? sign_bit(load(i)) : 0u;
}

// ---- decode ------------------------------------------------------------------------------------

// The decoded values of run k's span from its 16 sign bits (bit r: element 16 k + r, as sign
// bytes 2 k and 2 k + 1 hold them) and the segment's scales (indexed by local bucket). values[r]
// outside the span are set to 0 and must not be stored.
GZ_HOST_DEVICE GZ_INLINE void sign_fast_decode_run(std::uint32_t bits, const FastRunSpan& span,
                                                   const float* scales, float (&values)[kFastRun]) {
  if (span.first == 0 && span.end == kFastRun && fast_span_in_one_bucket(span)) {
    const float scale = scales[span.bucket];
    GZ_FAST_UNROLL
    for (unsigned r = 0; r < kFastRun; ++r) values[r] = sign_decoded(scale, bits >> r & 1u);
    return;
  }
  FastBucketWalk walk(span);
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) {
    values[r] = 0.0f;
    if (r < span.first || r >= span.end) continue;
    values[r] = sign_decoded(scales[walk.next()], bits >> r & 1u);
  }
}

}  // namespace gradzip::kernels
