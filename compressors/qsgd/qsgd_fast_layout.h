// The per-thread work of the fast qsgd kernels (compressors/qsgd/cuda/qsgd_kernels.cu, KernelVariant::fast),
// as GZ_HOST_DEVICE functions that take the thread's coordinates explicitly, so that
// compressors/qsgd/tests/test_qsgd_fast_layout.cpp can run every simulated thread of a launch on the CPU
// and compare the payload with the CPU codec's. The element math is compressors/qsgd/qsgd_math.h's.
//
// Encode (one block per segment of whole buckets, kernels/run_fast_layout.h):
//   1. Each thread loads its run of 16 elements and folds their |x| bits into per-bucket maxima
//      (qsgd_fast_run_maxima: the maxima of the run's completed buckets go to flush(), the last
//      one is returned for a warp reduction); it also computes the four Philox blocks that start
//      at its run's first element (qsgd_fast_own_blocks) and publishes the first of them.
//   2. Per bucket of the segment: the scale, written to the payload, and the bucket's constants
//      (qsgd_fast_encode_record) for step 3. A thread whose run needs the words of the Philox
//      block after its four (element_offset % 4 != 0) takes the block its right neighbour
//      published, or computes it when it has no neighbour (qsgd_fast_next_block).
//   3. Each thread encodes and packs its run (qsgd_fast_run_bytes): 16 codes are exactly
//      2 * bits bytes of the stream, so runs never share a byte. Of its bytes a thread writes
//      those whose elements all lie in its segment (or past count); a byte holding the last
//      elements of one segment and the first of the next (a "boundary byte", only when
//      segment_elements * bits is not a multiple of 8) is written afterwards by a separate
//      thread (qsgd_fast_code_byte), once the scales of both segments are in the payload.
//   So every stream byte is written by exactly one thread, Philox runs once per 4 elements
//   (plus one block per pass when element_offset % 4 != 0, plus the boundary bytes'), and the
//   loop over a run's elements has no division: a run's buckets are walked with
//   FastBucketWalk and their constants come precomputed.
// Decode: per segment, the buckets' constants (qsgd_fast_decode_record); each thread reads its
// run's 2 * bits stream bytes and decodes the elements of its span (qsgd_fast_decode_run).
// Validation: per segment, every scale is checked; only when the segment holds a valid
// non-finite bucket are its runs' codes read (qsgd_fast_run_has_flagged_code).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/philox_math.h"
#include "compressors/qsgd/qsgd_math.h"
#include "kernels/run_fast_layout.h"

namespace gradzip::kernels {

// At most this many buckets in a segment (the per-bucket tables in shared memory).
inline constexpr std::uint64_t kQsgdFastMaxSegmentBuckets = 1024;
// The bucket of a run that has no element in its segment.
inline constexpr std::uint32_t kQsgdFastNoBucket = 0xFFFFFFFFu;

// How a launch cuts `count` elements into segments.
struct QsgdFastPlan {
  std::uint64_t segment_buckets;   // >= 1, <= kQsgdFastMaxSegmentBuckets
  std::uint64_t segment_elements;  // segment_buckets * bucket
  std::uint64_t num_segments;      // ceil(count / segment_elements)
  // Every segment touches at most kFastThreads runs: one pass, one run per thread, the values
  // stay in registers between the maxima and the codes. Otherwise each segment is a single
  // long bucket, swept twice (maxima, then codes: the second sweep re-reads through L2).
  bool resident;
  // Some segment starts inside a code byte (see qsgd_fast_boundary_byte).
  bool boundary_bytes;
};

// The largest power of two dividing `value`, at most 16 (value >= 1).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t qsgd_fast_pow2_factor16(std::uint64_t value) {
  std::uint64_t factor = 1;
  while (factor < 16 && value % (2 * factor) == 0) factor *= 2;
  return factor;
}

