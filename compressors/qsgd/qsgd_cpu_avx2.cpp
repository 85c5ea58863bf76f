// AVX2 qsgd kernels: 8 elements per step; tails shorter than a vector go to the scalar
// kernels. Each computes exactly what compressors/qsgd/qsgd_math.h and the scalar loops in qsgd_cpu.cpp
// compute; the comments name the scalar expression a line reproduces.
//
// Only static always-inline helpers and the functions in the table: no inline function with
// external linkage is instantiated here, so no AVX2 copy of one can be picked by the linker for
// code that runs on other CPUs.
#include <immintrin.h>

#include "kernels/cpu/philox_avx2.h"
#include "compressors/qsgd/qsgd_cpu.h"

namespace gradzip::kernels::cpu::avx2 {
namespace {

#define GZ_KERNEL_INLINE static inline __attribute__((always_inline))

const QsgdKernels& scalar_kernels() { return scalar::kQsgdKernels; }

GZ_KERNEL_INLINE __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

GZ_KERNEL_INLINE void store256(void* p, __m256i v) {
  _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}

// Byte 0 of each 32-bit lane, in lane order, as the low 8 bytes of the result.
GZ_KERNEL_INLINE __m128i low_bytes_of_lanes(__m256i v) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i picked = _mm256_shuffle_epi8(v, pick);
  return _mm_unpacklo_epi32(_mm256_castsi256_si128(picked), _mm256_extracti128_si256(picked, 1));
}

std::uint32_t abs_max_bits(const float* x, std::size_t n) noexcept {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(load256(x + i), magnitude));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(load256(x + i + 8), magnitude));
    m2 = _mm256_max_epu32(m2, _mm256_and_si256(load256(x + i + 16), magnitude));
    m3 = _mm256_max_epu32(m3, _mm256_and_si256(load256(x + i + 24), magnitude));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_epu32(m0, _mm256_and_si256(load256(x + i), magnitude));
  const __m256i all = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
  __m128i folded = _mm_max_epu32(_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
  folded = _mm_max_epu32(folded, _mm_shuffle_epi32(folded, 0x4E));
  folded = _mm_max_epu32(folded, _mm_shuffle_epi32(folded, 0xB1));
  const std::uint32_t vector_max = static_cast<std::uint32_t>(_mm_cvtsi128_si32(folded));
  const std::uint32_t tail_max = scalar_kernels().abs_max_bits(x + i, n - i);
  return vector_max > tail_max ? vector_max : tail_max;
}

void philox_words(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                  std::uint64_t first_block, std::size_t num_blocks, std::uint32_t* out) noexcept {
  philox_words_x8(seed, step, tensor_id, first_block, num_blocks, out);
}

// Per-bucket constants of quantize8, broadcast once per call.
struct EncodeVectors {
  __m256i magnitude_mask, sign_bit, zero_int;
  __m256 prescale, inv, offset, top, unit;
};

GZ_KERNEL_INLINE EncodeVectors encode_vectors(const QsgdEncodeBucket& bucket) {
  return EncodeVectors{_mm256_set1_epi32(static_cast<int>(bucket.magnitude_mask)),
                       _mm256_set1_epi32(static_cast<int>(bucket.sign_bit)),
                       _mm256_setzero_si256(),
                       _mm256_set1_ps(bucket.prescale),
                       _mm256_set1_ps(bucket.inv),
                       _mm256_set1_ps(bucket.offset),
                       _mm256_set1_ps(bucket.top),
                       _mm256_set1_ps(1.0f / 16777216.0f)};
}

// qsgd_encode_code() of 8 elements of a finite bucket, one code per 32-bit lane.
// kSign: bits == 1 (quantise x, add the offset, no sign bit); kPrescale: prescale != 1
// (multiplying by 1 is exact, so skipping it gives the same bits).
template <bool kSign, bool kPrescale>
GZ_KERNEL_INLINE __m256i quantize8(__m256i x, __m256i word, const EncodeVectors& c) {
  // y = magnitude * prescale * inv + offset
  __m256 y = kSign ? _mm256_castsi256_ps(x) : _mm256_castsi256_ps(_mm256_and_si256(x, c.magnitude_mask));
  if constexpr (kPrescale) y = _mm256_mul_ps(y, c.prescale);
  y = _mm256_mul_ps(y, c.inv);
  if constexpr (kSign) y = _mm256_add_ps(y, c.offset);  // offset is +0 for bits >= 2: y + 0 == y
  // v = y + uniform_unit(word)
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(word, 8)), c.unit);
  const __m256 v = _mm256_add_ps(y, u);
  // qsgd_level(v) = trunc(min(v, top)): in a finite bucket v is never NaN and v > -1
  // (bits >= 2: y, u >= 0; bits == 1: y >= -2^-24), so truncation toward 0 is the clamped floor.
  const __m256i q = _mm256_cvttps_epi32(_mm256_min_ps(v, c.top));
  if constexpr (kSign) return q;
  // negative && q != 0 ? q | sign_bit : q
  const __m256i sign = _mm256_and_si256(_mm256_srai_epi32(x, 31), c.sign_bit);
  return _mm256_or_si256(q, _mm256_and_si256(sign, _mm256_cmpgt_epi32(q, c.zero_int)));
}

