// AVX-512 qsgd kernels (F/BW/VL/DQ): 16 elements per step, tails with masked loads and
// stores. Each computes exactly what compressors/qsgd/qsgd_math.h and the scalar loops in qsgd_cpu.cpp
// compute; the comments name the scalar expression a line reproduces.
//
// Only static always-inline helpers and the functions in the table: no inline function with
// external linkage is instantiated here, so no AVX-512 copy of one can be picked by the linker
// for code that runs on other CPUs.

// GCC 12's AVX-512 headers initialise _mm512_undefined_*() from themselves (`__m512i __Y = __Y;`),
// which -W(maybe-)uninitialized reports where the intrinsics are inlined, i.e. all over this
// file (GCC bug 105593, fixed in GCC 13). The warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include "kernels/cpu/philox_avx512.h"
#include "compressors/qsgd/qsgd_cpu.h"

namespace gradzip::kernels::cpu::avx512 {
namespace {

#define GZ_KERNEL_INLINE static inline __attribute__((always_inline))

GZ_KERNEL_INLINE __mmask16 first_lanes16(std::size_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);  // n < 16
}

std::uint32_t abs_max_bits(const float* x, std::size_t n) noexcept {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), magnitude));
    m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), magnitude));
    m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), magnitude));
  }
  for (; i + 16 <= n; i += 16) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), magnitude));
  }
  if (i < n) {
    const __m512i tail = _mm512_maskz_loadu_epi32(first_lanes16(n - i), x + i);  // zeros beyond
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(tail, magnitude));
  }
  const __m512i all = _mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3));
  return _mm512_reduce_max_epu32(all);
}

void philox_words(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                  std::uint64_t first_block, std::size_t num_blocks, std::uint32_t* out) noexcept {
  philox_words_x16(seed, step, tensor_id, first_block, num_blocks, out);
}

// Per-bucket constants of quantize16, broadcast once per call.
struct EncodeVectors {
  __m512i magnitude_mask, sign_bit;
  __m512 prescale, inv, offset, top, unit;
};

GZ_KERNEL_INLINE EncodeVectors encode_vectors(const QsgdEncodeBucket& bucket) {
  return EncodeVectors{_mm512_set1_epi32(static_cast<int>(bucket.magnitude_mask)),
                       _mm512_set1_epi32(static_cast<int>(bucket.sign_bit)),
                       _mm512_set1_ps(bucket.prescale),
                       _mm512_set1_ps(bucket.inv),
                       _mm512_set1_ps(bucket.offset),
                       _mm512_set1_ps(bucket.top),
                       _mm512_set1_ps(1.0f / 16777216.0f)};
}

// qsgd_encode_code() of 16 elements of a finite bucket, one code per 32-bit lane.
// kSign: bits == 1 (quantise x, add the offset, no sign bit); kPrescale: prescale != 1
// (multiplying by 1 is exact, so skipping it gives the same bits).
template <bool kSign, bool kPrescale>
GZ_KERNEL_INLINE __m512i quantize16(__m512i x, __m512i word, const EncodeVectors& c) {
  // y = magnitude * prescale * inv + offset
  __m512 y = kSign ? _mm512_castsi512_ps(x) : _mm512_castsi512_ps(_mm512_and_si512(x, c.magnitude_mask));
  if constexpr (kPrescale) y = _mm512_mul_ps(y, c.prescale);
  y = _mm512_mul_ps(y, c.inv);
  if constexpr (kSign) y = _mm512_add_ps(y, c.offset);  // offset is +0 for bits >= 2: y + 0 == y
  // v = y + uniform_unit(word)
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(word, 8)), c.unit);
  const __m512 v = _mm512_add_ps(y, u);
  // qsgd_level(v) = trunc(min(v, top)): in a finite bucket v is never NaN and v > -1
  // (bits >= 2: y, u >= 0; bits == 1: y >= -2^-24), so truncation toward 0 is the clamped floor.
  const __m512i q = _mm512_cvttps_epi32(_mm512_min_ps(v, c.top));
  if constexpr (kSign) return q;
  // negative && q != 0 ? q | sign_bit : q
  const __mmask16 negative_nonzero = _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(x), q, q);
  return _mm512_mask_or_epi32(q, negative_nonzero, q, c.sign_bit);
}

