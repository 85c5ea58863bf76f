// AVX-512 (F/BW/VL) + F16C paths of the host dtype conversions (contracts in cast_cpu_simd.h).
//
// Finite values beyond the 16-bit format's range are first clamped to its largest finite value
// (saturate_finite), so the results saturate exactly as cast_math.h does.
// f16: vcvtps2ph with imm 0 rounds to nearest even whatever MXCSR says and ignores FTZ;
// f32 denormals are far below binary16's range, so DAZ cannot change a result either.
// vcvtph2ps is exact and quiets NaNs as cast_math.h does. bf16 uses integer ops only, the
// formula of f32_to_bf16_bits(); AVX512_BF16's vcvtneps2bf16 is NOT used: it flushes f32
// denormals to zero, which IEEE round-to-nearest-even does not. Tails run masked.
//
// This file is compiled with -mavx512*: it includes no header that defines out-of-line inline
// functions, so nothing compiled here can be picked by the linker for a scalar caller.

// GCC 12's AVX-512 intrinsics fill "don't care" operands from _mm512_undefined_*() (`__Y = __Y`),
// which -Wmaybe-uninitialized reports at every use; the warning is wrong, silence it for them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cast_cpu_simd.h"

namespace gradzip::kernels::cpu::avx512 {
namespace {

// vcvtps2ph immediate: round to nearest even, independent of MXCSR.RC.
constexpr int kRoundNearestEven = _MM_FROUND_TO_NEAREST_INT;

// Store policy of a loop: cached (any alignment) or streaming (64-byte aligned).
template <bool kStreaming>
struct Stores {
  static void put64(void* out, __m512i value) noexcept {
    if constexpr (kStreaming) {
      _mm512_stream_si512(static_cast<__m512i*>(out), value);
    } else {
      _mm512_storeu_si512(out, value);
    }
  }
};

// Runs convert(Stores<false>, begin, end) / convert(Stores<true>, ...) over the cached head,
// the streamed body and the cached rest of [0, count).
template <typename Convert>
void split_by_store_kind(std::size_t count, StreamRange stream, Convert convert) noexcept {
  if (stream.end == stream.begin) {
    convert(Stores<false>{}, 0, count);
    return;
  }
  convert(Stores<false>{}, 0, stream.begin);
  convert(Stores<true>{}, stream.begin, stream.end);
  _mm_sfence();  // streaming stores are weakly ordered: publish them before returning
  convert(Stores<false>{}, stream.end, count);
}

// Mask of the first `count` (<= 16) lanes.
inline __mmask16 first_lanes(std::size_t count) noexcept {
  return static_cast<__mmask16>((1u << count) - 1u);
}

// cast_math.h's saturation, before the rounding: lanes whose magnitude is finite and above
// `above` get the magnitude `limit` (keeping their sign), so RNE cannot carry them to Inf.
// f16: above = limit = 0x477FE000 (65504); bf16: above = 0x7F7F7FFF, limit = 0x7F7F0000.
inline __m512i saturate_finite(__m512i bits, int above, int limit) noexcept {
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 beyond = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(above)) &
                           _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_ternarylogic_epi32(bits, beyond, _mm512_set1_epi32(INT32_MIN),
                                        _mm512_set1_epi32(limit), 0xEA);
}

inline __m512 saturate_f16_range(__m512 values) noexcept {
  return _mm512_castsi512_ps(saturate_finite(_mm512_castps_si512(values), 0x477FE000, 0x477FE000));
}

// 16 f32 bit patterns -> their bf16 bits in the HIGH half of each 32-bit lane:
// NaN -> bits | quiet bit, else bits + 0x7FFF + lsb (f32_to_bf16_bits() before its >> 16).
inline __m512i bf16_bits_high(__m512i bits) noexcept {
  bits = saturate_finite(bits, 0x7F7F7FFF, 0x7F7F0000);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  return _mm512_mask_or_epi32(rounded, is_nan, bits, _mm512_set1_epi32(0x00400000));
}

// The high 16-bit halves of 2 x 16 lanes, in element order: word 2j+1 of (low16:high16).
inline __m512i odd_words(__m512i low16, __m512i high16) noexcept {
  alignas(64) static constexpr std::uint16_t kOddWordIndex[32] = {
      1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
      33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(low16, _mm512_load_si512(kOddWordIndex), high16);
}

// 16 bf16_bits_high() lanes -> 16 bf16 values.
inline __m256i narrow_high_words(__m512i lanes) noexcept {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(lanes, 16));
}

inline __m512i join(__m256i low, __m256i high) noexcept {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

inline __m256i f16x16_of(const float* in) noexcept {
  return _mm512_cvtps_ph(saturate_f16_range(_mm512_loadu_ps(in)), kRoundNearestEven);
}

inline __m512 bf16_to_f32x16(__m256i bf16) noexcept {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

inline __m256i load16x16(const std::byte* in16) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in16));
}

inline void store16x16(std::byte* out16, __m256i values) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16), values);
}

