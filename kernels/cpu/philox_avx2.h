// Philox 4x32-10 on 8 counters at once with AVX2, giving exactly the words of
// kernels/philox_math.h. Include only from *_avx2.cpp files (built with -mavx2).
//
// Layout: each counter sits in a 64-bit lane, its 32-bit words in the low halves of four
// vectors (two groups of 4 counters make 8). _mm256_mul_epu32 multiplies exactly those low
// halves into full 64-bit products, so a round is one multiply, one shift (the high half) and
// two xors per word pair. The high halves of the lanes carry junk that no instruction reads:
// the multiplies and the final unpacks look at the low halves only.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/philox_math.h"

namespace gradzip::kernels::cpu::avx2 {

#define GZ_PHILOX_INLINE static inline __attribute__((always_inline))

// State of 4 counters: word w of counter j is the low 32 bits of 64-bit lane j of c[w].
struct PhiloxLanes4 {
  __m256i c0, c1, c2, c3;
};

GZ_PHILOX_INLINE void philox_round(PhiloxLanes4& s, __m256i m0, __m256i m1, __m256i key0,
                                   __m256i key1) {
  const __m256i product0 = _mm256_mul_epu32(s.c0, m0);  // lo0 | hi0 << 32
  const __m256i product1 = _mm256_mul_epu32(s.c2, m1);  // lo1 | hi1 << 32
  // c0 = hi1 ^ c1 ^ key0;  c1 = lo1;  c2 = hi0 ^ c3 ^ key1;  c3 = lo0
  s.c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(product1, 32), s.c1), key0);
  s.c1 = product1;
  s.c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(product0, 32), s.c3), key1);
  s.c3 = product0;
}

// philox4x32_10 of two groups of 4 counters, interleaved so that both chains are in flight.
GZ_PHILOX_INLINE void philox4x32_10_x8(PhiloxLanes4& a, PhiloxLanes4& b, std::uint32_t key0,
                                       std::uint32_t key1) {
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0);
  const __m256i m1 = _mm256_set1_epi64x(kPhiloxM1);
  for (int round = 0; round < 10; ++round) {
    const __m256i k0 = _mm256_set1_epi32(static_cast<int>(key0));
    const __m256i k1 = _mm256_set1_epi32(static_cast<int>(key1));
    philox_round(a, m0, m1, k0, k1);
    philox_round(b, m0, m1, k0, k1);
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
}

// Counters of 4 blocks: 64-bit lane j holds block first_block + lane_block[j].
GZ_PHILOX_INLINE PhiloxLanes4 philox_counters4(std::uint64_t first_block, __m256i lane_block,
                                               __m256i step, __m256i tensor_id) {
  const __m256i block = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first_block)), lane_block);
  return PhiloxLanes4{block, _mm256_srli_epi64(block, 32), step, tensor_id};
}

// The 16 words of a group's 4 blocks in element order. The group's lane j holds block
// lane_block[j] = {0, 2, 1, 3}: after the unpacks, 128-bit lane k of out_lo holds the four
// words of 64-bit lane 2k (block k) and that of out_hi those of lane 2k + 1 (block 2 + k),
// so out_lo = blocks 0, 1 and out_hi = blocks 2, 3.
GZ_PHILOX_INLINE void philox_words_in_order(const PhiloxLanes4& s, __m256i& out_lo, __m256i& out_hi) {
  const __m256i w01_even = _mm256_unpacklo_epi32(s.c0, s.c1);  // c0[2k] c1[2k] . .
  const __m256i w01_odd = _mm256_unpackhi_epi32(s.c0, s.c1);   // c0[2k+1] c1[2k+1] . .
  const __m256i w23_even = _mm256_unpacklo_epi32(s.c2, s.c3);
  const __m256i w23_odd = _mm256_unpackhi_epi32(s.c2, s.c3);
  out_lo = _mm256_unpacklo_epi64(w01_even, w23_even);
  out_hi = _mm256_unpacklo_epi64(w01_odd, w23_odd);
}

// The words of the 8 blocks [first_block, first_block + 8) under gradzip's keying, in element
// order: out0 = elements 0..7 (blocks 0, 1), out1 = 8..15, out2 = 16..23, out3 = 24..31.
GZ_PHILOX_INLINE void philox_block_words_x8(std::uint64_t seed, std::uint32_t step,
                                            std::uint32_t tensor_id, std::uint64_t first_block,
                                            __m256i& out0, __m256i& out1, __m256i& out2,
                                            __m256i& out3) {
  const __m256i lane_block = _mm256_setr_epi64x(0, 2, 1, 3);
  const __m256i step_lanes = _mm256_set1_epi32(static_cast<int>(step));
  const __m256i tensor_lanes = _mm256_set1_epi32(static_cast<int>(tensor_id));
  PhiloxLanes4 a = philox_counters4(first_block, lane_block, step_lanes, tensor_lanes);
  PhiloxLanes4 b = philox_counters4(first_block + 4, lane_block, step_lanes, tensor_lanes);
  philox4x32_10_x8(a, b, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  philox_words_in_order(a, out0, out1);
  philox_words_in_order(b, out2, out3);
}

// out[4 b + w] = word w of block first_block + b, for b < num_blocks.
GZ_PHILOX_INLINE void philox_words_x8(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                                      std::uint64_t first_block, std::size_t num_blocks,
                                      std::uint32_t* out) {
  std::size_t b = 0;
  for (; b + 8 <= num_blocks; b += 8) {
    __m256i w0, w1, w2, w3;
    philox_block_words_x8(seed, step, tensor_id, first_block + b, w0, w1, w2, w3);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * b), w0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * b + 8), w1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * b + 16), w2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * b + 24), w3);
  }
  if (b < num_blocks) {
    alignas(32) std::uint32_t tail[32];
    __m256i w0, w1, w2, w3;
    philox_block_words_x8(seed, step, tensor_id, first_block + b, w0, w1, w2, w3);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tail), w0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tail + 8), w1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tail + 16), w2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tail + 24), w3);
    std::memcpy(out + 4 * b, tail, 4 * (num_blocks - b) * sizeof(std::uint32_t));
  }
}

#undef GZ_PHILOX_INLINE

}  // namespace gradzip::kernels::cpu::avx2
