// The vector loops of the `qsgd` kernels (contracts in compressors/qsgd/qsgd_cpu.h, element math
// in compressors/qsgd/qsgd_math.h), written once over a vector-traits type V and compiled once
// per instruction set: qsgd_cpu_avx2.cpp (8 lanes) and qsgd_cpu_avx512.cpp (16 lanes) each
// define their V in an unnamed namespace and expand GZ_QSGD_VECTOR_ENTRY_POINTS(V) inside
// kernels::cpu::<isa>. Include it only there: its code is built with that file's ISA flags (a
// template of a file-local V, so no definition is shared between the two). Every function here
// is a member of that template, so no inline function with external linkage is instantiated
// from here and the linker never has a vector copy of one to pick for code that runs on other
// CPUs.
//
// Each loop computes exactly what the scalar kernels in qsgd_cpu.cpp compute; the comments name
// the scalar expression a line reproduces. Element loops take kLanes elements per step, one per
// 32-bit lane; the packing loops take 4 kLanes one-byte codes (one vector of bytes) per step.
// With V::kMaskedTails, the last partial vector of abs_max_bits, quantize and dequantize(_add)
// is done with masked loads and stores; without, those elements go to the scalar kernels, as do
// the packing loops' tails on every ISA.
//
// V provides, as static noexcept always-inline functions (GZ_KERNEL_INLINE):
//   F, I                         a vector of kLanes f32, of kLanes 32-bit integers
//   Count                        a shift count known at run time
//   Bits                         an unsigned integer of 4 kLanes bits
//   kLanes                       lanes per vector (8 or 16)
//   kMaskedTails                 whether partial vectors are done with the masked functions below
//   load(const void*) -> I, store(void*, I)      4 kLanes bytes, any alignment
//   load_floats(const float*) -> F, store_floats(float*, F)
//   zero() -> I, set1(std::uint32_t) -> I, set1_16(std::uint16_t) -> I (every 16-bit lane),
//   set1_float(float) -> F
//   bit_and(I, I) -> I, bit_or(I, I) -> I
//   shift_right_32<k>(I), shift_left_32<k>(I), shift_right_16<k>(I), shift_left_16<k>(I) -> I
//                                logical shifts of every 32-bit (16-bit) lane by the constant k
//   shift_count(int) -> Count, shift_left_32(I, Count) -> I   the same by a run-time count
//   max_u32(I, I) -> I, max_of_lanes(I) -> std::uint32_t      unsigned
//   as_floats(I) -> F, as_ints(F) -> I                         the same bits
//   to_floats(I) -> F            int32 -> f32, rounded to nearest
//   truncated(F) -> I            f32 -> int32, toward zero (callers keep lanes in range)
//   add(F, F), mul(F, F) -> F    rounded to nearest
//   min(F a, F b) -> F           lane = a < b ? a : b (the SSE/AVX min: b when either is NaN)
//   signed_codes(I q, I x, I sign_bit) -> I
//                                lane = q | sign_bit where bit 31 of x's lane is set and q's
//                                lane is not 0, else q (q's lanes in [0, 255])
//   nonzero_select(I code, F if_nonzero, F if_zero) -> F   lane = code != 0 ? if_nonzero : if_zero
//   bytes_to_lanes(const void*) -> I      lane l = byte l (kLanes bytes read), zero-extended
//   bytes_to_halves(const void*) -> I     16-bit lane l = byte l (2 kLanes bytes read)
//   store_lane_bytes(void*, I)            byte l = the low byte of lane l (kLanes bytes)
//   store_half_bytes(void*, I)            byte l = the low byte of 16-bit lane l (2 kLanes bytes)
//   nonzero_bits(const void*) -> Bits     bit k = (byte k != 0), k < 4 kLanes
//   bytes_of_bits(const void*) -> I       byte k = bit k of the 4 kLanes bits at the address
//                                         (LSB-first, as 0 or 1)
//   philox_words(...)                     as qsgd_cpu.h's philox_words()
// and, where kMaskedTails, for the first n < kLanes lanes (the others zero when loaded, not
// stored; no byte outside them read or written):
//   Lanes, first_lanes(std::size_t n) -> Lanes
//   load_first(Lanes, const void*) -> I, load_floats_first(Lanes, const float*) -> F,
//   bytes_to_lanes_first(Lanes, const void*) -> I, store_floats_first(Lanes, float*, F),
//   store_lane_bytes_first(Lanes, void*, I)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "compressors/qsgd/qsgd_cpu.h"

