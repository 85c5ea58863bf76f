// AVX-512 candidate pass of top-k (contract: topk_collect() in compressors/topk/topk_cpu.h).
//
// Branch-free: every 16-lane vector is compressed in a register (vpcompressd) and stored whole,
// the write position advancing by the popcount of the mask. Compress-store straight to memory
// is avoided on purpose: it is microcoded and slow on AMD Zen 4. The whole-vector stores are
// what kTopkCollectSlack pays for; the capacity is checked once per 64 elements, so stores reach
// at most capacity + 64 entries.
#include <immintrin.h>

#include "compressors/topk/topk_cpu.h"
#include "compressors/topk/topk_math.h"

namespace gradzip::kernels::cpu::detail {
namespace {

inline constexpr std::size_t kLanes = 16;
inline constexpr std::size_t kBlock = 4 * kLanes;
static_assert(kBlock <= kTopkCollectSlack);

// Appends the lanes of `mask` of one vector: bits from `bits`, indices base + lane.
struct IndexWriter32 {
  std::uint32_t* out;
  void write(std::size_t at, __mmask16 mask, std::uint64_t base) const {
    const __m512i lanes = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(base))),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    _mm512_storeu_si512(out + at, _mm512_maskz_compress_epi32(mask, lanes));
  }
};

// 64-bit indices: the two 8-lane halves are compressed as u64 vectors, the high half stored
// right after the low half's entries.
struct IndexWriter64 {
  std::uint64_t* out;
  void write(std::size_t at, __mmask16 mask, std::uint64_t base) const {
    const __m512i base64 = _mm512_set1_epi64(static_cast<long long>(base));
    const __m512i low = _mm512_add_epi64(base64, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    const __m512i high = _mm512_add_epi64(base64, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15));
    const auto low_mask = static_cast<__mmask8>(mask & 0xFFu);
    const auto high_mask = static_cast<__mmask8>(mask >> 8);
    _mm512_storeu_si512(out + at, _mm512_maskz_compress_epi64(low_mask, low));
    _mm512_storeu_si512(out + at + _mm_popcnt_u32(low_mask),
                        _mm512_maskz_compress_epi64(high_mask, high));
  }
};

template <typename Writer>
std::size_t collect(const float* values, std::size_t count, std::uint32_t threshold,
                    std::uint64_t first_index, Writer index_writer, std::uint32_t* bits_out,
                    std::size_t capacity) noexcept {
  const __m512i key_mask = _mm512_set1_epi32(static_cast<int>(kTopkKeyMask));
  const __m512i limit = _mm512_set1_epi32(static_cast<int>(threshold));
  std::size_t written = 0;

  const auto append = [&](__m512i bits, __mmask16 mask, std::size_t i) {
    index_writer.write(written, mask, first_index + i);
    _mm512_storeu_si512(bits_out + written, _mm512_maskz_compress_epi32(mask, bits));
    written += static_cast<std::size_t>(_mm_popcnt_u32(mask));
  };
  const auto qualifying = [&](__m512i bits) {
    return _mm512_cmpge_epu32_mask(_mm512_and_si512(bits, key_mask), limit);
  };

  std::size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    if (written > capacity) return kTopkCollectOverflow;
    const __m512i b0 = _mm512_loadu_si512(values + i);
    const __m512i b1 = _mm512_loadu_si512(values + i + kLanes);
    const __m512i b2 = _mm512_loadu_si512(values + i + 2 * kLanes);
    const __m512i b3 = _mm512_loadu_si512(values + i + 3 * kLanes);
    const __mmask16 m0 = qualifying(b0), m1 = qualifying(b1);
    const __mmask16 m2 = qualifying(b2), m3 = qualifying(b3);
    append(b0, m0, i);
    append(b1, m1, i + kLanes);
    append(b2, m2, i + 2 * kLanes);
    append(b3, m3, i + 3 * kLanes);
  }
  if (written > capacity) return kTopkCollectOverflow;
  // At most 63 elements left, at most 4 vectors: within the slack.
  for (; i < count; i += kLanes) {
    const std::size_t left = count - i;
    const __mmask16 in_range =
        left >= kLanes ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1u);
    const __m512i bits = _mm512_maskz_loadu_epi32(in_range, values + i);
    append(bits, static_cast<__mmask16>(qualifying(bits) & in_range), i);
  }
  return written > capacity ? kTopkCollectOverflow : written;
}

}  // namespace

std::size_t topk_collect_avx512(const float* values, std::size_t count, std::uint32_t threshold,
                                std::uint32_t first_index, std::uint32_t* index_out,
                                std::uint32_t* bits_out, std::size_t capacity) noexcept {
  return collect(values, count, threshold, first_index, IndexWriter32{index_out}, bits_out,
                 capacity);
}

std::size_t topk_collect_avx512(const float* values, std::size_t count, std::uint32_t threshold,
                                std::uint64_t first_index, std::uint64_t* index_out,
                                std::uint32_t* bits_out, std::size_t capacity) noexcept {
  return collect(values, count, threshold, first_index, IndexWriter64{index_out}, bits_out,
                 capacity);
}

}  // namespace gradzip::kernels::cpu::detail