// Segments of the largest number of whole buckets that fits a resident segment: preferably a
// multiple of 16 elements (segments then start at run boundaries: no run is shared by two
// blocks, and no code byte by two segments), else any number (at most kFastResidentUnaligned
// elements). Buckets longer than a resident segment get a segment each.
GZ_HOST_DEVICE GZ_INLINE QsgdFastPlan qsgd_fast_plan(std::uint64_t count, int bits, std::uint64_t bucket) {
  QsgdFastPlan plan{};
  std::uint64_t buckets = 0;
  if (bucket <= kFastResidentAligned) {
    const std::uint64_t multiple = kFastRun / qsgd_fast_pow2_factor16(bucket);
    std::uint64_t cap = kFastResidentAligned / bucket;
    if (cap > kQsgdFastMaxSegmentBuckets) cap = kQsgdFastMaxSegmentBuckets;
    buckets = cap - cap % multiple;
    if (buckets == 0) {
      buckets = kFastResidentUnaligned / bucket;
      if (buckets > kQsgdFastMaxSegmentBuckets) buckets = kQsgdFastMaxSegmentBuckets;
    }
  }
  plan.resident = buckets > 0;
  if (buckets == 0) buckets = 1;
  plan.segment_buckets = buckets;
  plan.segment_elements = buckets * bucket;
  plan.num_segments = count == 0 ? 0 : (count - 1) / plan.segment_elements + 1;
  plan.boundary_bytes =
      plan.num_segments > 1 && ((plan.segment_elements % 8) * static_cast<std::uint64_t>(bits)) % 8 != 0;
  return plan;
}

// The buckets of segment s: [s * segment_buckets, + the returned count).
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_fast_segment_buckets(const QsgdFastPlan& plan,
                                                                 const FastSegment& segment,
                                                                 std::uint64_t bucket) {
  const std::uint64_t elements = segment.end - segment.begin;
  if (elements == plan.segment_elements) return static_cast<std::uint32_t>(plan.segment_buckets);
  return static_cast<std::uint32_t>(elements / bucket + (elements % bucket != 0 ? 1 : 0));
}

// ---- Philox words ------------------------------------------------------------------------------

// The encoder's key (what gradzip's EncodeContext carries): element i of the chunk draws the
// word of global element element_offset + i (kernels/philox_math.h).
struct QsgdFastKey {
  std::uint64_t seed;
  std::uint32_t step;
  std::uint32_t tensor_id;
  std::uint64_t element_offset;
};

// Where a run's first element sits in its Philox block: element_offset % 4, the same for all
// runs (16 is a multiple of 4).
GZ_HOST_DEVICE GZ_INLINE unsigned qsgd_fast_phase(const QsgdFastKey& key) {
  return static_cast<unsigned>(key.element_offset & 3u);
}

// The Philox block of run k's first element.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t qsgd_fast_first_block(const QsgdFastKey& key, std::uint64_t k) {
  return (key.element_offset + k * kFastRun) >> 2;
}

// Run k's own blocks: the four starting at its first element's. With phase p they hold the words
// of run offsets [-p, 16 - p); offsets [16 - p, 16) take the first p words of the next block.
GZ_HOST_DEVICE GZ_INLINE void qsgd_fast_own_blocks(const QsgdFastKey& key, std::uint64_t k,
                                                   Philox4x32 (&own)[4]) {
  const std::uint64_t first = qsgd_fast_first_block(key, k);
  GZ_FAST_UNROLL
  for (unsigned j = 0; j < 4; ++j) own[j] = philox_block(key.seed, key.step, key.tensor_id, first + j);
}

// Whether run offsets that fall into the next block are in the span.
GZ_HOST_DEVICE GZ_INLINE bool qsgd_fast_needs_next(unsigned phase, const FastRunSpan& span) {
  return phase != 0 && span.end > kFastRun - phase;
}

// The block after run k's four, which is run k + 1's first own block: thread t of a pass of
// `runs` runs (run k = first + t) takes it from `published` (published[u] = own[0] of thread u
// of the same pass), the pass's last thread computes it.
GZ_HOST_DEVICE GZ_INLINE Philox4x32 qsgd_fast_next_block(const Philox4x32* published, unsigned t,
                                                         unsigned runs, const QsgdFastKey& key,
                                                         std::uint64_t k) {
  if (t + 1 < runs) return published[t + 1];
  return philox_block(key.seed, key.step, key.tensor_id, qsgd_fast_first_block(key, k) + 4);
}

// The random word of run offset r (a constant once the caller's loop is unrolled).
template <unsigned kPhase>
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_fast_word(const Philox4x32 (&own)[4],
                                                      const Philox4x32& next, unsigned r) {
  const unsigned j = r + kPhase;
  return j < kFastRun ? own[j >> 2].v[j & 3] : next.v[j - kFastRun];
}

// ---- encode ------------------------------------------------------------------------------------

// A bucket's encoder constants that depend on its scale (the rest depend on bits only).
struct QsgdFastEncodeRecord {
  float prescale;
  float inv;
  float offset;
  std::uint32_t finite;
};

