// AVX2 + F16C paths of the host dtype conversions (contracts in cast_cpu_simd.h).
//
// Finite values beyond the 16-bit format's range are first clamped to its largest finite value
// (saturate_finite), so the results saturate exactly as cast_math.h does.
// f16: vcvtps2ph with imm 0 rounds to nearest even whatever MXCSR says and ignores FTZ;
// f32 denormals are far below binary16's range, so DAZ cannot change a result either.
// vcvtph2ps is exact and quiets NaNs as cast_math.h does. bf16 uses integer ops only, the
// formula of f32_to_bf16_bits(). Tails shorter than one vector run cast_math.h directly.
//
// This file is compiled with -mavx2 -mf16c: it includes no header that defines out-of-line
// inline functions, so nothing compiled here can be picked by the linker for a scalar caller.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cast_math.h"
#include "kernels/cpu/cast_cpu_simd.h"

namespace gradzip::kernels::cpu::avx2 {
namespace {

// vcvtps2ph immediate: round to nearest even, independent of MXCSR.RC.
constexpr int kRoundNearestEven = _MM_FROUND_TO_NEAREST_INT;

// Store policy of a loop: cached (any alignment) or streaming (32-byte aligned).
template <bool kStreaming>
struct Stores {
  static void put32(void* out, __m256i value) noexcept {
    if constexpr (kStreaming) {
      _mm256_stream_si256(static_cast<__m256i*>(out), value);
    } else {
      _mm256_storeu_si256(static_cast<__m256i*>(out), value);
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

inline std::uint16_t load16(const std::byte* in16, std::size_t i) noexcept {
  std::uint16_t bits;
  std::memcpy(&bits, in16 + 2 * i, sizeof bits);
  return bits;
}

inline void store16(std::byte* out16, std::size_t i, std::uint16_t bits) noexcept {
  std::memcpy(out16 + 2 * i, &bits, sizeof bits);
}

// cast_math.h's saturation, before the rounding: lanes whose magnitude is finite and above
// `above` get the magnitude `limit` (keeping their sign), so RNE cannot carry them to Inf.
// f16: above = limit = 0x477FE000 (65504); bf16: above = 0x7F7F7FFF, limit = 0x7F7F0000.
inline __m256i saturate_finite(__m256i bits, int above, int limit) noexcept {
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  // Signed compares are right: magnitudes are below 2^31.
  const __m256i beyond = _mm256_and_si256(
      _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(above)),
      _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), magnitude));
  const __m256i limited = _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(INT32_MIN)),
                                          _mm256_set1_epi32(limit));
  return _mm256_blendv_epi8(bits, limited, beyond);
}

// 8 f32 bit patterns -> their bf16 bits in the low half of each 32-bit lane (high half 0):
// NaN -> (bits | quiet bit) >> 16, else (bits + 0x7FFF + lsb) >> 16 (f32_to_bf16_bits).
inline __m256i bf16_bits_of(__m256i bits) noexcept {
  bits = saturate_finite(bits, 0x7F7F7FFF, 0x7F7F0000);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  // Signed compare is right: both sides are below 2^31.
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256i quieted = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quieted, is_nan), 16);
}

// Two vectors of bf16_bits_of() -> 16 bf16 values in element order.
inline __m256i pack_bf16(__m256i low8, __m256i high8) noexcept {
  // packus works per 128-bit lane (values <= 0xFFFF, so no saturation): lanes come out as
  // low[0..3], high[0..3], low[4..7], high[4..7]; the permute restores element order.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(low8, high8), 0xD8);
}

inline __m256i bf16x8_of(const float* in) noexcept {
  return bf16_bits_of(_mm256_castps_si256(_mm256_loadu_ps(in)));
}

inline __m128i f16x8_of(const float* in) noexcept {
  const __m256i bits = saturate_finite(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)),
                                       0x477FE000, 0x477FE000);
  return _mm256_cvtps_ph(_mm256_castsi256_ps(bits), kRoundNearestEven);
}

inline __m128i load16x8(const std::byte* in16) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(in16));
}

inline void store16x8(std::byte* out16, __m128i values) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out16), values);
}

// Lambdas rather than function pointers, so each instantiation inlines its widening.
constexpr auto kWidenF16 = [](__m128i halves) noexcept { return _mm256_cvtph_ps(halves); };
constexpr auto kWidenBf16 = [](__m128i bf16) noexcept {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16), 16));
};

