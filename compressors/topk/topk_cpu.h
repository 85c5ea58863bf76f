// Host top-k selection by magnitude (ordering rule and keys: compressors/topk/topk_math.h).
//
// Algorithm (exact). K below is the true k-th largest key.
//   1. Sample the tensor (compressors/topk/topk_math.h) and take the r-th largest sample key as the
//      threshold t, r = topk_sample_rank(k, n, approx = false): an estimate slightly below K
//      (t = 0 when r exceeds the sample).
//   2. One vectorised pass collects every element with key >= t, as (index, f32 bits) in index
//      order, into a buffer of topk_candidate_capacity(n, r) >= min(n, 2k) entries (about twice
//      the expected count). When t is 0 and the buffer is smaller than n, the pass is skipped
//      as overflowed: every element qualifies.
//   3. If at least k candidates came out (the usual case), K and the number of larger keys
//      among them are found by a radix select over the candidates (three histogram passes on
//      11/11/9-bit digits); the output is every candidate with key > K plus the lowest-index
//      candidates with key == K until there are k. Every non-candidate has key < t <= K, so
//      this is the exact top-k of the whole tensor.
//   4. If the buffer overflowed, more than k elements have key >= t, so K >= t: typically a
//      large class of equal magnitudes at t (all zeros, quantised values). A second pass
//      collects key >= t + 1. At least k of them: step 3 on those. Fewer: K == t exactly; the
//      output is the lowest-index elements equal to t (a prefix scan) plus the collected ones.
//   5. Otherwise (fewer than k candidates in step 2, or a second overflow in step 4), a radix
//      select over the whole tensor: a histogram pass of the top digit counts exactly the
//      elements at or above the bin holding K; if at most max(capacity, n / 8), one pass
//      collects them and step 3 finishes. Otherwise two more histogram passes find K and a
//      final pass emits the result. Always exact, always O(n).
//
// Approx (DGC, approx = true): the same steps with r = ceil(k * s / n), the plain estimate of
// K, and one difference: when step 2 produced m candidates with ceil(k / 2) <= m < k (and no
// overflow), those m are the result; with fewer than ceil(k / 2), step 5 gives the exact
// result. Guarantee: the approx result is always exactly the top-m set under the ordering
// rule, for m = its entry count, with ceil(k / 2) <= m <= k (m == k whenever step 2 found at
// least k candidates or overflowed, and always for n <= kTopkSampleAllCount, whose sample is
// the whole tensor). So every selected entry ranks before every unselected element; recall
// against exact top-k is m / k.
//
// Scratch, allocated per call: the sample (256 KiB) and the candidate buffer, (index bytes + 4)
// per entry: capacity entries, in step 5 up to max(capacity, n / 8); pages are touched only as
// candidates are written.
//
// Determinism: the result depends only on the input, k, approx, and (for approx only, through
// the sample) seed, step and tensor id; never on the ISA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "gradzip/tensor_view.h"

