// Host kernels of the `sign` codec: pack sign bits, sum |x| per bucket in the canonical order
// of compressors/sign/sign_math.h, and expand bits back to +-scale. Vectorised for AVX2 and AVX-512
// (compressors/sign/sign_cpu_avx2.cpp, sign_cpu_avx512.cpp), dispatched on active_isa(); every
// path gives the bits of the scalar reference in sign_math.h.
//
// Memory the payload lives in (scales, bits) may sit at any alignment: these kernels read and
// write it bytewise or with unaligned accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "compressors/sign/sign_math.h"

namespace gradzip::kernels::cpu {

// The loop bodies of one ISA (defined in sign_cpu.cpp).
struct SignVectorBodies;

// Encodes a tensor fed in consecutive blocks of f32 elements: writes the scale of each bucket
// (f32, little-endian, bucket order) to `scales` and bit (x < 0) of element i at bit i % 8 of
// bits[i / 8], the unused high bits of the last byte zero. The ISA is fixed at construction.
// The scales may be those of steps 1-2 of sign_math.h only: a bucket whose sum overflowed may
// have +inf until sign_rescue_overflowed_scales() below gives it step 3's scale (the encoder
// no longer holds the elements of earlier blocks).
//
//   SignEncoder encoder(bucket, scales, bits);
//   encoder.add(x, 4096); encoder.add(x + 4096, 100);   // every block but the last: count % 8 == 0
//   encoder.finish();                                    // writes the last, shorter bucket's scale
class SignEncoder {
 public:
  // bucket >= 1. `scales` holds ceil(n / bucket) * 4 bytes and `bits` ceil(n / 8) bytes for
  // the n elements that will be added.
  SignEncoder(std::size_t bucket, std::byte* scales, std::uint8_t* bits) noexcept;

  // The next `count` elements. Precondition: every call but the last has count % 8 == 0 (the
  // bits of each block start on a byte boundary).
  void add(const float* x, std::size_t count) noexcept;

  // Writes the scale of a bucket left incomplete by the elements added (the last, shorter one).
  void finish() noexcept;

  // Whether some scale written so far is +inf: then sign_rescue_overflowed_scales() has work
  // (checked as the scales are computed: a separate pass over them cost a third of the
  // encode's time with buckets of 1).
  bool any_scale_overflowed() const noexcept { return any_scale_overflowed_; }

 private:
  void add_to_buckets(const float* x, std::size_t count) noexcept;
  void finish_bucket() noexcept;

  const SignVectorBodies* bodies_;
  std::size_t bucket_;
  std::byte* scales_;
  std::uint8_t* bits_;
  std::size_t elements_added_ = 0;
  std::size_t position_in_bucket_ = 0;  // elements of the current bucket summed so far
  std::size_t bucket_index_ = 0;
  float lanes_[kSignLanes] = {};  // step 1 of the canonical sum of the current bucket
  bool any_scale_overflowed_ = false;
};

// Step 3 of sign_math.h for the ceil(count / bucket) scales a SignEncoder wrote: each +inf
// scale becomes sign_rescued_scale() of its bucket (still +inf when the bucket holds an inf).
// Worth calling only when the encoder's any_scale_overflowed().
// `bucket_elements(begin, len)` returns elements [begin, begin + len) as f32, valid until its
// next call; it is called only for buckets that overflowed, which is rare.
template <class BucketElements>
void sign_rescue_overflowed_scales(std::size_t count, std::size_t bucket, std::byte* scales,
                                   BucketElements&& bucket_elements) {
  const std::size_t buckets = count == 0 ? 0 : (count - 1) / bucket + 1;
  for (std::size_t b = 0; b < buckets; ++b) {
    float scale;
    std::memcpy(&scale, scales + b * sizeof(float), sizeof scale);
    if (!sign_scale_overflowed(scale)) continue;
    const std::size_t begin = b * bucket;
    const std::size_t len = count - begin < bucket ? count - begin : bucket;
    const float* elements = bucket_elements(begin, len);
    scale = sign_rescued_scale(elements, len);
    std::memcpy(scales + b * sizeof(float), &scale, sizeof scale);
  }
}

// A validated sign payload: ceil(count / bucket) f32 scales, then ceil(count / 8) bytes of bits.
struct SignPayload {
  const std::byte* scales = nullptr;
  const std::uint8_t* bits = nullptr;
  std::size_t count = 0;
  std::size_t bucket = 1;
};

// out[k] = decoded value of element (begin + k), for k < n; begin + n <= payload.count.
void sign_decode(const SignPayload& payload, std::size_t begin, std::size_t n, float* out) noexcept;

// acc[i] += decoded value of element i, for i < payload.count (one f32 add per element).
void sign_decode_add(const SignPayload& payload, float* acc) noexcept;

// The loop bodies of the vector paths. The dispatch in sign_cpu.cpp handles unaligned heads
// and short tails with the scalar math and hands these only whole groups:
//   sign_pack_bits_64:  bit k % 8 of bits[k / 8] = sign_bit(x[k]) for k < count;
//                       count % 64 == 0; writes count / 8 bytes.
//   sign_accumulate_16: lanes[k % 16] += |x[k]| for k < count, in increasing k; count % 16 == 0.
//   sign_decode_16:     out[k] = sign_decoded(scale, bit k % 8 of bits[k / 8]) for k < count;
//                       count % 16 == 0.
//   sign_decode_add_16: acc[k] += the same value.
// and, for buckets shorter than the 16 lanes (1 <= bucket < 16), across buckets:
//   sign_short_scales_16:     the scales of `buckets` whole buckets starting at x (steps 1-2
//                             of sign_math.h), written to scales[0, 4 * buckets); buckets %
//                             16 == 0. Returns whether one of them is +inf.
//   sign_decode_short_16:     out[k] = sign_decoded(scale of bucket (first + k) / bucket,
//                             bit k % 8 of bits[k / 8]) for k < count; `scales` points at
//                             scale 0, `bits` at the byte holding element `first`'s bit, which
//                             is bit 0 (first % 8 == 0); count % 16 == 0.
//   sign_decode_add_short_16: acc[k] += the same value.
// `bits` and `scales` may sit at any alignment.
// sign_cpu_vector.h defines them for both from one template.
#define GZ_SIGN_VECTOR_DECLARATIONS                                                              \
  void sign_pack_bits_64(const float* x, std::size_t count, std::uint8_t* bits) noexcept;      \
  void sign_accumulate_16(const float* x, std::size_t count, float* lanes) noexcept;           \
  void sign_decode_16(float scale, const std::uint8_t* bits, std::size_t count,                 \
                      float* out) noexcept;                                                     \
  void sign_decode_add_16(float scale, const std::uint8_t* bits, std::size_t count,             \
                          float* acc) noexcept;                                                 \
  bool sign_short_scales_16(const float* x, std::size_t bucket, std::size_t buckets,            \
                            std::byte* scales) noexcept;                                        \
  void sign_decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,     \
                            const std::uint8_t* bits, std::size_t count, float* out) noexcept;  \
  void sign_decode_add_short_16(const std::byte* scales, std::size_t bucket, std::size_t first, \
                                const std::uint8_t* bits, std::size_t count, float* acc) noexcept;
namespace avx2 {
GZ_SIGN_VECTOR_DECLARATIONS
}  // namespace avx2
namespace avx512 {
GZ_SIGN_VECTOR_DECLARATIONS
}  // namespace avx512
#undef GZ_SIGN_VECTOR_DECLARATIONS

}  // namespace gradzip::kernels::cpu