// Forced inline: each kernel of the table compiles to one function with no call in its loops.
// For V's functions too; the ISA file #undefs it after its last use.
#define GZ_KERNEL_INLINE static inline __attribute__((always_inline))

namespace gradzip::kernels::cpu {

template <typename V>
struct QsgdVectorKernels {
  using F = typename V::F;
  using I = typename V::I;
  static constexpr std::size_t kLanes = V::kLanes;
  static constexpr std::size_t kCodesPerStep = 4 * kLanes;  // one vector of one-byte codes

  // max of qsgd_abs_bits(x[i]) (the bits, sign cleared, compared unsigned) in four accumulators.
  static std::uint32_t abs_max_bits(const float* x, std::size_t n) noexcept {
    const I magnitude = V::set1(0x7FFFFFFFu);
    I m0 = V::zero(), m1 = m0, m2 = m0, m3 = m0;
    std::size_t i = 0;
    for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
      m0 = V::max_u32(m0, V::bit_and(V::load(x + i), magnitude));
      m1 = V::max_u32(m1, V::bit_and(V::load(x + i + kLanes), magnitude));
      m2 = V::max_u32(m2, V::bit_and(V::load(x + i + 2 * kLanes), magnitude));
      m3 = V::max_u32(m3, V::bit_and(V::load(x + i + 3 * kLanes), magnitude));
    }
    for (; i + kLanes <= n; i += kLanes) m0 = V::max_u32(m0, V::bit_and(V::load(x + i), magnitude));
    if constexpr (V::kMaskedTails) {
      if (i < n) {
        const I tail = V::load_first(V::first_lanes(n - i), x + i);  // zeros beyond
        m1 = V::max_u32(m1, V::bit_and(tail, magnitude));
      }
    }
    const I all = V::max_u32(V::max_u32(m0, m1), V::max_u32(m2, m3));
    const std::uint32_t vector_max = V::max_of_lanes(all);
    if constexpr (V::kMaskedTails) {
      return vector_max;
    } else {
      const std::uint32_t tail_max = scalar::kQsgdKernels.abs_max_bits(x + i, n - i);
      return vector_max > tail_max ? vector_max : tail_max;
    }
  }

  static void philox_words(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                           std::uint64_t first_block, std::size_t num_blocks,
                           std::uint32_t* out) noexcept {
    V::philox_words(seed, step, tensor_id, first_block, num_blocks, out);
  }

  // Per-bucket constants of quantize_lanes, broadcast once per call.
  struct EncodeVectors {
    I magnitude_mask, sign_bit;
    F prescale, inv, offset, top, unit;
  };

  GZ_KERNEL_INLINE EncodeVectors encode_vectors(const QsgdEncodeBucket& bucket) noexcept {
    return EncodeVectors{V::set1(bucket.magnitude_mask), V::set1(bucket.sign_bit),
                         V::set1_float(bucket.prescale), V::set1_float(bucket.inv),
                         V::set1_float(bucket.offset),   V::set1_float(bucket.top),
                         V::set1_float(1.0f / 16777216.0f)};
  }