namespace gradzip::kernels::cpu {

// Entries a candidate buffer needs beyond its capacity: the vector paths store whole registers
// past the last candidate.
inline constexpr std::size_t kTopkCollectSlack = 64;
// topk_collect()'s result when more than `capacity` elements qualify.
inline constexpr std::size_t kTopkCollectOverflow = std::numeric_limits<std::size_t>::max();

// The candidate pass. For i in [0, count) in increasing order, every element with
// topk_key(values[i]) >= threshold is appended as index_out[c] = first_index + i,
// bits_out[c] = the f32 bits of values[i]. Returns the number appended, or
// kTopkCollectOverflow when more than `capacity` qualify (the buffers then hold unspecified
// entries). Both buffers must hold capacity + kTopkCollectSlack entries. The 32-bit version
// needs first_index + count <= 2^32. Dispatched on active_isa(); every ISA gives the same result.
std::size_t topk_collect(const float* values, std::size_t count, std::uint32_t threshold,
                         std::uint32_t first_index, std::uint32_t* index_out,
                         std::uint32_t* bits_out, std::size_t capacity) noexcept;
std::size_t topk_collect(const float* values, std::size_t count, std::uint32_t threshold,
                         std::uint64_t first_index, std::uint64_t* index_out,
                         std::uint32_t* bits_out, std::size_t capacity) noexcept;

// Candidate buffer size for an n-element tensor and sample rank r (n > kTopkSampleAllCount):
// min(n, 2 * r * ceil(n / s) + 4096), s the sample size (saturating); n for smaller tensors.
// Part of the approx contract: whether a pass overflows decides which result approx returns.
std::size_t topk_candidate_capacity(std::size_t n, std::uint64_t sample_rank) noexcept;

struct TopkOptions {
  bool approx = false;
  // The sample positions' Philox key (EncodeContext); only approx results depend on them.
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t tensor_id = 0;
};

// Which steps produced a result (for tests and benchmarks; the entries do not depend on it,
// except through approx's documented acceptance).
enum class TopkPath {
  empty,            // k == 0
  all,              // k == n: every element
  candidates,       // step 3 (after step 2 or step 4's second pass): at least k candidates
  approx_accepted,  // approx: ceil(k/2) <= m < k candidates taken as the result
  tie_class,        // step 4: K is the sampled threshold itself
  radix_bin,        // step 5: candidates from the top-digit histogram's bin, then step 3
  full_radix,       // step 5: all three digits over the whole tensor
};

struct TopkResult {
  std::size_t count = 0;       // m, entries written
  TopkPath path = TopkPath::empty;
  std::uint32_t threshold = 0;  // the sampled threshold key t (0 for empty / all)
  std::size_t candidates = 0;   // candidates of step 2 (kTopkCollectOverflow when it overflowed)
};

// Selects the top-k (or approx top-m) elements of `in` (host; f32, f16 or bf16) and writes
// them in increasing index order: index_out[j], value_out[j] = the element widened to f32,
// bit-exact (NaN payloads kept), for j < result.count. Both outputs hold k entries.
// Requires k <= in.count, and in.count <= 2^32 for 32-bit indices; throws invalid_argument
// otherwise. Allocates its scratch (sample, candidates) per call. Example (as the tests call it):
//   std::vector<std::uint32_t> indices(k);
//   std::vector<float> values(k);
//   const TopkResult result = topk_select<std::uint32_t>(host_view(x.data(), x.size()), k,
//                                                        {}, indices.data(), values.data());
template <typename IndexT>
TopkResult topk_select(ConstTensorView in, std::size_t k, const TopkOptions& options,
                       IndexT* index_out, float* value_out);

extern template TopkResult topk_select<std::uint32_t>(ConstTensorView, std::size_t,
                                                      const TopkOptions&, std::uint32_t*, float*);
extern template TopkResult topk_select<std::uint64_t>(ConstTensorView, std::size_t,
                                                      const TopkOptions&, std::uint64_t*, float*);

// Error feedback's top-k (compressors/fused_feedback.h): sets e[i] = g[i] + e[i] (one f32 add
// per element) for i < n and selects from the new e exactly what topk_select() of it would
// (same entries, same TopkResult), reading g and e once where topk_select() would read the
// sum a second time: the adds run inside the candidate pass (step 2; on AVX2 in its own
// registers, otherwise block by block, each block read back from L1), and step 1 samples
// g + e at its runs. any_non_finite is set
// when some new e[i] is NaN or Inf. g and e are host arrays of n elements that do not overlap;
// requirements and throws as topk_select() (before e changes).
template <typename IndexT>
TopkResult topk_select_with_feedback(const float* g, float* e, std::size_t n, std::size_t k,
                                     const TopkOptions& options, IndexT* index_out,
                                     float* value_out, bool& any_non_finite);

extern template TopkResult topk_select_with_feedback<std::uint32_t>(
    const float*, float*, std::size_t, std::size_t, const TopkOptions&, std::uint32_t*, float*,
    bool&);
extern template TopkResult topk_select_with_feedback<std::uint64_t>(
    const float*, float*, std::size_t, std::size_t, const TopkOptions&, std::uint64_t*, float*,
    bool&);

namespace detail {
// The ISA-specific candidate passes (topk_cpu_avx2.cpp, topk_cpu_avx512.cpp), same contract
// as topk_collect() with threshold <= 0x7FFFFFFF (the dispatcher handles larger ones).
std::size_t topk_collect_avx2(const float* values, std::size_t count, std::uint32_t threshold,
                              std::uint32_t first_index, std::uint32_t* index_out,
                              std::uint32_t* bits_out, std::size_t capacity) noexcept;
std::size_t topk_collect_avx2(const float* values, std::size_t count, std::uint32_t threshold,
                              std::uint64_t first_index, std::uint64_t* index_out,
                              std::uint32_t* bits_out, std::size_t capacity) noexcept;
std::size_t topk_collect_avx512(const float* values, std::size_t count, std::uint32_t threshold,
                                std::uint32_t first_index, std::uint32_t* index_out,
                                std::uint32_t* bits_out, std::size_t capacity) noexcept;
std::size_t topk_collect_avx512(const float* values, std::size_t count, std::uint32_t threshold,
                                std::uint64_t first_index, std::uint64_t* index_out,
                                std::uint32_t* bits_out, std::size_t capacity) noexcept;
// The candidate pass of topk_select_with_feedback on AVX2: topk_collect_avx2's contract over
// g' = g + e, setting e[i] = g'[i] for every i < count (also after an overflow, which stops
// only the collecting) and any_non_finite to whether some g'[i] is NaN or Inf.
std::size_t topk_add_collect_avx2(const float* g, float* e, std::size_t count,
                                  std::uint32_t threshold, std::uint32_t first_index,
                                  std::uint32_t* index_out, std::uint32_t* bits_out,
                                  std::size_t capacity, bool& any_non_finite) noexcept;
std::size_t topk_add_collect_avx2(const float* g, float* e, std::size_t count,
                                  std::uint32_t threshold, std::uint64_t first_index,
                                  std::uint64_t* index_out, std::uint32_t* bits_out,
                                  std::size_t capacity, bool& any_non_finite) noexcept;
}  // namespace detail

}  // namespace gradzip::kernels::cpu
