// Philox 4x32-10 on 16 counters at once with AVX-512, giving exactly the words of
// kernels/philox_math.h. Include only from *_avx512.cpp files (built with -mavx512f/bw/vl/dq).
//
// Layout: each counter sits in a 64-bit lane, its 32-bit words in the low halves of four
// vectors (two groups of 8 counters make 16). _mm512_mul_epu32 multiplies exactly those low
// halves into full 64-bit products, so a round is one multiply, one shift (the high half) and
// one three-way xor per word pair. The high halves of the lanes carry junk that no instruction
// reads: the multiplies and the final unpacks look at the low halves only.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/philox_math.h"

namespace gradzip::kernels::cpu::avx512 {

#define GZ_PHILOX_INLINE static inline __attribute__((always_inline))

// State of 8 counters: word w of counter j is the low 32 bits of 64-bit lane j of c[w].
struct PhiloxLanes8 {
  __m512i c0, c1, c2, c3;
};

GZ_PHILOX_INLINE void philox_round(PhiloxLanes8& s, __m512i m0, __m512i m1, __m512i key0,
                                   __m512i key1) {
  const __m512i product0 = _mm512_mul_epu32(s.c0, m0);  // lo0 | hi0 << 32
  const __m512i product1 = _mm512_mul_epu32(s.c2, m1);  // lo1 | hi1 << 32
  // c0 = hi1 ^ c1 ^ key0;  c1 = lo1;  c2 = hi0 ^ c3 ^ key1;  c3 = lo0
  s.c0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(product1, 32), s.c1, key0, 0x96);
  s.c1 = product1;
  s.c2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(product0, 32), s.c3, key1, 0x96);
  s.c3 = product0;
}

// philox4x32_10 of two groups of 8 counters, interleaved so that both chains are in flight.
GZ_PHILOX_INLINE void philox4x32_10_x16(PhiloxLanes8& a, PhiloxLanes8& b, std::uint32_t key0,
                                        std::uint32_t key1) {
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0);
  const __m512i m1 = _mm512_set1_epi64(kPhiloxM1);
  for (int round = 0; round < 10; ++round) {
    const __m512i k0 = _mm512_set1_epi32(static_cast<int>(key0));
    const __m512i k1 = _mm512_set1_epi32(static_cast<int>(key1));
    philox_round(a, m0, m1, k0, k1);
    philox_round(b, m0, m1, k0, k1);
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
}

// Counters of 8 blocks: 64-bit lane j holds block first_block + lane_block[j].
GZ_PHILOX_INLINE PhiloxLanes8 philox_counters8(std::uint64_t first_block, __m512i lane_block,
                                               __m512i step, __m512i tensor_id) {
  const __m512i block = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first_block)), lane_block);
  return PhiloxLanes8{block, _mm512_srli_epi64(block, 32), step, tensor_id};
}

// The 32 words of a group's 8 blocks in element order. The group's lane j holds block
// lane_block[j] = {0, 4, 1, 5, 2, 6, 3, 7}: after the unpacks, 128-bit lane k of out_lo holds
// the four words of 64-bit lane 2k (block k) and that of out_hi those of lane 2k + 1 (block
// 4 + k), so out_lo = blocks 0..3 and out_hi = blocks 4..7.
GZ_PHILOX_INLINE void philox_words_in_order(const PhiloxLanes8& s, __m512i& out_lo, __m512i& out_hi) {
  const __m512i w01_even = _mm512_unpacklo_epi32(s.c0, s.c1);  // c0[2k] c1[2k] . .
  const __m512i w01_odd = _mm512_unpackhi_epi32(s.c0, s.c1);   // c0[2k+1] c1[2k+1] . .
  const __m512i w23_even = _mm512_unpacklo_epi32(s.c2, s.c3);
  const __m512i w23_odd = _mm512_unpackhi_epi32(s.c2, s.c3);
  out_lo = _mm512_unpacklo_epi64(w01_even, w23_even);
  out_hi = _mm512_unpacklo_epi64(w01_odd, w23_odd);
}

// The words of the 16 blocks [first_block, first_block + 16) under gradzip's keying, in element
// order: out0 = elements 0..15 (blocks 0..3), out1 = 16..31, out2 = 32..47, out3 = 48..63.
GZ_PHILOX_INLINE void philox_block_words_x16(std::uint64_t seed, std::uint32_t step,
                                             std::uint32_t tensor_id, std::uint64_t first_block,
                                             __m512i& out0, __m512i& out1, __m512i& out2,
                                             __m512i& out3) {
  const __m512i lane_block = _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7);
  const __m512i step_lanes = _mm512_set1_epi32(static_cast<int>(step));
  const __m512i tensor_lanes = _mm512_set1_epi32(static_cast<int>(tensor_id));
  PhiloxLanes8 a = philox_counters8(first_block, lane_block, step_lanes, tensor_lanes);
  PhiloxLanes8 b = philox_counters8(first_block + 8, lane_block, step_lanes, tensor_lanes);
  philox4x32_10_x16(a, b, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  philox_words_in_order(a, out0, out1);
  philox_words_in_order(b, out2, out3);
}

// out[4 b + w] = word w of block first_block + b, for b < num_blocks.
GZ_PHILOX_INLINE void philox_words_x16(std::uint64_t seed, std::uint32_t step,
                                       std::uint32_t tensor_id, std::uint64_t first_block,
                                       std::size_t num_blocks, std::uint32_t* out) {
  std::size_t b = 0;
  for (; b + 16 <= num_blocks; b += 16) {
    __m512i w0, w1, w2, w3;
    philox_block_words_x16(seed, step, tensor_id, first_block + b, w0, w1, w2, w3);
    _mm512_storeu_si512(out + 4 * b, w0);
    _mm512_storeu_si512(out + 4 * b + 16, w1);
    _mm512_storeu_si512(out + 4 * b + 32, w2);
    _mm512_storeu_si512(out + 4 * b + 48, w3);
  }
  if (b < num_blocks) {
    alignas(64) std::uint32_t tail[64];
    __m512i w0, w1, w2, w3;
    philox_block_words_x16(seed, step, tensor_id, first_block + b, w0, w1, w2, w3);
    _mm512_store_si512(tail, w0);
    _mm512_store_si512(tail + 16, w1);
    _mm512_store_si512(tail + 32, w2);
    _mm512_store_si512(tail + 48, w3);
    std::memcpy(out + 4 * b, tail, 4 * (num_blocks - b) * sizeof(std::uint32_t));
  }
}

#undef GZ_PHILOX_INLINE

}  // namespace gradzip::kernels::cpu::avx512
