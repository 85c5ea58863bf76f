// The vector loop bodies of the `sign` kernels (contracts in compressors/sign/sign_cpu.h), written
// once over a vector-traits type V and compiled once per instruction set: sign_cpu_avx2.cpp
// (8 lanes) and sign_cpu_avx512.cpp (16 lanes) each define their V in an unnamed namespace and
// expand GZ_SIGN_VECTOR_ENTRY_POINTS(V) inside kernels::cpu::<isa>. Include it only there: its
// code is built with that file's ISA flags (a template of a file-local V, so no definition is
// shared between the two).
//
// The canonical bucket sum has kSignLanes = 16 lanes, held in kSignLanes / V::kLanes vectors.
// V provides, as static noexcept functions:
//   F, I, Mask                          a float vector, an int32 vector, a lane mask
//   kLanes                              lanes per vector (8 or 16)
//   load(const float*) -> F, store(float*, F), set1(float) -> F, add(F, F), div(F, F)
//   from_bits(std::uint32_t) -> F       every lane these bits (a NaN's payload kept)
//   abs(F) -> F                         the sign bits cleared (sign_abs())
//   negated(F) -> F                     the sign bits flipped
//   negative_bits(F) -> std::uint64_t   bit l = (lane l < 0), ordered: NaN and -0.0 give 0
//   decoded(F positive, F negative, const std::uint8_t* bits) -> F
//                                       lane l = `negative` where bit l of bits[0, kLanes / 8)
//                                       is set, else `positive` (sign_decoded())
//   lanes_of(const std::int32_t* aligned to 64) -> I
//   lane_starts(std::int32_t step) -> I lane l = l * step
//   gather(I indices, const void* base) -> F   lane l = ((const float*) base)[indices[l]]
//   is_nan(F) -> Mask, equals(F, F) -> Mask, no_lanes() -> Mask, either(Mask, Mask) -> Mask,
//   any(Mask) -> bool, blend(Mask, F if_clear, F if_set) -> F
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "compressors/sign/sign_cpu.h"

namespace gradzip::kernels::cpu {

template <typename V>
struct SignVectorKernels {
  using F = typename V::F;
  static constexpr std::size_t kLanes = V::kLanes;
  static constexpr std::size_t kVectorsPerSum = kSignLanes / kLanes;

  static void pack_bits_64(const float* x, std::size_t count, std::uint8_t* bits) noexcept {
    for (std::size_t k = 0; k < count; k += 64) {
      std::uint64_t word = 0;
      for (std::size_t group = 0; group < 64 / kLanes; ++group)
        word |= V::negative_bits(V::load(x + k + group * kLanes)) << (group * kLanes);
      std::memcpy(bits + k / 8, &word, sizeof word);
    }
  }

  static void accumulate_16(const float* x, std::size_t count, float* lanes) noexcept {
    F sums[kVectorsPerSum];
    for (std::size_t v = 0; v < kVectorsPerSum; ++v) sums[v] = V::load(lanes + v * kLanes);
    for (std::size_t k = 0; k < count; k += kSignLanes)
      for (std::size_t v = 0; v < kVectorsPerSum; ++v)
        sums[v] = V::add(sums[v], V::abs(V::load(x + k + v * kLanes)));
    for (std::size_t v = 0; v < kVectorsPerSum; ++v) V::store(lanes + v * kLanes, sums[v]);
  }

  template <bool kAdd>
  static void store(float* out, F value) noexcept {
    if constexpr (kAdd) value = V::add(V::load(out), value);
    V::store(out, value);
  }

  template <bool kAdd>
  static void decode_16(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept {
    const F positive = V::set1(scale);
    const F negative = V::negated(positive);
    for (std::size_t k = 0; k < count; k += kLanes)
      store<kAdd>(out + k, V::decoded(positive, negative, bits + k / 8));
  }

  // Buckets of 1..15 elements: a group of kLanes consecutive elements spans several buckets.
  // Lane l of a group whose first element sits at position r of bucket b belongs to bucket
  // b + (r + l) / bucket; the next group starts at position (r + kLanes) % bucket of bucket
  // b + (r + kLanes) / bucket. Tabulated per r, so the loop needs no division.
  template <bool kAdd>
  static void decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                              const std::uint8_t* bits, std::size_t count, float* out) noexcept {
    typename V::I bucket_of_lane[kSignLanes];
    std::size_t buckets_to_next_group[kSignLanes];
    std::size_t position_of_next_group[kSignLanes];
    for (std::size_t r = 0; r < bucket; ++r) {
      alignas(64) std::int32_t lanes[kLanes];
      for (std::size_t l = 0; l < kLanes; ++l) lanes[l] = static_cast<std::int32_t>((r + l) / bucket);
      bucket_of_lane[r] = V::lanes_of(lanes);
      buckets_to_next_group[r] = (r + kLanes) / bucket;
      position_of_next_group[r] = (r + kLanes) % bucket;
    }
    std::size_t bucket_index = first / bucket;
    std::size_t position = first % bucket;
    for (std::size_t k = 0; k < count; k += kLanes) {
      // Reads only the scales of this group's buckets, all of which hold elements < count.
      const F positive = V::gather(bucket_of_lane[position], scales + bucket_index * sizeof(float));
      store<kAdd>(out + k, V::decoded(positive, V::negated(positive), bits + k / 8));
      bucket_index += buckets_to_next_group[position];
      position = position_of_next_group[position];
    }
  }