GZ_HOST_DEVICE GZ_INLINE QsgdFastEncodeRecord qsgd_fast_encode_record(float scale, int bits) {
  const QsgdEncodeBucket bucket = qsgd_encode_bucket(scale, bits);
  return QsgdFastEncodeRecord{bucket.prescale, bucket.inv, bucket.offset, bucket.finite ? 1u : 0u};
}

// qsgd_encode_bucket(scale, bits) of the record's scale: the bits-only members from
// qsgd_encode_bucket itself (folded to constants for a compile-time `bits`).
GZ_HOST_DEVICE GZ_INLINE QsgdEncodeBucket qsgd_fast_encode_constants(const QsgdFastEncodeRecord& record,
                                                                     int bits) {
  QsgdEncodeBucket bucket = qsgd_encode_bucket(0.0f, bits);
  bucket.finite = record.finite != 0u;
  bucket.prescale = record.prescale;
  bucket.inv = record.inv;
  bucket.offset = record.offset;
  return bucket;
}

// The maximum of |x| bits over one bucket's elements of a run.
struct QsgdFastRunMax {
  std::uint32_t bucket;  // segment-local; kQsgdFastNoBucket for an empty span
  std::uint32_t abs_max;
};

// Folds the |x| bits of the span's elements (x[r], r in [span.first, span.end); the others are
// ignored) into per-bucket maxima: flush(bucket, abs_max) for each bucket the span leaves, the
// last bucket's maximum returned (the kernel merges those across its warp).
template <class Flush>
GZ_HOST_DEVICE GZ_INLINE QsgdFastRunMax qsgd_fast_run_maxima(const float (&x)[kFastRun],
                                                             const FastRunSpan& span, Flush&& flush) {
  QsgdFastRunMax tail{kQsgdFastNoBucket, 0u};
  if (span.first == span.end) return tail;
  tail.bucket = span.bucket;
  FastBucketWalk walk(span);
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) {
    if (r < span.first || r >= span.end) continue;
    const std::uint32_t b = walk.next();
    if (b != tail.bucket) {
      flush(tail.bucket, tail.abs_max);
      tail.bucket = b;
      tail.abs_max = 0u;
    }
    const std::uint32_t a = qsgd_abs_bits(x[r]);
    tail.abs_max = a > tail.abs_max ? a : tail.abs_max;
  }
  return tail;
}

// A run's 2 * bits stream bytes (bytes [2 * bits * k, 2 * bits * (k + 1)) of the code stream)
// as little-endian words, and which of them the thread writes.
struct QsgdFastRunBytes {
  std::uint32_t word[4];
  std::uint32_t write_mask;  // bit m: write byte m
};

// The bytes of a run its segment owns: byte m holds the bits of run offsets
// [8m / bits, (8m + 7) / bits]; it is written when all of them are in the span, or past count
// (segment_ends_at_count: the segment's end is count, so offsets >= span.end do not exist).
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_fast_write_mask(const FastRunSpan& span,
                                                            bool segment_ends_at_count) {
  std::uint32_t mask = 0;
  GZ_FAST_UNROLL
  for (unsigned m = 0; m < 2 * kBits; ++m) {
    const unsigned first = 8 * m / kBits;
    const unsigned last = (8 * m + 7) / kBits;
    if (first >= span.first && first < span.end && (last < span.end || segment_ends_at_count)) {
      mask |= 1u << m;
    }
  }
  return mask;
}

// Codes of a run, each shifted to its place: code r occupies bits [r * bits, (r + 1) * bits).
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE void qsgd_fast_pack(const std::uint32_t (&codes)[kFastRun],
                                             std::uint32_t (&word)[4]) {
  GZ_FAST_UNROLL
  for (unsigned w = 0; w < 4; ++w) word[w] = 0;
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) {
    const unsigned bit = r * kBits;
    const unsigned w = bit / 32;
    const unsigned shift = bit % 32;
    word[w] |= codes[r] << shift;
    if (shift + kBits > 32) word[w + 1] |= codes[r] >> (32 - shift);
  }
}

