// AVX2 loop bodies of the `sign` kernels (contracts in kernels/cpu/sign_cpu.h). Two 8-lane
// vectors hold the 16 lanes of the canonical bucket sum (lanes 0-7 and 8-15);
// _mm256_movemask_ps of an ordered compare gives 8 sign bits in element order.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/sign_cpu.h"

namespace gradzip::kernels::cpu::avx2 {
namespace {

// Bit l = (x[l] < 0), ordered: NaN and -0.0 give 0, as sign_bit() does.
std::uint64_t negative_mask(const float* x) noexcept {
  const __m256 negative = _mm256_cmp_ps(_mm256_loadu_ps(x), _mm256_setzero_ps(), _CMP_LT_OQ);
  return static_cast<std::uint32_t>(_mm256_movemask_ps(negative));
}

// |x[l]|: the sign bits cleared (sign_abs()).
__m256 abs_8(const float* x) noexcept {
  return _mm256_and_ps(_mm256_loadu_ps(x), _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MAX)));
}

// Lane l = `positive` with its sign bit flipped where bit l of `byte` is set (sign_decoded()):
// shifting bit l left by 31 - l puts it on the sign bit.
__m256 decoded_8(__m256 positive, std::uint8_t byte) noexcept {
  const __m256i to_sign_bit = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
  const __m256i flips = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(byte), to_sign_bit),
                                         _mm256_set1_epi32(INT32_MIN));
  return _mm256_xor_ps(positive, _mm256_castsi256_ps(flips));
}

template <bool kAdd>
void store(float* out, __m256 value) noexcept {
  if constexpr (kAdd) value = _mm256_add_ps(_mm256_loadu_ps(out), value);
  _mm256_storeu_ps(out, value);
}

template <bool kAdd>
void decode_16(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  const __m256 positive = _mm256_set1_ps(scale);
  for (std::size_t k = 0; k < count; k += 8) store<kAdd>(out + k, decoded_8(positive, bits[k / 8]));
}

// Buckets of 1..15 elements: a group of 8 consecutive elements spans several buckets. Lane l
// of a group whose first element sits at position r of bucket b belongs to bucket
// b + (r + l) / bucket; the next group starts at position (r + 8) % bucket of bucket
// b + (r + 8) / bucket. Tabulated per r, so the loop needs no division.
template <bool kAdd>
void decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                     const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  constexpr std::size_t kGroup = 8;
  __m256i bucket_of_lane[kSignLanes];
  std::size_t buckets_to_next_group[kSignLanes];
  std::size_t position_of_next_group[kSignLanes];
  for (std::size_t r = 0; r < bucket; ++r) {
    alignas(32) std::int32_t lanes[kGroup];
    for (std::size_t l = 0; l < kGroup; ++l) lanes[l] = static_cast<std::int32_t>((r + l) / bucket);
    bucket_of_lane[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    buckets_to_next_group[r] = (r + kGroup) / bucket;
    position_of_next_group[r] = (r + kGroup) % bucket;
  }
  std::size_t bucket_index = first / bucket;
  std::size_t position = first % bucket;
  for (std::size_t k = 0; k < count; k += kGroup) {
    // Reads only the scales of this group's buckets, all of which hold elements < count.
    const auto* group_scales =
        reinterpret_cast<const float*>(scales + bucket_index * sizeof(float));
    const __m256 positive = _mm256_i32gather_ps(group_scales, bucket_of_lane[position], 4);
    store<kAdd>(out + k, decoded_8(positive, bits[k / 8]));
    bucket_index += buckets_to_next_group[position];
    position = position_of_next_group[position];
  }
}

}  // namespace

void sign_pack_bits_64(const float* x, std::size_t count, std::uint8_t* bits) noexcept {
  for (std::size_t k = 0; k < count; k += 64) {
    std::uint64_t word = 0;
    for (int group = 0; group < 8; ++group) word |= negative_mask(x + k + 8 * group) << (8 * group);
    std::memcpy(bits + k / 8, &word, sizeof word);
  }
}

void sign_accumulate_16(const float* x, std::size_t count, float* lanes) noexcept {
  __m256 low = _mm256_loadu_ps(lanes);
  __m256 high = _mm256_loadu_ps(lanes + 8);
  for (std::size_t k = 0; k < count; k += 16) {
    low = _mm256_add_ps(low, abs_8(x + k));
    high = _mm256_add_ps(high, abs_8(x + k + 8));
  }
  _mm256_storeu_ps(lanes, low);
  _mm256_storeu_ps(lanes + 8, high);
}

void sign_decode_16(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  decode_16<false>(scale, bits, count, out);
}

void sign_decode_add_16(float scale, const std::uint8_t* bits, std::size_t count,
                        float* acc) noexcept {
  decode_16<true>(scale, bits, count, acc);
}

// Bucket b + l of the group in lane l (8 buckets per vector): lanes[j] of the canonical sum
// holds just element j (0 + |x_j| = |x_j|), then the tree and division of
// sign_combine_lanes() / sign_scale_from_sum(), lane-wise.
bool sign_short_scales_16(const float* x, std::size_t bucket, std::size_t buckets,
                          std::byte* scales) noexcept {
  const __m256i bucket_starts = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                   _mm256_set1_epi32(static_cast<int>(bucket)));
  const __m256 length = _mm256_set1_ps(static_cast<float>(bucket));
  const __m256 canonical_nan =
      _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kSignCanonicalNanBits)));
  const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MAX));
  const __m256 infinity = _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000));
  __m256 overflowed = _mm256_setzero_ps();
  for (std::size_t b = 0; b < buckets; b += 8) {
    const float* group = x + b * bucket;
    __m256 lanes[kSignLanes];
    for (std::size_t j = 0; j < bucket; ++j) {
      lanes[j] = _mm256_and_ps(_mm256_i32gather_ps(group + j, bucket_starts, 4), magnitude_bits);
    }
    // The tree of sign_combine_lanes(), adding only lanes that hold elements (`filled` of them):
    // the others hold +0.0 there, and adding +0.0 to a lane sum (>= +0.0, or a NaN, which
    // ends canonical) changes nothing.
    for (std::size_t width = kSignLanes / 2, filled = bucket; width >= 1; width /= 2) {
      for (std::size_t l = 0; l + width < filled; ++l) {
        lanes[l] = _mm256_add_ps(lanes[l], lanes[l + width]);
      }
      filled = filled < width ? filled : width;
    }
    const __m256 scale = _mm256_div_ps(lanes[0], length);
    const __m256 nan = _mm256_cmp_ps(scale, scale, _CMP_UNORD_Q);
    _mm256_storeu_ps(reinterpret_cast<float*>(scales + b * sizeof(float)),
                     _mm256_blendv_ps(scale, canonical_nan, nan));
    overflowed = _mm256_or_ps(overflowed, _mm256_cmp_ps(scale, infinity, _CMP_EQ_OQ));
  }
  return _mm256_movemask_ps(overflowed) != 0;
}

void sign_decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                          const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  decode_short_16<false>(scales, bucket, first, bits, count, out);
}

void sign_decode_add_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                              const std::uint8_t* bits, std::size_t count, float* acc) noexcept {
  decode_short_16<true>(scales, bucket, first, bits, count, acc);
}

}  // namespace gradzip::kernels::cpu::avx2
