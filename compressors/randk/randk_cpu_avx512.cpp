// AVX-512 path of the random-k index draw: Philox 4x32-10 on 8 blocks at once, one 32-bit
// counter word per 64-bit lane so that vpmuludq gives the full 32x32->64 products the rounds
// need. Same bits as kernels/philox_math.h (integer-only; checked by test_randk per ISA).

// GCC 12 warns inside its own AVX-512 headers (the `__Y = __Y` of _mm512_undefined_epi32,
// GCC bug 105593, fixed in GCC 13); the warning is about the header, not this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "compressors/randk/randk_cpu.h"

namespace gradzip::kernels::cpu::avx512 {

void randk_words(const RandkKey& key, std::uint64_t first, std::size_t count,
                 std::uint64_t* words) noexcept {
  constexpr int kRounds = 10;
  // Round keys as 64-bit scalars: the vector ops broadcast them straight from memory.
  std::uint64_t round_key0[kRounds], round_key1[kRounds];
  std::uint32_t key0 = static_cast<std::uint32_t>(key.seed);
  std::uint32_t key1 = static_cast<std::uint32_t>(key.seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    round_key0[round] = key0;
    round_key1[round] = key1;
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
  const __m512i multiplier0 = _mm512_set1_epi64(kPhiloxM0);
  const __m512i multiplier1 = _mm512_set1_epi64(kPhiloxM1);
  const __m512i step = _mm512_set1_epi64(key.step);
  const __m512i tensor_id = _mm512_set1_epi64(key.tensor_id);
  const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFFu);
  const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);

  // Only the low 32 bits of each lane are Philox state. The upper halves carry leftovers of
  // the products; vpmuludq reads only the low halves and XOR keeps halves apart, so the
  // leftovers never reach the low bits and are dropped when the words are packed.
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m512i block = _mm512_add_epi64(
        _mm512_set1_epi64(static_cast<long long>(key.element_offset + first + i)), lane);
    __m512i c0 = block;
    __m512i c1 = _mm512_srli_epi64(block, 32);
    __m512i c2 = step;
    __m512i c3 = tensor_id;
    for (int round = 0; round < kRounds; ++round) {
      const __m512i product0 = _mm512_mul_epu32(multiplier0, c0);
      const __m512i product1 = _mm512_mul_epu32(multiplier1, c2);
      // 0x96: a ^ b ^ c.
      c0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(product1, 32), c1,
                                     _mm512_set1_epi64(static_cast<long long>(round_key0[round])),
                                     0x96);
      c1 = product1;
      c2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(product0, 32), c3,
                                     _mm512_set1_epi64(static_cast<long long>(round_key1[round])),
                                     0x96);
      c3 = product0;
    }
    const __m512i word = _mm512_or_si512(_mm512_and_si512(c0, low32), _mm512_slli_epi64(c1, 32));
    _mm512_storeu_si512(words + i, word);
  }
  for (; i < count; ++i) words[i] = randk_word(key, first + i);
}

}  // namespace gradzip::kernels::cpu::avx512
