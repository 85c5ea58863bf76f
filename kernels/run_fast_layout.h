// Index arithmetic shared by the fast bucketed CUDA kernels
// (compressors/qsgd/cuda/qsgd_kernels.cu, compressors/sign/cuda/sign_kernels.cu) and their CPU emulations
// (compressors/qsgd/tests/test_qsgd_fast_layout.cpp, compressors/sign/tests/test_sign_fast_layout.cpp):
// segments of whole buckets, runs of 16 elements, and which elements of a run belong to which
// bucket of its segment. GZ_HOST_DEVICE and C++17, so that the CPU tests execute the very code
// the kernels run, thread by thread.
//
// Vocabulary (element indices i count from the chunk's first element, 0 <= i < count):
//   bucket b   elements [b * bucket, min((b + 1) * bucket, count)) (the codecs' buckets)
//   segment s  elements [s * S, min((s + 1) * S, count)) with S = segment_buckets * bucket:
//              whole buckets, one thread block's work
//   run k      elements [16 k, 16 k + 16): one thread's elements (a run may reach past count,
//              and past its segment's ends: a run that straddles two segments is processed by
//              both blocks, each for its own elements)
//   span       the elements of a run inside its segment, with the segment-local bucket of the
//              first one, so that a thread walks its run's buckets without a division per
//              element.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

// Full unrolling in device code (register arrays indexed by the loop counter stay in
// registers); the host compilers do as they please.
#if defined(__CUDA_ARCH__)
#define GZ_FAST_UNROLL _Pragma("unroll")
#else
#define GZ_FAST_UNROLL
#endif

namespace gradzip::kernels {

// Elements per run (per thread and pass).
inline constexpr unsigned kFastRun = 16;
// Threads per block of the fast kernels; a resident segment has at most this many runs.
inline constexpr unsigned kFastThreads = 256;
// Elements of a resident segment: kFastThreads runs when the segment starts at a multiple of
// 16, one run less of elements when it may start anywhere (a misaligned segment of
// kFastResidentUnaligned elements touches at most kFastThreads runs).
inline constexpr std::uint64_t kFastResidentAligned = kFastThreads * kFastRun;
inline constexpr std::uint64_t kFastResidentUnaligned = kFastResidentAligned - kFastRun;

// A segment's elements [begin, end).
struct FastSegment {
  std::uint64_t begin;
  std::uint64_t end;
};

GZ_HOST_DEVICE GZ_INLINE FastSegment fast_segment(std::uint64_t s, std::uint64_t segment_elements,
                                                  std::uint64_t count) {
  const std::uint64_t begin = s * segment_elements;
  const std::uint64_t end = count - begin < segment_elements ? count : begin + segment_elements;
  return FastSegment{begin, end};
}

// The runs one block's threads take in one pass: thread t takes run first + t when t < runs.
struct FastPass {
  std::uint64_t first;
  unsigned runs;  // 1 .. kFastThreads
};

// Runs [first_run, end_run) of a segment: floor(begin / 16) .. ceil(end / 16).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t fast_first_run(const FastSegment& segment) {
  return segment.begin / kFastRun;
}
GZ_HOST_DEVICE GZ_INLINE std::uint64_t fast_end_run(const FastSegment& segment) {
  return (segment.end + kFastRun - 1) / kFastRun;
}

// Pass p of a segment (p < fast_pass_count): kFastThreads consecutive runs, the last pass fewer.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t fast_pass_count(const FastSegment& segment) {
  return (fast_end_run(segment) - fast_first_run(segment) + kFastThreads - 1) / kFastThreads;
}
GZ_HOST_DEVICE GZ_INLINE FastPass fast_pass(const FastSegment& segment, std::uint64_t p) {
  const std::uint64_t first = fast_first_run(segment) + p * kFastThreads;
  const std::uint64_t left = fast_end_run(segment) - first;
  return FastPass{first, static_cast<unsigned>(left < kFastThreads ? left : kFastThreads)};
}

// The elements of run k inside segment [begin, end), as run offsets r in [first, end), and
// the segment-local bucket of element `first`.
struct FastRunSpan {
  unsigned first;        // 0 .. 16
  unsigned end;          // first .. 16 (first == end: no element of the run is in the segment)
  std::uint32_t bucket;  // segment-local bucket of run offset `first`
  std::uint32_t left;    // elements of that bucket from `first` on, capped at kFastRun + 1
  std::uint32_t refill;  // min(bucket size, kFastRun + 1): `left` of each later bucket
};