// The stream bytes of run k (x: its 16 values; those outside the span may be anything). Codes
// of elements outside the span are 0 (which keeps the unused high bits of the last byte 0).
// records: the constants of the segment's buckets, indexed by segment-local bucket.
template <int kBits, unsigned kPhase>
GZ_HOST_DEVICE GZ_INLINE QsgdFastRunBytes qsgd_fast_run_bytes(const float (&x)[kFastRun],
                                                              const Philox4x32 (&own)[4],
                                                              const Philox4x32& next,
                                                              const FastRunSpan& span,
                                                              bool segment_ends_at_count,
                                                              const QsgdFastEncodeRecord* records) {
  std::uint32_t codes[kFastRun];
  if (span.first == 0 && span.end == kFastRun && fast_span_in_one_bucket(span)) {
    const QsgdEncodeBucket constants = qsgd_fast_encode_constants(records[span.bucket], kBits);
    GZ_FAST_UNROLL
    for (unsigned r = 0; r < kFastRun; ++r) {
      codes[r] = qsgd_encode_code(x[r], qsgd_fast_word<kPhase>(own, next, r), constants);
    }
  } else {
    FastBucketWalk walk(span);
    GZ_FAST_UNROLL
    for (unsigned r = 0; r < kFastRun; ++r) {
      codes[r] = 0;
      if (r < span.first || r >= span.end) continue;
      const QsgdEncodeBucket constants = qsgd_fast_encode_constants(records[walk.next()], kBits);
      codes[r] = qsgd_encode_code(x[r], qsgd_fast_word<kPhase>(own, next, r), constants);
    }
  }
  QsgdFastRunBytes bytes;
  qsgd_fast_pack<kBits>(codes, bytes.word);
  bytes.write_mask = qsgd_fast_write_mask<kBits>(span, segment_ends_at_count);
  return bytes;
}

// qsgd_fast_run_bytes for a phase known at run time (one branch, the same for every thread).
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE QsgdFastRunBytes qsgd_fast_run_bytes_at(unsigned phase,
                                                                 const float (&x)[kFastRun],
                                                                 const Philox4x32 (&own)[4],
                                                                 const Philox4x32& next,
                                                                 const FastRunSpan& span,
                                                                 bool segment_ends_at_count,
                                                                 const QsgdFastEncodeRecord* records) {
  switch (phase) {
    case 1: return qsgd_fast_run_bytes<kBits, 1>(x, own, next, span, segment_ends_at_count, records);
    case 2: return qsgd_fast_run_bytes<kBits, 2>(x, own, next, span, segment_ends_at_count, records);
    case 3: return qsgd_fast_run_bytes<kBits, 3>(x, own, next, span, segment_ends_at_count, records);
    default: return qsgd_fast_run_bytes<kBits, 0>(x, own, next, span, segment_ends_at_count, records);
  }
}

// Segment s >= 1 starts inside a code byte when begin * bits is not a multiple of 8; that byte
// (stream byte begin * bits / 8, returned in *byte) holds bits of both segments' elements and
// is left to qsgd_fast_code_byte.
GZ_HOST_DEVICE GZ_INLINE bool qsgd_fast_boundary_byte(const QsgdFastPlan& plan, int bits,
                                                      std::uint64_t s, std::uint64_t* byte) {
  const std::uint64_t first_bit = s * plan.segment_elements * static_cast<std::uint64_t>(bits);
  *byte = first_bit / 8;
  return s >= 1 && s < plan.num_segments && first_bit % 8 != 0;
}

// Stream byte j computed on its own (the boundary bytes): the codes of the elements whose bits
// reach into it, from element(i) (the input) and scale_of(b) (bucket b's scale, from the
// payload). Elements past count contribute 0 bits.
template <class Element, class ScaleOf>
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_fast_code_byte(std::uint64_t j, std::uint64_t count,
                                                           int bits, std::uint64_t bucket,
                                                           const QsgdFastKey& key,
                                                           Element&& element, ScaleOf&& scale_of) {
  const auto width = static_cast<std::uint64_t>(bits);
  const std::uint64_t first_bit = 8 * j;
  const std::uint64_t first = first_bit / width;
  std::uint64_t last = (first_bit + 7) / width;
  if (last >= count) last = count - 1;
  std::uint32_t byte = 0;
  std::uint64_t block = ~std::uint64_t{0};
  Philox4x32 words{};
  for (std::uint64_t e = first; e <= last; ++e) {
    const std::uint64_t global = key.element_offset + e;
    if ((global >> 2) != block) {
      block = global >> 2;
      words = philox_block(key.seed, key.step, key.tensor_id, block);
    }
    const QsgdEncodeBucket constants = qsgd_encode_bucket(scale_of(e / bucket), bits);
    const std::uint32_t code = qsgd_encode_code(element(e), words.v[global & 3], constants);
    const std::uint64_t code_bit = e * width;
    byte |= code_bit >= first_bit ? code << (code_bit - first_bit) : code >> (first_bit - code_bit);
  }
  return byte & 0xFFu;
}