template <bool kSign, bool kPrescale>
std::size_t quantize_as(const float* x, const std::uint32_t* words, std::size_t n,
                        const EncodeVectors& c, std::uint8_t* codes) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i code = quantize8<kSign, kPrescale>(load256(x + i), load256(words + i), c);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), low_bytes_of_lanes(code));
  }
  return i;
}

void quantize(const float* x, const std::uint32_t* words, std::size_t n,
              const QsgdEncodeBucket& bucket, std::uint8_t* codes) noexcept {
  const EncodeVectors c = encode_vectors(bucket);
  const bool stochastic_sign = bucket.sign_bit == 0;  // bits == 1
  const bool prescale = bucket.prescale != 1.0f;
  std::size_t i;
  if (stochastic_sign) {
    i = prescale ? quantize_as<true, true>(x, words, n, c, codes) : quantize_as<true, false>(x, words, n, c, codes);
  } else {
    i = prescale ? quantize_as<false, true>(x, words, n, c, codes) : quantize_as<false, false>(x, words, n, c, codes);
  }
  if (i < n) scalar_kernels().quantize(x + i, words + i, n - i, bucket, codes + i);
}

void pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::byte* out) noexcept {
  std::size_t i = 0;
  switch (bits) {
    case 8:
      std::memcpy(out, codes, n);
      return;
    case 4:  // 32 codes -> 16 bytes: byte j = code 2j | code (2j + 1) << 4
      for (; i + 32 <= n; i += 32) {
        const __m256i pairs = load256(codes + i);  // u16 lane = c_even | c_odd << 8
        const __m256i merged = _mm256_and_si256(_mm256_or_si256(pairs, _mm256_srli_epi16(pairs, 4)),
                                                _mm256_set1_epi16(0x00FF));
        const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(merged),
                                               _mm256_extracti128_si256(merged, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2), bytes);
      }
      break;
    case 2:  // 32 codes -> 8 bytes: byte j = c0 | c1 << 2 | c2 << 4 | c3 << 6 of codes 4j..4j+3
      for (; i + 32 <= n; i += 32) {
        const __m256i quads = load256(codes + i);  // u32 lane = c0 | c1<<8 | c2<<16 | c3<<24
        const __m256i halves = _mm256_or_si256(quads, _mm256_srli_epi32(quads, 6));
        const __m256i merged = _mm256_or_si256(halves, _mm256_srli_epi32(halves, 12));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 4), low_bytes_of_lanes(merged));
      }
      break;
    case 1:  // 32 codes -> 4 bytes: bit i of the stream = code i
      for (; i + 32 <= n; i += 32) {
        const __m256i zero = _mm256_cmpeq_epi8(load256(codes + i), _mm256_setzero_si256());
        const std::uint32_t mask = ~static_cast<std::uint32_t>(_mm256_movemask_epi8(zero));
        std::memcpy(out + i / 8, &mask, sizeof mask);
      }
      break;
    default:
      break;
  }
  // The rest by the scalar loop; i is a multiple of 8, so it starts on a byte.
  if (i < n) scalar_kernels().pack_codes(codes + i, n - i, bits, out + i / 8 * static_cast<std::size_t>(bits));
}

