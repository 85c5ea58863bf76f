// AVX-512 vector traits of the `qsgd` kernels (F/BW/VL/DQ; compressors/qsgd/qsgd_cpu_vector.h
// has the loops, qsgd_cpu.h the contracts): 16 lanes; partial vectors with masked loads and
// stores. Truncating down-converts store the low bytes of lanes, and byte compares into a
// 64-bit mask register (and back) pack and unpack 1-bit codes.

// GCC 12's AVX-512 headers initialise _mm512_undefined_*() from themselves (`__m512i __Y = __Y;`),
// which -W(maybe-)uninitialized reports where the intrinsics are inlined, i.e. all over this
// file and the loops it instantiates (GCC bug 105593, fixed in GCC 13). The warning is about
// the header, not this code.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "compressors/qsgd/qsgd_cpu_vector.h"
#include "kernels/cpu/philox_avx512.h"

namespace gradzip::kernels::cpu::avx512 {
namespace {

struct Avx512Vectors {
  using F = __m512;
  using I = __m512i;
  using Count = __m128i;
  using Bits = std::uint64_t;
  using Lanes = __mmask16;
  static constexpr std::size_t kLanes = 16;
  static constexpr bool kMaskedTails = true;

  GZ_KERNEL_INLINE I load(const void* p) noexcept { return _mm512_loadu_si512(p); }
  GZ_KERNEL_INLINE void store(void* p, I v) noexcept { _mm512_storeu_si512(p, v); }
  GZ_KERNEL_INLINE F load_floats(const float* p) noexcept { return _mm512_loadu_ps(p); }
  GZ_KERNEL_INLINE void store_floats(float* p, F v) noexcept { _mm512_storeu_ps(p, v); }
  GZ_KERNEL_INLINE I zero() noexcept { return _mm512_setzero_si512(); }
  GZ_KERNEL_INLINE I set1(std::uint32_t v) noexcept {
    return _mm512_set1_epi32(static_cast<int>(v));
  }
  GZ_KERNEL_INLINE I set1_16(std::uint16_t v) noexcept {
    return _mm512_set1_epi16(static_cast<short>(v));
  }
  GZ_KERNEL_INLINE F set1_float(float v) noexcept { return _mm512_set1_ps(v); }
  GZ_KERNEL_INLINE I bit_and(I a, I b) noexcept { return _mm512_and_si512(a, b); }
  GZ_KERNEL_INLINE I bit_or(I a, I b) noexcept { return _mm512_or_si512(a, b); }
  template <int k>
  GZ_KERNEL_INLINE I shift_right_32(I v) noexcept { return _mm512_srli_epi32(v, k); }
  template <int k>
  GZ_KERNEL_INLINE I shift_left_32(I v) noexcept { return _mm512_slli_epi32(v, k); }
  template <int k>
  GZ_KERNEL_INLINE I shift_right_16(I v) noexcept { return _mm512_srli_epi16(v, k); }
  template <int k>
  GZ_KERNEL_INLINE I shift_left_16(I v) noexcept { return _mm512_slli_epi16(v, k); }
  GZ_KERNEL_INLINE Count shift_count(int count) noexcept { return _mm_cvtsi32_si128(count); }
  GZ_KERNEL_INLINE I shift_left_32(I v, Count count) noexcept { return _mm512_sll_epi32(v, count); }
  GZ_KERNEL_INLINE I max_u32(I a, I b) noexcept { return _mm512_max_epu32(a, b); }
  GZ_KERNEL_INLINE std::uint32_t max_of_lanes(I v) noexcept { return _mm512_reduce_max_epu32(v); }
  GZ_KERNEL_INLINE F as_floats(I v) noexcept { return _mm512_castsi512_ps(v); }
  GZ_KERNEL_INLINE I as_ints(F v) noexcept { return _mm512_castps_si512(v); }
  GZ_KERNEL_INLINE F to_floats(I v) noexcept { return _mm512_cvtepi32_ps(v); }
  GZ_KERNEL_INLINE I truncated(F v) noexcept { return _mm512_cvttps_epi32(v); }
  GZ_KERNEL_INLINE F add(F a, F b) noexcept { return _mm512_add_ps(a, b); }
  GZ_KERNEL_INLINE F mul(F a, F b) noexcept { return _mm512_mul_ps(a, b); }
  GZ_KERNEL_INLINE F min(F a, F b) noexcept { return _mm512_min_ps(a, b); }
  // The negative lanes (bit 31 of x) in which q is not 0 get the sign bit.
  GZ_KERNEL_INLINE I signed_codes(I q, I x, I sign_bit) noexcept {
    const __mmask16 negative_nonzero = _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(x), q, q);
    return _mm512_mask_or_epi32(q, negative_nonzero, q, sign_bit);
  }
  GZ_KERNEL_INLINE F nonzero_select(I code, F if_nonzero, F if_zero) noexcept {
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(code, code), if_zero, if_nonzero);
  }
  GZ_KERNEL_INLINE I bytes_to_lanes(const void* p) noexcept {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  GZ_KERNEL_INLINE I bytes_to_halves(const void* p) noexcept {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  GZ_KERNEL_INLINE void store_lane_bytes(void* p, I v) noexcept {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
  }
  GZ_KERNEL_INLINE void store_half_bytes(void* p, I v) noexcept {
    _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi16_epi8(v));
  }
  GZ_KERNEL_INLINE Bits nonzero_bits(const void* p) noexcept {
    const __m512i bytes = load(p);
    return _mm512_test_epi8_mask(bytes, bytes);
  }
  GZ_KERNEL_INLINE I bytes_of_bits(const void* p) noexcept {
    std::uint64_t mask;
    std::memcpy(&mask, p, sizeof mask);
    return _mm512_maskz_mov_epi8(mask, _mm512_set1_epi8(1));
  }
  GZ_KERNEL_INLINE void philox_words(std::uint64_t seed, std::uint32_t step,
                                     std::uint32_t tensor_id, std::uint64_t first_block,
                                     std::size_t num_blocks, std::uint32_t* out) noexcept {
    philox_words_x16(seed, step, tensor_id, first_block, num_blocks, out);
  }

  GZ_KERNEL_INLINE Lanes first_lanes(std::size_t n) noexcept {
    return static_cast<__mmask16>((1u << n) - 1u);  // n < 16
  }
  GZ_KERNEL_INLINE I load_first(Lanes lanes, const void* p) noexcept {
    return _mm512_maskz_loadu_epi32(lanes, p);
  }
  GZ_KERNEL_INLINE F load_floats_first(Lanes lanes, const float* p) noexcept {
    return _mm512_maskz_loadu_ps(lanes, p);
  }
  GZ_KERNEL_INLINE I bytes_to_lanes_first(Lanes lanes, const void* p) noexcept {
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, p));
  }
  GZ_KERNEL_INLINE void store_floats_first(Lanes lanes, float* p, F v) noexcept {
    _mm512_mask_storeu_ps(p, lanes, v);
  }
  GZ_KERNEL_INLINE void store_lane_bytes_first(Lanes lanes, void* p, I v) noexcept {
    _mm512_mask_cvtepi32_storeu_epi8(p, lanes, v);
  }
};

}  // namespace

GZ_QSGD_VECTOR_ENTRY_POINTS(Avx512Vectors)

}  // namespace gradzip::kernels::cpu::avx512

#undef GZ_KERNEL_INLINE