// Widening shared by f16 and bf16: `widen8` turns 8 packed 16-bit values into 8 floats;
// `scalar_widen` is the matching cast_math.h function for the tail.
template <typename Widen8, typename ScalarWiden>
void widen(const std::byte* in16, float* out, std::size_t count, StreamRange stream, Widen8 widen8,
           ScalarWiden scalar_widen) noexcept {
  split_by_store_kind(count, stream, [&](auto stores, std::size_t i, std::size_t end) {
    for (; i + 32 <= end; i += 32) {
      const __m256 f0 = widen8(load16x8(in16 + 2 * i));
      const __m256 f1 = widen8(load16x8(in16 + 2 * i + 16));
      const __m256 f2 = widen8(load16x8(in16 + 2 * i + 32));
      const __m256 f3 = widen8(load16x8(in16 + 2 * i + 48));
      stores.put32(out + i, _mm256_castps_si256(f0));
      stores.put32(out + i + 8, _mm256_castps_si256(f1));
      stores.put32(out + i + 16, _mm256_castps_si256(f2));
      stores.put32(out + i + 24, _mm256_castps_si256(f3));
    }
    for (; i + 8 <= end; i += 8) _mm256_storeu_ps(out + i, widen8(load16x8(in16 + 2 * i)));
    for (; i < end; ++i) out[i] = scalar_widen(load16(in16, i));
  });
}

// acc += widened, shared by f16 and bf16 (cached stores: acc is read anyway).
template <typename Widen8, typename ScalarWiden>
void widen_add(const std::byte* in16, float* acc, std::size_t count, Widen8 widen8,
               ScalarWiden scalar_widen) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256 f0 = widen8(load16x8(in16 + 2 * i));
    const __m256 f1 = widen8(load16x8(in16 + 2 * i + 16));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), f0));
    _mm256_storeu_ps(acc + i + 8, _mm256_add_ps(_mm256_loadu_ps(acc + i + 8), f1));
  }
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(acc + i,
                     _mm256_add_ps(_mm256_loadu_ps(acc + i), widen8(load16x8(in16 + 2 * i))));
  }
  for (; i < count; ++i) acc[i] += scalar_widen(load16(in16, i));
}

constexpr auto kScalarWidenF16 = [](std::uint16_t bits) noexcept { return f16_bits_to_f32(bits); };
constexpr auto kScalarWidenBf16 = [](std::uint16_t bits) noexcept {
  return bf16_bits_to_f32(bits);
};

}  // namespace

void f32_to_f16_bytes(const float* in, std::byte* out16, std::size_t count,
                      StreamRange stream) noexcept {
  split_by_store_kind(count, stream, [&](auto stores, std::size_t i, std::size_t end) {
    for (; i + 32 <= end; i += 32) {
      const __m128i h0 = f16x8_of(in + i);
      const __m128i h1 = f16x8_of(in + i + 8);
      const __m128i h2 = f16x8_of(in + i + 16);
      const __m128i h3 = f16x8_of(in + i + 24);
      stores.put32(out16 + 2 * i, _mm256_set_m128i(h1, h0));
      stores.put32(out16 + 2 * i + 32, _mm256_set_m128i(h3, h2));
    }
    for (; i + 8 <= end; i += 8) store16x8(out16 + 2 * i, f16x8_of(in + i));
    for (; i < end; ++i) store16(out16, i, f32_to_f16_bits(in[i]));
  });
}

void f32_to_bf16_bytes(const float* in, std::byte* out16, std::size_t count,
                       StreamRange stream) noexcept {
  split_by_store_kind(count, stream, [&](auto stores, std::size_t i, std::size_t end) {
    for (; i + 32 <= end; i += 32) {
      const __m256i b0 = bf16x8_of(in + i);
      const __m256i b1 = bf16x8_of(in + i + 8);
      const __m256i b2 = bf16x8_of(in + i + 16);
      const __m256i b3 = bf16x8_of(in + i + 24);
      stores.put32(out16 + 2 * i, pack_bf16(b0, b1));
      stores.put32(out16 + 2 * i + 32, pack_bf16(b2, b3));
    }
    for (; i + 8 <= end; i += 8) {
      const __m256i b = bf16x8_of(in + i);
      store16x8(out16 + 2 * i, _mm256_castsi256_si128(pack_bf16(b, b)));
    }
    for (; i < end; ++i) store16(out16, i, f32_to_bf16_bits(in[i]));
  });
}

void f16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count,
                      StreamRange stream) noexcept {
  widen(in16, out, count, stream, kWidenF16, kScalarWidenF16);
}

void bf16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count,
                       StreamRange stream) noexcept {
  widen(in16, out, count, stream, kWidenBf16, kScalarWidenBf16);
}

void add_f16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  widen_add(in16, acc, count, kWidenF16, kScalarWidenF16);
}

void add_bf16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  widen_add(in16, acc, count, kWidenBf16, kScalarWidenBf16);
}

}  // namespace gradzip::kernels::cpu::avx2