  // qsgd_encode_code() of kLanes elements of a finite bucket, one code per 32-bit lane.
  // kSign: bits == 1 (quantise x, add the offset, no sign bit); kPrescale: prescale != 1
  // (multiplying by 1 is exact, so skipping it gives the same bits).
  template <bool kSign, bool kPrescale>
  GZ_KERNEL_INLINE I quantize_lanes(I x, I word, const EncodeVectors& c) noexcept {
    // y = magnitude * prescale * inv + offset
    F y = kSign ? V::as_floats(x) : V::as_floats(V::bit_and(x, c.magnitude_mask));
    if constexpr (kPrescale) y = V::mul(y, c.prescale);
    y = V::mul(y, c.inv);
    if constexpr (kSign) y = V::add(y, c.offset);  // offset is +0 for bits >= 2: y + 0 == y
    // v = y + uniform_unit(word)
    const F u = V::mul(V::to_floats(V::template shift_right_32<8>(word)), c.unit);
    const F v = V::add(y, u);
    // qsgd_level(v) = trunc(min(v, top)): in a finite bucket v is never NaN and v > -1
    // (bits >= 2: y, u >= 0; bits == 1: y >= -2^-24), so truncation toward 0 is the clamped floor.
    const I q = V::truncated(V::min(v, c.top));
    if constexpr (kSign) return q;
    // negative && q != 0 ? q | sign_bit : q
    return V::signed_codes(q, x, c.sign_bit);
  }

