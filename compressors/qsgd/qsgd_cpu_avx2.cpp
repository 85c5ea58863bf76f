// AVX2 vector traits of the `qsgd` kernels (compressors/qsgd/qsgd_cpu_vector.h has the loops,
// qsgd_cpu.h the contracts): 8 lanes; partial vectors go to the scalar kernels (AVX2 has no
// byte-masked loads and stores). A vector's low bytes are gathered by a byte shuffle within each
// 128-bit half, a compare and a movemask give the nonzero bytes, and a shuffle and compare
// spread stream bits back to bytes.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "compressors/qsgd/qsgd_cpu_vector.h"
#include "kernels/cpu/philox_avx2.h"

namespace gradzip::kernels::cpu::avx2 {
namespace {

struct Avx2Vectors {
  using F = __m256;
  using I = __m256i;
  using Count = __m128i;
  using Bits = std::uint32_t;
  static constexpr std::size_t kLanes = 8;
  static constexpr bool kMaskedTails = false;

  GZ_KERNEL_INLINE I load(const void* p) noexcept {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  }
  GZ_KERNEL_INLINE void store(void* p, I v) noexcept {
    _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  }
  GZ_KERNEL_INLINE F load_floats(const float* p) noexcept { return _mm256_loadu_ps(p); }
  GZ_KERNEL_INLINE void store_floats(float* p, F v) noexcept { _mm256_storeu_ps(p, v); }
  GZ_KERNEL_INLINE I zero() noexcept { return _mm256_setzero_si256(); }
  GZ_KERNEL_INLINE I set1(std::uint32_t v) noexcept {
    return _mm256_set1_epi32(static_cast<int>(v));
  }
  GZ_KERNEL_INLINE I set1_16(std::uint16_t v) noexcept {
    return _mm256_set1_epi16(static_cast<short>(v));
  }
  GZ_KERNEL_INLINE F set1_float(float v) noexcept { return _mm256_set1_ps(v); }
  GZ_KERNEL_INLINE I bit_and(I a, I b) noexcept { return _mm256_and_si256(a, b); }
  GZ_KERNEL_INLINE I bit_or(I a, I b) noexcept { return _mm256_or_si256(a, b); }
  template <int k>
  GZ_KERNEL_INLINE I shift_right_32(I v) noexcept { return _mm256_srli_epi32(v, k); }
  template <int k>
  GZ_KERNEL_INLINE I shift_left_32(I v) noexcept { return _mm256_slli_epi32(v, k); }
  template <int k>
  GZ_KERNEL_INLINE I shift_right_16(I v) noexcept { return _mm256_srli_epi16(v, k); }
  template <int k>
  GZ_KERNEL_INLINE I shift_left_16(I v) noexcept { return _mm256_slli_epi16(v, k); }
  GZ_KERNEL_INLINE Count shift_count(int count) noexcept { return _mm_cvtsi32_si128(count); }
  GZ_KERNEL_INLINE I shift_left_32(I v, Count count) noexcept { return _mm256_sll_epi32(v, count); }
  GZ_KERNEL_INLINE I max_u32(I a, I b) noexcept { return _mm256_max_epu32(a, b); }
  GZ_KERNEL_INLINE std::uint32_t max_of_lanes(I v) noexcept {
    __m128i folded = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    folded = _mm_max_epu32(folded, _mm_shuffle_epi32(folded, 0x4E));
    folded = _mm_max_epu32(folded, _mm_shuffle_epi32(folded, 0xB1));
    return static_cast<std::uint32_t>(_mm_cvtsi128_si32(folded));
  }
  GZ_KERNEL_INLINE F as_floats(I v) noexcept { return _mm256_castsi256_ps(v); }
  GZ_KERNEL_INLINE I as_ints(F v) noexcept { return _mm256_castps_si256(v); }
  GZ_KERNEL_INLINE F to_floats(I v) noexcept { return _mm256_cvtepi32_ps(v); }
  GZ_KERNEL_INLINE I truncated(F v) noexcept { return _mm256_cvttps_epi32(v); }
  GZ_KERNEL_INLINE F add(F a, F b) noexcept { return _mm256_add_ps(a, b); }
  GZ_KERNEL_INLINE F mul(F a, F b) noexcept { return _mm256_mul_ps(a, b); }
  GZ_KERNEL_INLINE F min(F a, F b) noexcept { return _mm256_min_ps(a, b); }
  // x >> 31 (arithmetic) is all ones in the negative lanes; q > 0 as signed is q != 0 for q < 2^31.
  GZ_KERNEL_INLINE I signed_codes(I q, I x, I sign_bit) noexcept {
    const I sign = _mm256_and_si256(_mm256_srai_epi32(x, 31), sign_bit);
    return _mm256_or_si256(q, _mm256_and_si256(sign, _mm256_cmpgt_epi32(q, zero())));
  }
  GZ_KERNEL_INLINE F nonzero_select(I code, F if_nonzero, F if_zero) noexcept {
    const F is_zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, zero()));
    return _mm256_blendv_ps(if_nonzero, if_zero, is_zero);
  }
  GZ_KERNEL_INLINE I bytes_to_lanes(const void* p) noexcept {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
  }
  GZ_KERNEL_INLINE I bytes_to_halves(const void* p) noexcept {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  // Byte 0 of each 32-bit lane, in lane order: picked within each 128-bit half, then the two
  // halves' 4 bytes joined.
  GZ_KERNEL_INLINE void store_lane_bytes(void* p, I v) noexcept {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1);
    const __m256i picked = _mm256_shuffle_epi8(v, pick);
    const __m128i bytes =
        _mm_unpacklo_epi32(_mm256_castsi256_si128(picked), _mm256_extracti128_si256(picked, 1));
    _mm_storel_epi64(static_cast<__m128i*>(p), bytes);
  }
  // The high bytes cleared, so the saturating pack keeps the low ones as they are.
  GZ_KERNEL_INLINE void store_half_bytes(void* p, I v) noexcept {
    const __m256i low = _mm256_and_si256(v, _mm256_set1_epi16(0x00FF));
    const __m128i bytes =
        _mm_packus_epi16(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
    _mm_storeu_si128(static_cast<__m128i*>(p), bytes);
  }
  GZ_KERNEL_INLINE Bits nonzero_bits(const void* p) noexcept {
    const __m256i is_zero = _mm256_cmpeq_epi8(load(p), _mm256_setzero_si256());
    return ~static_cast<std::uint32_t>(_mm256_movemask_epi8(is_zero));
  }
  // Byte k gets stream byte k / 8 (a shuffle), then tests its bit k % 8.
  GZ_KERNEL_INLINE I bytes_of_bits(const void* p) noexcept {
    std::uint32_t stream_bits;
    std::memcpy(&stream_bits, p, sizeof stream_bits);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(stream_bits)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i selector = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, selector), selector);
    return _mm256_and_si256(set, _mm256_set1_epi8(1));
  }
  GZ_KERNEL_INLINE void philox_words(std::uint64_t seed, std::uint32_t step,
                                     std::uint32_t tensor_id, std::uint64_t first_block,
                                     std::size_t num_blocks, std::uint32_t* out) noexcept {
    philox_words_x8(seed, step, tensor_id, first_block, num_blocks, out);
  }
};

}  // namespace

GZ_QSGD_VECTOR_ENTRY_POINTS(Avx2Vectors)

}  // namespace gradzip::kernels::cpu::avx2

#undef GZ_KERNEL_INLINE