// Widening shared by f16 and bf16: `widen16` turns 16 packed 16-bit values into 16 floats.
template <typename Widen16>
void widen(const std::byte* in16, float* out, std::size_t count, StreamRange stream,
           Widen16 widen16) noexcept {
  split_by_store_kind(count, stream, [&](auto stores, std::size_t i, std::size_t end) {
    for (; i + 64 <= end; i += 64) {
      const __m512 f0 = widen16(load16x16(in16 + 2 * i));
      const __m512 f1 = widen16(load16x16(in16 + 2 * i + 32));
      const __m512 f2 = widen16(load16x16(in16 + 2 * i + 64));
      const __m512 f3 = widen16(load16x16(in16 + 2 * i + 96));
      stores.put64(out + i, _mm512_castps_si512(f0));
      stores.put64(out + i + 16, _mm512_castps_si512(f1));
      stores.put64(out + i + 32, _mm512_castps_si512(f2));
      stores.put64(out + i + 48, _mm512_castps_si512(f3));
    }
    for (; i + 16 <= end; i += 16) _mm512_storeu_ps(out + i, widen16(load16x16(in16 + 2 * i)));
    if (i < end) {
      const __mmask16 lanes = first_lanes(end - i);
      _mm512_mask_storeu_ps(out + i, lanes, widen16(_mm256_maskz_loadu_epi16(lanes, in16 + 2 * i)));
    }
  });
}

// acc += widened, shared by f16 and bf16 (cached stores: acc is read anyway).
template <typename Widen16>
void widen_add(const std::byte* in16, float* acc, std::size_t count, Widen16 widen16) noexcept {
  std::size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m512 f0 = widen16(load16x16(in16 + 2 * i));
    const __m512 f1 = widen16(load16x16(in16 + 2 * i + 32));
    _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), f0));
    _mm512_storeu_ps(acc + i + 16, _mm512_add_ps(_mm512_loadu_ps(acc + i + 16), f1));
  }
  for (; i < count; i += 16) {
    const __mmask16 lanes = first_lanes(count - i < 16 ? count - i : 16);
    const __m512 f = widen16(_mm256_maskz_loadu_epi16(lanes, in16 + 2 * i));
    _mm512_mask_storeu_ps(acc + i, lanes, _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, acc + i), f));
  }
}

// Lambdas rather than function pointers, so each instantiation inlines its widening.
constexpr auto kWidenF16 = [](__m256i halves) noexcept { return _mm512_cvtph_ps(halves); };
constexpr auto kWidenBf16 = [](__m256i bf16) noexcept { return bf16_to_f32x16(bf16); };

}  // namespace

void f32_to_f16_bytes(const float* in, std::byte* out16, std::size_t count,
                      StreamRange stream) noexcept {
  split_by_store_kind(count, stream, [&](auto stores, std::size_t i, std::size_t end) {
    for (; i + 64 <= end; i += 64) {
      const __m256i h0 = f16x16_of(in + i);
      const __m256i h1 = f16x16_of(in + i + 16);
      const __m256i h2 = f16x16_of(in + i + 32);
      const __m256i h3 = f16x16_of(in + i + 48);
      stores.put64(out16 + 2 * i, join(h0, h1));
      stores.put64(out16 + 2 * i + 64, join(h2, h3));
    }
    for (; i + 16 <= end; i += 16) store16x16(out16 + 2 * i, f16x16_of(in + i));
    if (i < end) {
      const __mmask16 lanes = first_lanes(end - i);
      const __m256i h = _mm512_cvtps_ph(saturate_f16_range(_mm512_maskz_loadu_ps(lanes, in + i)),
                                          kRoundNearestEven);
      _mm256_mask_storeu_epi16(out16 + 2 * i, lanes, h);
    }
  });
}

void f32_to_bf16_bytes(const float* in, std::byte* out16, std::size_t count,
                       StreamRange stream) noexcept {
  split_by_store_kind(count, stream, [&](auto stores, std::size_t i, std::size_t end) {
    for (; i + 64 <= end; i += 64) {
      const __m512i b0 = bf16_bits_high(_mm512_loadu_si512(in + i));
      const __m512i b1 = bf16_bits_high(_mm512_loadu_si512(in + i + 16));
      const __m512i b2 = bf16_bits_high(_mm512_loadu_si512(in + i + 32));
      const __m512i b3 = bf16_bits_high(_mm512_loadu_si512(in + i + 48));
      stores.put64(out16 + 2 * i, odd_words(b0, b1));
      stores.put64(out16 + 2 * i + 64, odd_words(b2, b3));
    }
    for (; i + 16 <= end; i += 16) {
      store16x16(out16 + 2 * i, narrow_high_words(bf16_bits_high(_mm512_loadu_si512(in + i))));
    }
    if (i < end) {
      const __mmask16 lanes = first_lanes(end - i);
      const __m512i b = bf16_bits_high(_mm512_castps_si512(_mm512_maskz_loadu_ps(lanes, in + i)));
      _mm256_mask_storeu_epi16(out16 + 2 * i, lanes, narrow_high_words(b));
    }
  });
}

void f16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count,
                      StreamRange stream) noexcept {
  widen(in16, out, count, stream, kWidenF16);
}

void bf16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count,
                       StreamRange stream) noexcept {
  widen(in16, out, count, stream, kWidenBf16);
}

void add_f16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  widen_add(in16, acc, count, kWidenF16);
}

void add_bf16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  widen_add(in16, acc, count, kWidenBf16);
}

}  // namespace gradzip::kernels::cpu::avx512