  // Returns how many leading elements it coded: all of them where V::kMaskedTails, else the
  // whole vectors (the caller codes the rest).
  template <bool kSign, bool kPrescale>
  static std::size_t quantize_as(const float* x, const std::uint32_t* words, std::size_t n,
                                 const EncodeVectors& c, std::uint8_t* codes) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      const I code = quantize_lanes<kSign, kPrescale>(V::load(x + i), V::load(words + i), c);
      V::store_lane_bytes(codes + i, code);
    }
    if constexpr (V::kMaskedTails) {
      if (i < n) {
        const auto lanes = V::first_lanes(n - i);
        const I code = quantize_lanes<kSign, kPrescale>(V::load_first(lanes, x + i),
                                                        V::load_first(lanes, words + i), c);
        V::store_lane_bytes_first(lanes, codes + i, code);
      }
      return n;
    } else {
      return i;
    }
  }

  static void quantize(const float* x, const std::uint32_t* words, std::size_t n,
                       const QsgdEncodeBucket& bucket, std::uint8_t* codes) noexcept {
    const EncodeVectors c = encode_vectors(bucket);
    const bool stochastic_sign = bucket.sign_bit == 0;  // bits == 1
    const bool prescale = bucket.prescale != 1.0f;
    std::size_t i;
    if (stochastic_sign) {
      i = prescale ? quantize_as<true, true>(x, words, n, c, codes)
                   : quantize_as<true, false>(x, words, n, c, codes);
    } else {
      i = prescale ? quantize_as<false, true>(x, words, n, c, codes)
                   : quantize_as<false, false>(x, words, n, c, codes);
    }
    if constexpr (!V::kMaskedTails) {
      if (i < n) scalar::kQsgdKernels.quantize(x + i, words + i, n - i, bucket, codes + i);
    }
  }

  static void pack_codes(const std::uint8_t* codes, std::size_t n, int bits,
                         std::byte* out) noexcept {
    std::size_t i = 0;
    switch (bits) {
      case 8:
        std::memcpy(out, codes, n);
        return;
      case 4:  // kCodesPerStep codes -> half as many bytes: byte j = code 2j | code (2j + 1) << 4
        for (; i + kCodesPerStep <= n; i += kCodesPerStep) {
          const I pairs = V::load(codes + i);  // u16 lane = c_even | c_odd << 8
          V::store_half_bytes(out + i / 2, V::bit_or(pairs, V::template shift_right_16<4>(pairs)));
        }
        break;
      case 2:  // kCodesPerStep codes -> a quarter as many bytes:
               // byte j = c0 | c1 << 2 | c2 << 4 | c3 << 6 of codes 4j..4j+3
        for (; i + kCodesPerStep <= n; i += kCodesPerStep) {
          const I quads = V::load(codes + i);  // u32 lane = c0 | c1<<8 | c2<<16 | c3<<24
          const I halves = V::bit_or(quads, V::template shift_right_32<6>(quads));
          const I merged = V::bit_or(halves, V::template shift_right_32<12>(halves));
          V::store_lane_bytes(out + i / 4, merged);
        }
        break;
      case 1:  // kCodesPerStep codes -> an eighth as many bytes: bit i of the stream = code i
        for (; i + kCodesPerStep <= n; i += kCodesPerStep) {
          const typename V::Bits mask = V::nonzero_bits(codes + i);
          std::memcpy(out + i / 8, &mask, sizeof mask);
        }
        break;
      default:
        break;
    }
    // The rest by the scalar loop; i is a multiple of 8, so it starts on a byte.
    if (i < n) {
      scalar::kQsgdKernels.pack_codes(codes + i, n - i, bits,
                                      out + i / 8 * static_cast<std::size_t>(bits));
    }
  }

  static void unpack_codes(const std::byte* in, std::size_t n, int bits,
                           std::uint8_t* codes) noexcept {
    std::size_t i = 0;
    switch (bits) {
      case 8:
        std::memcpy(codes, in, n);
        return;
      case 4:  // kCodesPerStep / 2 bytes -> kCodesPerStep codes
        for (; i + kCodesPerStep <= n; i += kCodesPerStep) {
          const I bytes = V::bytes_to_halves(in + i / 2);
          V::store(codes + i, V::bit_or(V::bit_and(bytes, V::set1_16(0x000F)),
                                        V::bit_and(V::template shift_left_16<4>(bytes),
                                                   V::set1_16(0x0F00))));
        }
        break;
      case 2:  // kCodesPerStep / 4 bytes -> kCodesPerStep codes
        for (; i + kCodesPerStep <= n; i += kCodesPerStep) {
          const I bytes = V::bytes_to_lanes(in + i / 4);
          const I low = V::bit_or(V::bit_and(bytes, V::set1(0x3)),
                                  V::bit_and(V::template shift_left_32<6>(bytes), V::set1(0x300)));
          const I high =
              V::bit_or(V::bit_and(V::template shift_left_32<12>(bytes), V::set1(0x30000)),
                        V::bit_and(V::template shift_left_32<18>(bytes), V::set1(0x3000000)));
          V::store(codes + i, V::bit_or(low, high));
        }
        break;
      case 1:  // kCodesPerStep / 8 bytes -> kCodesPerStep codes
        for (; i + kCodesPerStep <= n; i += kCodesPerStep) {
          V::store(codes + i, V::bytes_of_bits(in + i / 8));
        }
        break;
      default:
        break;
    }
    if (i < n) {
      scalar::kQsgdKernels.unpack_codes(in + i / 8 * static_cast<std::size_t>(bits), n - i, bits,
                                        codes + i);
    }
  }

  // Per-bucket constants of dequantize_lanes.
  struct DecodeVectors {
    F step, scale, negative_scale;
    I top_level, sign_mask;
    typename V::Count sign_shift;  // moves the code's sign bit to bit 31
  };

  GZ_KERNEL_INLINE DecodeVectors decode_vectors(const QsgdDecodeBucket& bucket) noexcept {
    return DecodeVectors{V::set1_float(bucket.step),
                         V::set1_float(bucket.scale),
                         V::set1_float(bucket.negative_scale),
                         V::set1(bucket.top_level),
                         V::set1(0x80000000u),
                         V::shift_count(31 - bucket.sign_shift)};
  }

  // qsgd_decode_code() of kLanes codes (one per 32-bit lane) of a finite bucket; kSign: bits == 1.
  template <bool kSign>
  GZ_KERNEL_INLINE F dequantize_lanes(I code, const DecodeVectors& c) noexcept {
    // code != 0 ? scale : negative_scale
    if constexpr (kSign) return V::nonzero_select(code, c.scale, c.negative_scale);
    // min(q * step, scale) with the sign bit of the code
    const F product = V::mul(V::to_floats(V::bit_and(code, c.top_level)), c.step);
    const F magnitude = V::min(product, c.scale);
    const I sign = V::bit_and(V::shift_left_32(code, c.sign_shift), c.sign_mask);
    return V::as_floats(V::bit_or(V::as_ints(magnitude), sign));
  }

  // Both return how many leading elements they wrote, as quantize_as does.
  template <bool kSign>
  static std::size_t dequantize_as(const std::uint8_t* codes, std::size_t n,
                                   const DecodeVectors& c, float* out) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      V::store_floats(out + i, dequantize_lanes<kSign>(V::bytes_to_lanes(codes + i), c));
    }
    if constexpr (V::kMaskedTails) {
      if (i < n) {
        const auto lanes = V::first_lanes(n - i);
        const F value = dequantize_lanes<kSign>(V::bytes_to_lanes_first(lanes, codes + i), c);
        V::store_floats_first(lanes, out + i, value);
      }
      return n;
    } else {
      return i;
    }
  }

  template <bool kSign>
  static std::size_t dequantize_add_as(const std::uint8_t* codes, std::size_t n,
                                       const DecodeVectors& c, float* acc) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      const F value = dequantize_lanes<kSign>(V::bytes_to_lanes(codes + i), c);
      V::store_floats(acc + i, V::add(V::load_floats(acc + i), value));
    }
    if constexpr (V::kMaskedTails) {
      if (i < n) {
        const auto lanes = V::first_lanes(n - i);
        const F value = dequantize_lanes<kSign>(V::bytes_to_lanes_first(lanes, codes + i), c);
        V::store_floats_first(lanes, acc + i, V::add(V::load_floats_first(lanes, acc + i), value));
      }
      return n;
    } else {
      return i;
    }
  }

  static void dequantize(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket,
                         int bits, float* out) noexcept {
    const DecodeVectors c = decode_vectors(bucket);
    const std::size_t i = bits == 1 ? dequantize_as<true>(codes, n, c, out)
                                    : dequantize_as<false>(codes, n, c, out);
    if constexpr (!V::kMaskedTails) {
      if (i < n) scalar::kQsgdKernels.dequantize(codes + i, n - i, bucket, bits, out + i);
    }
  }

  static void dequantize_add(const std::uint8_t* codes, std::size_t n,
                             const QsgdDecodeBucket& bucket, int bits, float* acc) noexcept {
    const DecodeVectors c = decode_vectors(bucket);
    const std::size_t i = bits == 1 ? dequantize_add_as<true>(codes, n, c, acc)
                                    : dequantize_add_as<false>(codes, n, c, acc);
    if constexpr (!V::kMaskedTails) {
      if (i < n) scalar::kQsgdKernels.dequantize_add(codes + i, n - i, bucket, bits, acc + i);
    }
  }
};

}  // namespace gradzip::kernels::cpu

// The kernel table of qsgd_cpu.h's vector namespaces, from QsgdVectorKernels<V>; expanded inside
// namespace gradzip::kernels::cpu::<isa>.
#define GZ_QSGD_VECTOR_ENTRY_POINTS(V)                                                           \
  const QsgdKernels kQsgdKernels{QsgdVectorKernels<V>::abs_max_bits,                             \
                                 QsgdVectorKernels<V>::philox_words,                             \
                                 QsgdVectorKernels<V>::quantize,                                 \
                                 QsgdVectorKernels<V>::pack_codes,                               \
                                 QsgdVectorKernels<V>::unpack_codes,                             \
                                 QsgdVectorKernels<V>::dequantize,                               \
                                 QsgdVectorKernels<V>::dequantize_add};