void unpack_codes(const std::byte* in, std::size_t n, int bits, std::uint8_t* codes) noexcept {
  std::size_t i = 0;
  switch (bits) {
    case 8:
      std::memcpy(codes, in, n);
      return;
    case 4:  // 16 bytes -> 32 codes
      for (; i + 32 <= n; i += 32) {
        const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i / 2)));
        store256(codes + i, _mm256_or_si256(
                                _mm256_and_si256(bytes, _mm256_set1_epi16(0x000F)),
                                _mm256_and_si256(_mm256_slli_epi16(bytes, 4), _mm256_set1_epi16(0x0F00))));
      }
      break;
    case 2:  // 8 bytes -> 32 codes
      for (; i + 32 <= n; i += 32) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in + i / 4)));
        const __m256i low = _mm256_or_si256(
            _mm256_and_si256(bytes, _mm256_set1_epi32(0x3)),
            _mm256_and_si256(_mm256_slli_epi32(bytes, 6), _mm256_set1_epi32(0x300)));
        const __m256i high = _mm256_or_si256(
            _mm256_and_si256(_mm256_slli_epi32(bytes, 12), _mm256_set1_epi32(0x30000)),
            _mm256_and_si256(_mm256_slli_epi32(bytes, 18), _mm256_set1_epi32(0x3000000)));
        store256(codes + i, _mm256_or_si256(low, high));
      }
      break;
    case 1:  // 4 bytes -> 32 codes: byte k of the result tests bit k % 8 of stream byte k / 8
      for (; i + 32 <= n; i += 32) {
        std::uint32_t stream_bits;
        std::memcpy(&stream_bits, in + i / 8, sizeof stream_bits);
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(static_cast<int>(stream_bits)),
            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i selector = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, selector), selector);
        store256(codes + i, _mm256_and_si256(set, _mm256_set1_epi8(1)));
      }
      break;
    default:
      break;
  }
  if (i < n) scalar_kernels().unpack_codes(in + i / 8 * static_cast<std::size_t>(bits), n - i, bits, codes + i);
}

// Per-bucket constants of dequantize8.
struct DecodeVectors {
  __m256 step, scale, negative_scale;
  __m256i top_level, sign_mask, zero_int;
  __m128i sign_shift;  // moves the code's sign bit to bit 31
};

GZ_KERNEL_INLINE DecodeVectors decode_vectors(const QsgdDecodeBucket& bucket) {
  return DecodeVectors{_mm256_set1_ps(bucket.step),
                       _mm256_set1_ps(bucket.scale),
                       _mm256_set1_ps(bucket.negative_scale),
                       _mm256_set1_epi32(static_cast<int>(bucket.top_level)),
                       _mm256_set1_epi32(static_cast<int>(0x80000000u)),
                       _mm256_setzero_si256(),
                       _mm_cvtsi32_si128(31 - bucket.sign_shift)};
}

// qsgd_decode_code() of 8 codes of a finite bucket; kSign: bits == 1.
template <bool kSign>
GZ_KERNEL_INLINE __m256 dequantize8(const std::uint8_t* codes, const DecodeVectors& c) {
  const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  if constexpr (kSign) {
    // code != 0 ? scale : negative_scale
    const __m256 zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, c.zero_int));
    return _mm256_blendv_ps(c.scale, c.negative_scale, zero);
  }
  // min(q * step, scale) with the sign bit of the code
  const __m256 product = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(code, c.top_level)), c.step);
  const __m256 magnitude = _mm256_min_ps(product, c.scale);
  const __m256i sign = _mm256_and_si256(_mm256_sll_epi32(code, c.sign_shift), c.sign_mask);
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(magnitude), sign));
}

template <bool kSign>
std::size_t dequantize_as(const std::uint8_t* codes, std::size_t n, const DecodeVectors& c, float* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, dequantize8<kSign>(codes + i, c));
  return i;
}

template <bool kSign>
std::size_t dequantize_add_as(const std::uint8_t* codes, std::size_t n, const DecodeVectors& c,
                              float* acc) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), dequantize8<kSign>(codes + i, c)));
  }
  return i;
}

void dequantize(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket, int bits,
                float* out) noexcept {
  const DecodeVectors c = decode_vectors(bucket);
  const std::size_t i = bits == 1 ? dequantize_as<true>(codes, n, c, out)
                                  : dequantize_as<false>(codes, n, c, out);
  if (i < n) scalar_kernels().dequantize(codes + i, n - i, bucket, bits, out + i);
}

void dequantize_add(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket,
                    int bits, float* acc) noexcept {
  const DecodeVectors c = decode_vectors(bucket);
  const std::size_t i = bits == 1 ? dequantize_add_as<true>(codes, n, c, acc)
                                  : dequantize_add_as<false>(codes, n, c, acc);
  if (i < n) scalar_kernels().dequantize_add(codes + i, n - i, bucket, bits, acc + i);
}

#undef GZ_KERNEL_INLINE

}  // namespace

const QsgdKernels kQsgdKernels{abs_max_bits, philox_words, quantize,      pack_codes,
                               unpack_codes, dequantize,   dequantize_add};

}  // namespace gradzip::kernels::cpu::avx2
