// AVX2 vector traits of the `sign` kernels (compressors/sign/sign_cpu_vector.h has the loops, sign_cpu.h
// the contracts). Two 8-lane vectors hold the 16 lanes of the canonical bucket sum; an ordered
// compare and _mm256_movemask_ps give 8 sign bits in element order; a lane is decoded by
// shifting its bit onto the sign bit of the positive scale.
#include <immintrin.h>

#include <cstdint>

#include "compressors/sign/sign_cpu_vector.h"

namespace gradzip::kernels::cpu::avx2 {
namespace {

struct Avx2Floats {
  using F = __m256;
  using I = __m256i;
  using Mask = __m256;  // a compare's result: all bits set in the lanes that hold
  static constexpr std::size_t kLanes = 8;

  static F load(const float* x) noexcept { return _mm256_loadu_ps(x); }
  static void store(float* out, F value) noexcept { _mm256_storeu_ps(out, value); }
  static F set1(float value) noexcept { return _mm256_set1_ps(value); }
  static F from_bits(std::uint32_t bits) noexcept {
    return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(bits)));
  }
  static F add(F a, F b) noexcept { return _mm256_add_ps(a, b); }
  static F div(F a, F b) noexcept { return _mm256_div_ps(a, b); }
  static F abs(F value) noexcept { return _mm256_and_ps(value, from_bits(INT32_MAX)); }
  static F negated(F value) noexcept { return _mm256_xor_ps(value, from_bits(0x80000000u)); }
  static std::uint64_t negative_bits(F value) noexcept {
    return static_cast<std::uint32_t>(
        _mm256_movemask_ps(_mm256_cmp_ps(value, _mm256_setzero_ps(), _CMP_LT_OQ)));
  }
  // Shifting bit l of the byte left by 31 - l puts it on lane l's sign bit; `negative` is
  // `positive` with every sign bit flipped, so flipping the chosen lanes gives the same bits.
  static F decoded(F positive, F, const std::uint8_t* bits) noexcept {
    const __m256i to_sign_bit = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
    const __m256i flips = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(*bits), to_sign_bit),
                                           _mm256_set1_epi32(INT32_MIN));
    return _mm256_xor_ps(positive, _mm256_castsi256_ps(flips));
  }
  static I lanes_of(const std::int32_t* lanes) noexcept {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  }
  static I lane_starts(std::int32_t step) noexcept {
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(step));
  }
  static F gather(I indices, const void* base) noexcept {
    return _mm256_i32gather_ps(static_cast<const float*>(base), indices, 4);
  }
  static Mask is_nan(F value) noexcept { return _mm256_cmp_ps(value, value, _CMP_UNORD_Q); }
  static Mask equals(F a, F b) noexcept { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static Mask no_lanes() noexcept { return _mm256_setzero_ps(); }
  static Mask either(Mask a, Mask b) noexcept { return _mm256_or_ps(a, b); }
  static bool any(Mask mask) noexcept { return _mm256_movemask_ps(mask) != 0; }
  static F blend(Mask mask, F if_clear, F if_set) noexcept {
    return _mm256_blendv_ps(if_clear, if_set, mask);
  }
};

}  // namespace

GZ_SIGN_VECTOR_ENTRY_POINTS(Avx2Floats)

}  // namespace gradzip::kernels::cpu::avx2
