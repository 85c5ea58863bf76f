// AVX2 candidate pass of top-k (contract: topk_collect() in compressors/topk/topk_cpu.h), and the
// same pass forming g' = g + e as it reads (topk_add_collect_avx2, for the fused error feedback).
//
// Branch-free like the AVX-512 path: AVX2 has no compress, so each 8-lane mask indexes a table
// of lane permutations (vpermd) that packs the qualifying lanes to the front; the whole vector
// is stored and the write position advances by the mask's popcount. Keys are below 2^31, so
// the unsigned test key >= threshold is the signed test key > threshold - 1.
#include <immintrin.h>

#include <array>
#include <cstring>

#include "compressors/topk/topk_cpu.h"
#include "compressors/topk/topk_math.h"

namespace gradzip::kernels::cpu::detail {
namespace {

inline constexpr std::size_t kLanes = 8;
inline constexpr std::size_t kBlock = 8 * kLanes;
static_assert(kBlock <= kTopkCollectSlack);

// For each 8-bit mask: the positions of its set bits, lowest first, one byte each, zero-padded.
constexpr std::array<std::uint64_t, 256> make_pack_table() {
  std::array<std::uint64_t, 256> table{};
  for (unsigned mask = 0; mask < 256; ++mask) {
    std::uint64_t packed = 0;
    unsigned slot = 0;
    for (unsigned lane = 0; lane < 8; ++lane) {
      if (mask & (1u << lane)) packed |= std::uint64_t{lane} << (8 * slot++);
    }
    table[mask] = packed;
  }
  return table;
}
constexpr std::array<std::uint64_t, 256> kPackTable = make_pack_table();

inline __m256i pack_permutation(unsigned mask) {
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kPackTable[mask])));
}

struct IndexWriter32 {
  std::uint32_t* out;
  void write(std::size_t at, __m256i permutation, std::uint64_t base) const {
    const __m256i lanes =
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(base))),
                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + at),
                        _mm256_permutevar8x32_epi32(lanes, permutation));
  }
};

struct IndexWriter64 {
  std::uint64_t* out;
  void write(std::size_t at, __m256i permutation, std::uint64_t base) const {
    // The permutation holds the packed lane numbers themselves.
    const __m256i base64 = _mm256_set1_epi64x(static_cast<long long>(base));
    const __m256i low = _mm256_add_epi64(base64, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(permutation)));
    const __m256i high =
        _mm256_add_epi64(base64, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(permutation, 1)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + at), low);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + at + 4), high);
  }
};

// Where the pass reads its f32 bits: the values themselves.
struct PlainSource {
  const float* values;
  __m256i load(std::size_t i) const {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + i));
  }
  // The `left` (< 8) elements from i into tail.
  void load_tail(std::size_t i, std::size_t left, std::uint32_t* tail) const {
    std::memcpy(tail, values + i, left * sizeof(float));
  }
  // Nothing to do for the elements [i, count) that an overflow leaves unread.
  void finish(std::size_t, std::size_t) {}
};

// The fused error feedback: e[i] = g[i] + e[i] as it reads, and whether some sum is NaN or Inf.
struct FeedbackSource {
  const float* g;
  float* e;
  __m256i non_finite = _mm256_setzero_si256();
  bool tail_non_finite = false;

  __m256i form(std::size_t i) {
    const __m256 sum = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i));
    _mm256_storeu_ps(e + i, sum);
    const __m256i bits = _mm256_castps_si256(sum);
    const __m256i exponent = _mm256_set1_epi32(0x7F800000);
    non_finite = _mm256_or_si256(
        non_finite, _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent));
    return bits;
  }
  __m256i load(std::size_t i) { return form(i); }
  void load_tail(std::size_t i, std::size_t left, std::uint32_t* tail) {
    for (std::size_t j = 0; j < left; ++j) {
      e[i + j] = g[i + j] + e[i + j];
      std::memcpy(tail + j, e + i + j, sizeof(float));
      tail_non_finite |= (tail[j] & 0x7F800000u) == 0x7F800000u;
    }
  }
  // After an overflow the rest is formed without collecting.
  void finish(std::size_t i, std::size_t count) {
    for (; i + kLanes <= count; i += kLanes) form(i);
    std::uint32_t tail[kLanes];
    load_tail(i, count - i, tail);
  }
  bool any_non_finite() const { return tail_non_finite || !_mm256_testz_si256(non_finite, non_finite); }
};

