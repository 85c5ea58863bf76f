// AVX-512 loop bodies of the `sign` kernels (contracts in kernels/cpu/sign_cpu.h). A 16-lane
// vector holds exactly the 16 lanes of the canonical bucket sum, and a compare into a mask
// register gives 16 sign bits at once, in element order.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/sign_cpu.h"

namespace gradzip::kernels::cpu::avx512 {
namespace {

// Bit l = (x[l] < 0), ordered: NaN and -0.0 give 0, as sign_bit() does.
std::uint64_t negative_mask(const float* x) noexcept {
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(x), _mm512_setzero_ps(), _CMP_LT_OQ);
}

// Lane l = `negative` where bit l of bits[0, 2) is set, else `positive` (sign_decoded()).
__m512 decoded_16(__m512 positive, __m512 negative, const std::uint8_t* bits) noexcept {
  std::uint16_t mask;
  std::memcpy(&mask, bits, sizeof mask);
  return _mm512_mask_blend_ps(mask, positive, negative);
}

// _mm512_i32gather_ps, written as the full-mask form: GCC 12's unmasked one starts from an
// undefined vector and trips -Wmaybe-uninitialized (GCC bug 105593).
__m512 gather(__m512i indices, const void* base) noexcept {
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, indices, base, 4);
}

__m512 negated(__m512 value) noexcept {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(value), _mm512_set1_epi32(INT32_MIN)));
}

template <bool kAdd>
void store(float* out, __m512 value) noexcept {
  if constexpr (kAdd) value = _mm512_add_ps(_mm512_loadu_ps(out), value);
  _mm512_storeu_ps(out, value);
}

template <bool kAdd>
void decode_16(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  const __m512 positive = _mm512_set1_ps(scale);
  const __m512 negative = negated(positive);
  for (std::size_t k = 0; k < count; k += 16) {
    store<kAdd>(out + k, decoded_16(positive, negative, bits + k / 8));
  }
}

// Buckets of 1..15 elements: a group of 16 consecutive elements spans several buckets. Lane l
// of a group whose first element sits at position r of bucket b belongs to bucket
// b + (r + l) / bucket; the next group starts at position (r + 16) % bucket of bucket
// b + (r + 16) / bucket. Tabulated per r, so the loop needs no division.
template <bool kAdd>
void decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                     const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  __m512i bucket_of_lane[kSignLanes];
  std::size_t buckets_to_next_group[kSignLanes];
  std::size_t position_of_next_group[kSignLanes];
  for (std::size_t r = 0; r < bucket; ++r) {
    alignas(64) std::int32_t lanes[kSignLanes];
    for (std::size_t l = 0; l < kSignLanes; ++l)
      lanes[l] = static_cast<std::int32_t>((r + l) / bucket);
    bucket_of_lane[r] = _mm512_load_si512(lanes);
    buckets_to_next_group[r] = (r + kSignLanes) / bucket;
    position_of_next_group[r] = (r + kSignLanes) % bucket;
  }
  std::size_t bucket_index = first / bucket;
  std::size_t position = first % bucket;
  for (std::size_t k = 0; k < count; k += 16) {
    // Reads only the scales of this group's buckets, all of which hold elements < count.
    const __m512 positive = gather(bucket_of_lane[position], scales + bucket_index * sizeof(float));
    store<kAdd>(out + k, decoded_16(positive, negated(positive), bits + k / 8));
    bucket_index += buckets_to_next_group[position];
    position = position_of_next_group[position];
  }
}

}  // namespace

void sign_pack_bits_64(const float* x, std::size_t count, std::uint8_t* bits) noexcept {
  for (std::size_t k = 0; k < count; k += 64) {
    const std::uint64_t word = negative_mask(x + k) | negative_mask(x + k + 16) << 16 |
                               negative_mask(x + k + 32) << 32 | negative_mask(x + k + 48) << 48;
    std::memcpy(bits + k / 8, &word, sizeof word);
  }
}

void sign_accumulate_16(const float* x, std::size_t count, float* lanes) noexcept {
  __m512 sums = _mm512_loadu_ps(lanes);
  for (std::size_t k = 0; k < count; k += 16) {
    sums = _mm512_add_ps(sums, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  }
  _mm512_storeu_ps(lanes, sums);
}

void sign_decode_16(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  decode_16<false>(scale, bits, count, out);
}

void sign_decode_add_16(float scale, const std::uint8_t* bits, std::size_t count,
                        float* acc) noexcept {
  decode_16<true>(scale, bits, count, acc);
}

// Bucket b + l of the group in lane l: lanes[j] of the canonical sum holds just element j
// (0 + |x_j| = |x_j|), then the tree and division of sign_combine_lanes() /
// sign_scale_from_sum(), lane-wise.
bool sign_short_scales_16(const float* x, std::size_t bucket, std::size_t buckets,
                          std::byte* scales) noexcept {
  const __m512i bucket_starts =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(bucket)));
  const __m512 length = _mm512_set1_ps(static_cast<float>(bucket));
  const __m512 canonical_nan =
      _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kSignCanonicalNanBits)));
  const __m512 infinity = _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000));
  __mmask16 overflowed = 0;
  for (std::size_t b = 0; b < buckets; b += 16) {
    const float* group = x + b * bucket;
    __m512 lanes[kSignLanes];
    for (std::size_t j = 0; j < bucket; ++j) {
      lanes[j] = _mm512_abs_ps(gather(bucket_starts, group + j));
    }
    // The tree of sign_combine_lanes(), adding only lanes that hold elements (`filled` of them):
    // the others hold +0.0 there, and adding +0.0 to a lane sum (>= +0.0, or a NaN, which
    // ends canonical) changes nothing.
    for (std::size_t width = kSignLanes / 2, filled = bucket; width >= 1; width /= 2) {
      for (std::size_t l = 0; l + width < filled; ++l) {
        lanes[l] = _mm512_add_ps(lanes[l], lanes[l + width]);
      }
      filled = filled < width ? filled : width;
    }
    const __m512 scale = _mm512_div_ps(lanes[0], length);
    const __mmask16 nan = _mm512_cmp_ps_mask(scale, scale, _CMP_UNORD_Q);
    _mm512_storeu_ps(scales + b * sizeof(float), _mm512_mask_blend_ps(nan, scale, canonical_nan));
    overflowed |= _mm512_cmp_ps_mask(scale, infinity, _CMP_EQ_OQ);
  }
  return overflowed != 0;
}

void sign_decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                          const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  decode_short_16<false>(scales, bucket, first, bits, count, out);
}

void sign_decode_add_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                              const std::uint8_t* bits, std::size_t count, float* acc) noexcept {
  decode_short_16<true>(scales, bucket, first, bits, count, acc);
}

}  // namespace gradzip::kernels::cpu::avx512
