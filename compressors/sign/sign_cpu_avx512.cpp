// AVX-512 vector traits of the `sign` kernels (compressors/sign/sign_cpu_vector.h has the loops,
// sign_cpu.h the contracts). A 16-lane vector holds exactly the 16 lanes of the canonical
// bucket sum, a compare into a mask register gives 16 sign bits at once, in element order, and
// those bits blend the positive and negative scale.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "compressors/sign/sign_cpu_vector.h"

namespace gradzip::kernels::cpu::avx512 {
namespace {

struct Avx512Floats {
  using F = __m512;
  using I = __m512i;
  using Mask = __mmask16;
  static constexpr std::size_t kLanes = 16;

  static F load(const float* x) noexcept { return _mm512_loadu_ps(x); }
  static void store(float* out, F value) noexcept { _mm512_storeu_ps(out, value); }
  static F set1(float value) noexcept { return _mm512_set1_ps(value); }
  static F from_bits(std::uint32_t bits) noexcept {
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(bits)));
  }
  static F add(F a, F b) noexcept { return _mm512_add_ps(a, b); }
  static F div(F a, F b) noexcept { return _mm512_div_ps(a, b); }
  static F abs(F value) noexcept { return _mm512_abs_ps(value); }
  static F negated(F value) noexcept {
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(value), _mm512_set1_epi32(INT32_MIN)));
  }
  static std::uint64_t negative_bits(F value) noexcept {
    return _mm512_cmp_ps_mask(value, _mm512_setzero_ps(), _CMP_LT_OQ);
  }
  static F decoded(F positive, F negative, const std::uint8_t* bits) noexcept {
    std::uint16_t mask;
    std::memcpy(&mask, bits, sizeof mask);
    return _mm512_mask_blend_ps(mask, positive, negative);
  }
  static I lanes_of(const std::int32_t* lanes) noexcept { return _mm512_load_si512(lanes); }
  static I lane_starts(std::int32_t step) noexcept {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32(step));
  }
  // The full-mask form of _mm512_i32gather_ps: GCC 12's unmasked one starts from an undefined
  // vector and trips -Wmaybe-uninitialized (GCC bug 105593).
  static F gather(I indices, const void* base) noexcept {
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF, indices, base, 4);
  }
  static Mask is_nan(F value) noexcept { return _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q); }
  static Mask equals(F a, F b) noexcept { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static Mask no_lanes() noexcept { return 0; }
  static Mask either(Mask a, Mask b) noexcept { return static_cast<Mask>(a | b); }
  static bool any(Mask mask) noexcept { return mask != 0; }
  static F blend(Mask mask, F if_clear, F if_set) noexcept {
    return _mm512_mask_blend_ps(mask, if_clear, if_set);
  }
};

}  // namespace

GZ_SIGN_VECTOR_ENTRY_POINTS(Avx512Floats)

}  // namespace gradzip::kernels::cpu::avx512