template <typename Source, typename Writer>
std::size_t collect(Source& source, std::size_t count, std::uint32_t threshold,
                    std::uint64_t first_index, Writer index_writer, std::uint32_t* bits_out,
                    std::size_t capacity) noexcept {
  const __m256i key_mask = _mm256_set1_epi32(static_cast<int>(kTopkKeyMask));
  // threshold <= 0x7FFFFFFF, so threshold - 1 >= -1 as a signed lane.
  const __m256i below = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
  std::size_t written = 0;

  const auto append = [&](__m256i bits, unsigned mask, std::size_t i) {
    const __m256i permutation = pack_permutation(mask);
    index_writer.write(written, permutation, first_index + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits_out + written),
                        _mm256_permutevar8x32_epi32(bits, permutation));
    written += static_cast<std::size_t>(_mm_popcnt_u32(mask));
  };
  const auto qualifying = [&](__m256i bits) {
    const __m256i keys = _mm256_and_si256(bits, key_mask);
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, below))));
  };

  std::size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    if (written > capacity) {
      source.finish(i, count);
      return kTopkCollectOverflow;
    }
    for (std::size_t lane = 0; lane < kBlock; lane += kLanes) {
      const __m256i bits = source.load(i + lane);
      append(bits, qualifying(bits), i + lane);
    }
  }
  if (written > capacity) {
    source.finish(i, count);
    return kTopkCollectOverflow;
  }
  // At most 63 elements left, at most 8 vectors: within the slack.
  for (; i < count; i += kLanes) {
    const std::size_t left = count - i;
    if (left >= kLanes) {
      const __m256i bits = source.load(i);
      append(bits, qualifying(bits), i);
      continue;
    }
    alignas(32) std::uint32_t tail[kLanes] = {};
    source.load_tail(i, left, tail);
    const __m256i bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
    append(bits, qualifying(bits) & ((1u << left) - 1u), i);
  }
  return written > capacity ? kTopkCollectOverflow : written;
}

template <typename Writer>
std::size_t collect_values(const float* values, std::size_t count, std::uint32_t threshold,
                           std::uint64_t first_index, Writer index_writer, std::uint32_t* bits_out,
                           std::size_t capacity) noexcept {
  PlainSource source{values};
  return collect(source, count, threshold, first_index, index_writer, bits_out, capacity);
}

template <typename Writer>
std::size_t add_collect(const float* g, float* e, std::size_t count, std::uint32_t threshold,
                        std::uint64_t first_index, Writer index_writer, std::uint32_t* bits_out,
                        std::size_t capacity, bool& any_non_finite) noexcept {
  FeedbackSource source{g, e};
  const std::size_t result =
      collect(source, count, threshold, first_index, index_writer, bits_out, capacity);
  any_non_finite = source.any_non_finite();
  return result;
}

}  // namespace

std::size_t topk_collect_avx2(const float* values, std::size_t count, std::uint32_t threshold,
                              std::uint32_t first_index, std::uint32_t* index_out,
                              std::uint32_t* bits_out, std::size_t capacity) noexcept {
  return collect_values(values, count, threshold, first_index, IndexWriter32{index_out}, bits_out,
                        capacity);
}

std::size_t topk_collect_avx2(const float* values, std::size_t count, std::uint32_t threshold,
                              std::uint64_t first_index, std::uint64_t* index_out,
                              std::uint32_t* bits_out, std::size_t capacity) noexcept {
  return collect_values(values, count, threshold, first_index, IndexWriter64{index_out}, bits_out,
                        capacity);
}

std::size_t topk_add_collect_avx2(const float* g, float* e, std::size_t count,
                                  std::uint32_t threshold, std::uint32_t first_index,
                                  std::uint32_t* index_out, std::uint32_t* bits_out,
                                  std::size_t capacity, bool& any_non_finite) noexcept {
  return add_collect(g, e, count, threshold, first_index, IndexWriter32{index_out}, bits_out,
                     capacity, any_non_finite);
}

std::size_t topk_add_collect_avx2(const float* g, float* e, std::size_t count,
                                  std::uint32_t threshold, std::uint64_t first_index,
                                  std::uint64_t* index_out, std::uint32_t* bits_out,
                                  std::size_t capacity, bool& any_non_finite) noexcept {
  return add_collect(g, e, count, threshold, first_index, IndexWriter64{index_out}, bits_out,
                     capacity, any_non_finite);
}

}  // namespace gradzip::kernels::cpu::detail