  // Bucket b + l of the group in lane l (kLanes buckets per vector): lanes[j] of the canonical
  // sum holds just element j (0 + |x_j| = |x_j|), then the tree and division of
  // sign_combine_lanes() / sign_scale_from_sum(), lane-wise.
  static bool short_scales_16(const float* x, std::size_t bucket, std::size_t buckets,
                              std::byte* scales) noexcept {
    const typename V::I bucket_starts = V::lane_starts(static_cast<std::int32_t>(bucket));
    const F length = V::set1(static_cast<float>(bucket));
    const F canonical_nan = V::from_bits(kSignCanonicalNanBits);
    const F infinity = V::from_bits(0x7F800000u);
    typename V::Mask overflowed = V::no_lanes();
    for (std::size_t b = 0; b < buckets; b += kLanes) {
      const float* group = x + b * bucket;
      F lanes[kSignLanes];
      for (std::size_t j = 0; j < bucket; ++j) lanes[j] = V::abs(V::gather(bucket_starts, group + j));
      // The tree of sign_combine_lanes(), adding only lanes that hold elements (`filled` of
      // them): the others hold +0.0 there, and adding +0.0 to a lane sum (>= +0.0, or a NaN,
      // which ends canonical) changes nothing.
      for (std::size_t width = kSignLanes / 2, filled = bucket; width >= 1; width /= 2) {
        for (std::size_t l = 0; l + width < filled; ++l) lanes[l] = V::add(lanes[l], lanes[l + width]);
        filled = filled < width ? filled : width;
      }
      const F scale = V::div(lanes[0], length);
      V::store(reinterpret_cast<float*>(scales + b * sizeof(float)),
               V::blend(V::is_nan(scale), scale, canonical_nan));
      overflowed = V::either(overflowed, V::equals(scale, infinity));
    }
    return V::any(overflowed);
  }
};

}  // namespace gradzip::kernels::cpu

// The kernels of sign_cpu.h's vector namespaces, defined from SignVectorKernels<V>; expanded
// inside namespace gradzip::kernels::cpu::<isa>.
#define GZ_SIGN_VECTOR_ENTRY_POINTS(V)                                                          \
  void sign_pack_bits_64(const float* x, std::size_t count, std::uint8_t* bits) noexcept {     \
    SignVectorKernels<V>::pack_bits_64(x, count, bits);                                         \
  }                                                                                             \
  void sign_accumulate_16(const float* x, std::size_t count, float* lanes) noexcept {          \
    SignVectorKernels<V>::accumulate_16(x, count, lanes);                                       \
  }                                                                                             \
  void sign_decode_16(float scale, const std::uint8_t* bits, std::size_t count,                \
                      float* out) noexcept {                                                    \
    SignVectorKernels<V>::decode_16<false>(scale, bits, count, out);                           \
  }                                                                                             \
  void sign_decode_add_16(float scale, const std::uint8_t* bits, std::size_t count,            \
                          float* acc) noexcept {                                                \
    SignVectorKernels<V>::decode_16<true>(scale, bits, count, acc);                            \
  }                                                                                             \
  bool sign_short_scales_16(const float* x, std::size_t bucket, std::size_t buckets,           \
                            std::byte* scales) noexcept {                                       \
    return SignVectorKernels<V>::short_scales_16(x, bucket, buckets, scales);                   \
  }                                                                                             \
  void sign_decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,    \
                            const std::uint8_t* bits, std::size_t count, float* out) noexcept { \
    SignVectorKernels<V>::decode_short_16<false>(scales, bucket, first, bits, count, out);      \
  }                                                                                             \
  void sign_decode_add_short_16(const std::byte* scales, std::size_t bucket, std::size_t first, \
                                const std::uint8_t* bits, std::size_t count,                    \
                                float* acc) noexcept {                                          \
    SignVectorKernels<V>::decode_short_16<true>(scales, bucket, first, bits, count, acc);       \
  }