// ---- decode ------------------------------------------------------------------------------------

// A bucket's decoder constants that depend on its scale.
struct QsgdFastDecodeRecord {
  float scale;
  float step;
  float negative_scale;
  std::uint32_t finite;
};

GZ_HOST_DEVICE GZ_INLINE QsgdFastDecodeRecord qsgd_fast_decode_record(float scale, int bits) {
  const QsgdDecodeBucket bucket = qsgd_decode_bucket(scale, bits);
  return QsgdFastDecodeRecord{bucket.scale, bucket.step, bucket.negative_scale, bucket.finite ? 1u : 0u};
}

GZ_HOST_DEVICE GZ_INLINE QsgdDecodeBucket qsgd_fast_decode_constants(const QsgdFastDecodeRecord& record,
                                                                     int bits) {
  QsgdDecodeBucket bucket = qsgd_decode_bucket(0.0f, bits);
  bucket.finite = record.finite != 0u;
  bucket.scale = record.scale;
  bucket.step = record.step;
  bucket.negative_scale = record.negative_scale;
  return bucket;
}

// How many of run k's 2 * bits stream bytes exist (the stream has code_bytes bytes).
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE unsigned qsgd_fast_run_stream_bytes(std::uint64_t k, std::uint64_t code_bytes) {
  const std::uint64_t first = std::uint64_t{2 * kBits} * k;
  if (first >= code_bytes) return 0;
  return code_bytes - first < 2 * kBits ? static_cast<unsigned>(code_bytes - first) : 2 * kBits;
}

// Code r of a run from its stream bytes (as qsgd_fast_run_bytes packs them).
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE std::uint32_t qsgd_fast_unpack(const std::uint32_t (&word)[4], unsigned r) {
  const unsigned bit = r * kBits;
  const unsigned w = bit / 32;
  const unsigned shift = bit % 32;
  std::uint32_t code = word[w] >> shift;
  if (shift + kBits > 32) code |= word[w + 1] << (32 - shift);
  return code & ((1u << kBits) - 1u);
}

// The decoded values of the span's elements (values[r] for r in [span.first, span.end); the
// others are set to 0 and must not be stored). records: as for the encoder.
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE void qsgd_fast_decode_run(const std::uint32_t (&word)[4], const FastRunSpan& span,
                                                   const QsgdFastDecodeRecord* records,
                                                   float (&values)[kFastRun]) {
  if (span.first == 0 && span.end == kFastRun && fast_span_in_one_bucket(span)) {
    const QsgdDecodeBucket constants = qsgd_fast_decode_constants(records[span.bucket], kBits);
    GZ_FAST_UNROLL
    for (unsigned r = 0; r < kFastRun; ++r) {
      values[r] = qsgd_decode_code(qsgd_fast_unpack<kBits>(word, r), constants, kBits);
    }
    return;
  }
  FastBucketWalk walk(span);
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) {
    values[r] = 0.0f;
    if (r < span.first || r >= span.end) continue;
    const QsgdDecodeBucket constants = qsgd_fast_decode_constants(records[walk.next()], kBits);
    values[r] = qsgd_decode_code(qsgd_fast_unpack<kBits>(word, r), constants, kBits);
  }
}

// Validation: whether an element of the span that lies in a flagged bucket (flagged[b] != 0:
// a valid non-finite scale, whose codes must all be 0) has a non-zero code.
template <int kBits>
GZ_HOST_DEVICE GZ_INLINE bool qsgd_fast_run_has_flagged_code(const std::uint32_t (&word)[4],
                                                             const FastRunSpan& span,
                                                             const std::uint32_t* flagged) {
  bool found = false;
  FastBucketWalk walk(span);
  GZ_FAST_UNROLL
  for (unsigned r = 0; r < kFastRun; ++r) {
    if (r < span.first || r >= span.end) continue;
    const std::uint32_t b = walk.next();
    if (flagged[b] != 0u && qsgd_fast_unpack<kBits>(word, r) != 0u) found = true;
  }
  return found;
}

// The scale check of one bucket: *flagged = a valid non-finite scale (its codes must be 0);
// returns false for a scale encode never writes.
GZ_HOST_DEVICE GZ_INLINE bool qsgd_fast_check_scale(float scale, std::uint32_t* flagged) {
  const bool valid = qsgd_scale_is_valid(scale);
  *flagged = valid && !qsgd_scale_is_finite(scale) ? 1u : 0u;
  return valid;
}

}  // namespace gradzip::kernels