// one_bucket_segments: every segment is a single bucket (its local bucket is always 0, so no
// division at all). Otherwise a segment holds at most kFastResidentAligned elements and the
// local bucket of the first element takes one 32-bit division per run.
GZ_HOST_DEVICE GZ_INLINE FastRunSpan fast_run_span(std::uint64_t k, const FastSegment& segment,
                                                   std::uint64_t bucket, bool one_bucket_segments) {
  const std::uint64_t run_begin = k * kFastRun;
  FastRunSpan span;
  span.refill = static_cast<std::uint32_t>(bucket < kFastRun + 1 ? bucket : kFastRun + 1);
  span.first = segment.begin > run_begin
                   ? static_cast<unsigned>(segment.begin - run_begin < kFastRun ? segment.begin - run_begin : kFastRun)
                   : 0u;
  span.end = segment.end > run_begin
                 ? static_cast<unsigned>(segment.end - run_begin < kFastRun ? segment.end - run_begin : kFastRun)
                 : 0u;
  if (span.end < span.first) span.end = span.first;
  span.bucket = 0;
  span.left = 0;
  if (span.first == span.end) return span;
  const std::uint64_t offset = run_begin + span.first - segment.begin;  // in the segment
  std::uint64_t in_bucket = offset;                                    // in its bucket
  if (!one_bucket_segments) {
    const auto offset32 = static_cast<std::uint32_t>(offset);
    const auto bucket32 = static_cast<std::uint32_t>(bucket);
    span.bucket = offset32 / bucket32;
    in_bucket = offset32 - span.bucket * bucket32;
  }
  const std::uint64_t left = bucket - in_bucket;
  span.left = static_cast<std::uint32_t>(left < kFastRun + 1 ? left : kFastRun + 1);
  return span;
}

// Whether the whole span lies in bucket span.bucket.
GZ_HOST_DEVICE GZ_INLINE bool fast_span_in_one_bucket(const FastRunSpan& span) {
  return span.left >= span.end - span.first;
}

// Walks the buckets of a span: call next() once for each run offset r in [first, end), in
// increasing order; it returns the segment-local bucket of that element.
struct FastBucketWalk {
  std::uint32_t bucket;
  std::uint32_t left;
  std::uint32_t refill;

  GZ_HOST_DEVICE GZ_INLINE explicit FastBucketWalk(const FastRunSpan& span)
      : bucket(span.bucket), left(span.left), refill(span.refill) {}

  GZ_HOST_DEVICE GZ_INLINE std::uint32_t next() {
    if (left == 0) {
      ++bucket;
      left = refill;
    }
    --left;
    return bucket;
  }
};

}  // namespace gradzip::kernels

#if defined(__CUDACC__)
// ---- device only: a run's loads and stores ------------------------------------------------------
namespace gradzip::kernels::fast_device {

// Run k's 16 input values: four float4 loads when `vector` (the input is 16-byte aligned) and
// the whole run lies below count, else one load per element, 0 past count.
__device__ __forceinline__ void load_run(const float* in, std::uint64_t count, std::uint64_t k,
                                         bool vector, float (&x)[kFastRun]) {
  const std::uint64_t first = k * kFastRun;
  if (vector && count - first >= kFastRun) {
    const float4* quads = reinterpret_cast<const float4*>(in + first);
    GZ_FAST_UNROLL
    for (unsigned q = 0; q < kFastRun / 4; ++q) {
      const float4 quad = quads[q];
      x[4 * q] = quad.x;
      x[4 * q + 1] = quad.y;
      x[4 * q + 2] = quad.z;
      x[4 * q + 3] = quad.w;
    }
    return;
  }
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) x[r] = first + r < count ? in[first + r] : 0.0f;
}

// out[16 k + r] = values[r] (kAccumulate: +=, one f32 add) for r in [span.first, span.end):
// four float4 stores (and loads) when `vector` (out is 16-byte aligned) and the span is the
// whole run, else one per element. Elements outside the span are not touched.
template <bool kAccumulate>
__device__ __forceinline__ void store_run_values(float* out, std::uint64_t k, const FastRunSpan& span,
                                                 const float (&values)[kFastRun], bool vector) {
  float* const at = out + k * kFastRun;
  if (vector && span.first == 0 && span.end == kFastRun) {
    float4* const quads = reinterpret_cast<float4*>(at);
    GZ_FAST_UNROLL
    for (unsigned q = 0; q < kFastRun / 4; ++q) {
      float4 quad = make_float4(values[4 * q], values[4 * q + 1], values[4 * q + 2], values[4 * q + 3]);
      if constexpr (kAccumulate) {
        const float4 old = quads[q];
        quad = make_float4(old.x + quad.x, old.y + quad.y, old.z + quad.z, old.w + quad.w);
      }
      quads[q] = quad;
    }
    return;
  }
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) {
    if (r < span.first || r >= span.end) continue;
    if constexpr (kAccumulate) {
      at[r] += values[r];
    } else {
      at[r] = values[r];
    }
  }
}

}  // namespace gradzip::kernels::fast_device
#endif  // __CUDACC__