template <bool kSign, bool kPrescale>
void quantize_as(const float* x, const std::uint32_t* words, std::size_t n, const EncodeVectors& c,
                 std::uint8_t* codes) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i code = quantize16<kSign, kPrescale>(_mm512_loadu_si512(x + i), _mm512_loadu_si512(words + i), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
  }
  if (i < n) {
    const __mmask16 lanes = first_lanes16(n - i);
    const __m512i code = quantize16<kSign, kPrescale>(_mm512_maskz_loadu_epi32(lanes, x + i),
                                                      _mm512_maskz_loadu_epi32(lanes, words + i), c);
    _mm512_mask_cvtepi32_storeu_epi8(codes + i, lanes, code);
  }
}

void quantize(const float* x, const std::uint32_t* words, std::size_t n,
              const QsgdEncodeBucket& bucket, std::uint8_t* codes) noexcept {
  const EncodeVectors c = encode_vectors(bucket);
  const bool stochastic_sign = bucket.sign_bit == 0;  // bits == 1
  const bool prescale = bucket.prescale != 1.0f;
  if (stochastic_sign) {
    prescale ? quantize_as<true, true>(x, words, n, c, codes) : quantize_as<true, false>(x, words, n, c, codes);
  } else {
    prescale ? quantize_as<false, true>(x, words, n, c, codes) : quantize_as<false, false>(x, words, n, c, codes);
  }
}

// Codes i..n-1 by the scalar loop; i is a multiple of 8, so they start on a byte.
void pack_tail(const std::uint8_t* codes, std::size_t i, std::size_t n, int bits, std::byte* out) {
  scalar::kQsgdKernels.pack_codes(codes + i, n - i, bits, out + i / 8 * static_cast<std::size_t>(bits));
}

void unpack_tail(const std::byte* in, std::size_t i, std::size_t n, int bits, std::uint8_t* codes) {
  scalar::kQsgdKernels.unpack_codes(in + i / 8 * static_cast<std::size_t>(bits), n - i, bits, codes + i);
}

void pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::byte* out) noexcept {
  std::size_t i = 0;
  switch (bits) {
    case 8:
      std::memcpy(out, codes, n);
      return;
    case 4:  // 64 codes -> 32 bytes: byte j = code 2j | code (2j + 1) << 4
      for (; i + 64 <= n; i += 64) {
        const __m512i pairs = _mm512_loadu_si512(codes + i);  // u16 lane = c_even | c_odd << 8
        const __m512i merged = _mm512_or_si512(pairs, _mm512_srli_epi16(pairs, 4));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i / 2), _mm512_cvtepi16_epi8(merged));
      }
      break;
    case 2:  // 64 codes -> 16 bytes: byte j = c0 | c1 << 2 | c2 << 4 | c3 << 6 of codes 4j..4j+3
      for (; i + 64 <= n; i += 64) {
        const __m512i quads = _mm512_loadu_si512(codes + i);  // u32 lane = c0 | c1<<8 | c2<<16 | c3<<24
        const __m512i halves = _mm512_or_si512(quads, _mm512_srli_epi32(quads, 6));
        const __m512i merged = _mm512_or_si512(halves, _mm512_srli_epi32(halves, 12));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 4), _mm512_cvtepi32_epi8(merged));
      }
      break;
    case 1:  // 64 codes -> 8 bytes: bit i of the stream = code i
      for (; i + 64 <= n; i += 64) {
        const __m512i ones = _mm512_loadu_si512(codes + i);
        const std::uint64_t mask = _mm512_test_epi8_mask(ones, ones);
        std::memcpy(out + i / 8, &mask, sizeof mask);
      }
      break;
    default:
      break;
  }
  if (i < n) pack_tail(codes, i, n, bits, out);
}

void unpack_codes(const std::byte* in, std::size_t n, int bits, std::uint8_t* codes) noexcept {
  std::size_t i = 0;
  switch (bits) {
    case 8:
      std::memcpy(codes, in, n);
      return;
    case 4:  // 32 bytes -> 64 codes
      for (; i + 64 <= n; i += 64) {
        const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i / 2)));
        const __m512i codes16 = _mm512_or_si512(
            _mm512_and_si512(bytes, _mm512_set1_epi16(0x000F)),
            _mm512_and_si512(_mm512_slli_epi16(bytes, 4), _mm512_set1_epi16(0x0F00)));
        _mm512_storeu_si512(codes + i, codes16);
      }
      break;
    case 2:  // 16 bytes -> 64 codes
      for (; i + 64 <= n; i += 64) {
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i / 4)));
        const __m512i low = _mm512_or_si512(
            _mm512_and_si512(bytes, _mm512_set1_epi32(0x3)),
            _mm512_and_si512(_mm512_slli_epi32(bytes, 6), _mm512_set1_epi32(0x300)));
        const __m512i high = _mm512_or_si512(
            _mm512_and_si512(_mm512_slli_epi32(bytes, 12), _mm512_set1_epi32(0x30000)),
            _mm512_and_si512(_mm512_slli_epi32(bytes, 18), _mm512_set1_epi32(0x3000000)));
        _mm512_storeu_si512(codes + i, _mm512_or_si512(low, high));
      }
      break;
    case 1:  // 8 bytes -> 64 codes
      for (; i + 64 <= n; i += 64) {
        std::uint64_t mask;
        std::memcpy(&mask, in + i / 8, sizeof mask);
        _mm512_storeu_si512(codes + i, _mm512_maskz_mov_epi8(mask, _mm512_set1_epi8(1)));
      }
      break;
    default:
      break;
  }
  if (i < n) unpack_tail(in, i, n, bits, codes);
}

// Per-bucket constants of dequantize16.
struct DecodeVectors {
  __m512 step, scale, negative_scale;
  __m512i top_level, sign_mask;
  __m128i sign_shift;  // moves the code's sign bit to bit 31
};

GZ_KERNEL_INLINE DecodeVectors decode_vectors(const QsgdDecodeBucket& bucket) {
  return DecodeVectors{_mm512_set1_ps(bucket.step),
                       _mm512_set1_ps(bucket.scale),
                       _mm512_set1_ps(bucket.negative_scale),
                       _mm512_set1_epi32(static_cast<int>(bucket.top_level)),
                       _mm512_set1_epi32(static_cast<int>(0x80000000u)),
                       _mm_cvtsi32_si128(31 - bucket.sign_shift)};
}

// qsgd_decode_code() of 16 codes (one per 32-bit lane) of a finite bucket; kSign: bits == 1.
template <bool kSign>
GZ_KERNEL_INLINE __m512 dequantize16(__m512i code, const DecodeVectors& c) {
  if constexpr (kSign) {
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(code, code), c.negative_scale, c.scale);
  }
  // min(q * step, scale) with the sign bit of the code
  const __m512 product = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(code, c.top_level)), c.step);
  const __m512 magnitude = _mm512_min_ps(product, c.scale);
  const __m512i sign = _mm512_and_si512(_mm512_sll_epi32(code, c.sign_shift), c.sign_mask);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), sign));
}

GZ_KERNEL_INLINE __m512i load_codes16(const std::uint8_t* codes) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
}

GZ_KERNEL_INLINE __m512i load_codes_partial(const std::uint8_t* codes, __mmask16 lanes) {
  return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, codes));
}

template <bool kSign>
void dequantize_as(const std::uint8_t* codes, std::size_t n, const DecodeVectors& c, float* out) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, dequantize16<kSign>(load_codes16(codes + i), c));
  if (i < n) {
    const __mmask16 lanes = first_lanes16(n - i);
    _mm512_mask_storeu_ps(out + i, lanes, dequantize16<kSign>(load_codes_partial(codes + i, lanes), c));
  }
}

template <bool kSign>
void dequantize_add_as(const std::uint8_t* codes, std::size_t n, const DecodeVectors& c, float* acc) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 sum = _mm512_add_ps(_mm512_loadu_ps(acc + i), dequantize16<kSign>(load_codes16(codes + i), c));
    _mm512_storeu_ps(acc + i, sum);
  }
  if (i < n) {
    const __mmask16 lanes = first_lanes16(n - i);
    const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, acc + i),
                                     dequantize16<kSign>(load_codes_partial(codes + i, lanes), c));
    _mm512_mask_storeu_ps(acc + i, lanes, sum);
  }
}

void dequantize(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket, int bits,
                float* out) noexcept {
  const DecodeVectors c = decode_vectors(bucket);
  if (bits == 1) {
    dequantize_as<true>(codes, n, c, out);
  } else {
    dequantize_as<false>(codes, n, c, out);
  }
}

void dequantize_add(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket,
                    int bits, float* acc) noexcept {
  const DecodeVectors c = decode_vectors(bucket);
  if (bits == 1) {
    dequantize_add_as<true>(codes, n, c, acc);
  } else {
    dequantize_add_as<false>(codes, n, c, acc);
  }
}

#undef GZ_KERNEL_INLINE

}  // namespace

const QsgdKernels kQsgdKernels{abs_max_bits, philox_words,   quantize,      pack_codes,
                               unpack_codes, dequantize,     dequantize_add};

}  // namespace gradzip::kernels::cpu::avx512
