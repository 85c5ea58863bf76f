// Host top-k selection (algorithm and contracts: compressors/topk/topk_cpu.h): the scalar candidate
// pass, its ISA dispatch, the sample, the radix select and the emission of the result.
#include "compressors/topk/topk_cpu.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "gradzip/error.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/nonfinite_math.h"
#include "compressors/topk/topk_math.h"

namespace gradzip::kernels::cpu {
namespace {

template <typename IndexT>
std::size_t collect_scalar(const float* values, std::size_t count, std::uint32_t threshold,
                           IndexT first_index, IndexT* index_out, std::uint32_t* bits_out,
                           std::size_t capacity) noexcept {
  std::size_t written = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t bits = float_bits(values[i]);
    if (topk_key_of_bits(bits) < threshold) continue;
    if (written == capacity) return kTopkCollectOverflow;
    index_out[written] = static_cast<IndexT>(first_index + i);
    bits_out[written] = bits;
    ++written;
  }
  return written;
}

template <typename IndexT>
std::size_t collect_dispatch(const float* values, std::size_t count, std::uint32_t threshold,
                             IndexT first_index, IndexT* index_out, std::uint32_t* bits_out,
                             std::size_t capacity) noexcept {
  // No key exceeds kTopkKeyMask; the vector paths assume threshold <= kTopkKeyMask.
  if (threshold > kTopkKeyMask) return 0;
  switch (active_isa()) {
    case Isa::avx512:
      return detail::topk_collect_avx512(values, count, threshold, first_index, index_out,
                                         bits_out, capacity);
    case Isa::avx2:
      return detail::topk_collect_avx2(values, count, threshold, first_index, index_out, bits_out,
                                       capacity);
    case Isa::scalar:
      break;
  }
  return collect_scalar(values, count, threshold, first_index, index_out, bits_out, capacity);
}

// Visits elements [0, n) of `in` in index order as f32 blocks: visit(block, first_index, count).
// f32 input is visited in place, as one block; f16/bf16 is widened kConvertBlock at a time.
// Stops early when visit returns false.
template <typename Visit>
void for_each_f32_block(ConstTensorView in, Visit&& visit) {
  if (in.count == 0) return;
  if (in.dtype == DType::f32) {
    visit(static_cast<const float*>(in.data), std::size_t{0}, in.count);
    return;
  }
  float block[kConvertBlock];
  for (std::size_t begin = 0; begin < in.count; begin += kConvertBlock) {
    const std::size_t count = std::min(kConvertBlock, in.count - begin);
    load_as_f32(in, begin, count, block);
    if (!visit(static_cast<const float*>(block), begin, count)) return;
  }
}

inline std::uint32_t key_of(float value) { return topk_key(value); }
inline std::uint32_t key_of(std::uint32_t bits) { return topk_key_of_bits(bits); }

// The k-th largest key of a multiset and how many keys are strictly larger.
struct KthKey {
  std::uint32_t key = 0;
  std::uint64_t greater = 0;
};

// Radix select of the k-th largest key, most significant digit first (topk_key_digit), one
// level per refine() call. `visit_keys(sink)` must call sink(const T* data, count), T float or
// std::uint32_t f32 bits, over the whole multiset, the same way each time it is called.
// Requires 1 <= k <= size of the multiset.
//
// Counting uses kCopies interleaved 32-bit histograms, so that runs of equal digits (common:
// the keys of a gradient share few exponents) do not serialise on one counter; they are
// flushed into 64-bit totals every kFlushEvery keys. From level 1 on, keys outside the chosen
// prefix count in an extra bin rather than behind a branch, which would mispredict.
class RadixSelect {
 public:
  explicit RadixSelect(std::uint64_t k) : remaining_(k), k_(k) {}

  template <typename VisitKeys>
  void refine(VisitKeys&& visit_keys) {
    const int level = levels_done_;
    const std::uint32_t bins = topk_digit_bins(level);
    std::fill_n(totals_.begin(), bins + 1, 0);
    partial_.fill(0);
    const int shift = level == 0 ? 31 : topk_digit_shift(level - 1);
    const std::uint32_t wanted = result_.key >> shift;  // the chosen higher digits (0 at level 0)
    const auto bin_of = [&](std::uint32_t key) {
      // Bit arithmetic rather than ?: so that the compiler does not turn it into a branch.
      const std::uint32_t match = 0u - static_cast<std::uint32_t>((key >> shift) == wanted);
      return (topk_key_digit(key, level) & match) | (bins & ~match);
    };
    visit_keys([&](const auto* data, std::size_t count) {
      for (std::size_t begin = 0; begin < count; begin += kFlushEvery) {
        const std::size_t length = std::min(kFlushEvery, count - begin);
        const auto* keys = data + begin;
        std::size_t i = 0;
        for (; i + kCopies <= length; i += kCopies) {
          for (std::size_t copy = 0; copy < kCopies; ++copy)
            ++partial_[copy * kBins + bin_of(key_of(keys[i + copy]))];
        }
        for (; i < length; ++i) ++partial_[bin_of(key_of(keys[i]))];
        flush(bins);
      }
    });
    std::uint32_t bin = bins;
    while (bin > 0) {
      --bin;
      if (totals_[bin] >= remaining_) break;
      remaining_ -= totals_[bin];
      result_.greater += totals_[bin];
      GZ_REQUIRE(bin > 0, ErrorCode::internal, "topk: radix select ran out of keys (k = ", k_, ")");
    }
    in_bin_ = totals_[bin];
    result_.key |= bin << topk_digit_shift(level);
    ++levels_done_;
  }

  // After the last level: K and the count of larger keys.
  KthKey result() const { return result_; }
  // After any level: the smallest key of the chosen bin, how many keys lie above the bin, and
  // how many in it.
  std::uint32_t bin_floor() const { return result_.key; }
  std::uint64_t greater() const { return result_.greater; }
  std::uint64_t in_bin() const { return in_bin_; }

 private:
  static constexpr std::size_t kCopies = 4;
  static constexpr std::size_t kBins = 2049;  // largest digit range plus the "other prefix" bin
  static constexpr std::size_t kFlushEvery = std::size_t{1} << 30;  // < 2^32 per 32-bit counter

  void flush(std::uint32_t bins) {
    for (std::size_t copy = 0; copy < kCopies; ++copy) {
      for (std::uint32_t bin = 0; bin <= bins; ++bin) {
        totals_[bin] += partial_[copy * kBins + bin];
        partial_[copy * kBins + bin] = 0;
      }
    }
  }

  std::array<std::uint32_t, kCopies * kBins> partial_;
  std::array<std::uint64_t, kBins> totals_;
  std::uint64_t remaining_;  // rank of K among the keys in the chosen prefix
  std::uint64_t k_;
  std::uint64_t in_bin_ = 0;
  KthKey result_;
  int levels_done_ = 0;
};

template <typename VisitKeys>
KthKey kth_largest_key(VisitKeys&& visit_keys, std::uint64_t k) {
  RadixSelect radix(k);
  for (int level = 0; level < kTopkDigitLevels; ++level) radix.refine(visit_keys);
  return radix.result();
}

// Writes entries in index order into the caller's outputs.
template <typename IndexT>
struct Emitter {
  IndexT* index_out;
  float* value_out;
  std::size_t written = 0;

  void emit(std::uint64_t index, std::uint32_t bits) {
    index_out[written] = static_cast<IndexT>(index);
    value_out[written] = bits_float(bits);
    ++written;
  }
};

// The exact top-k rule once K (the k-th key) and the count of larger keys are known: offered
// elements (in index order, each with key >= K or skipped) are kept when key > K, and while
// fewer than k - greater have been kept with key == K.
template <typename IndexT>
struct ThresholdFilter {
  Emitter<IndexT>& emitter;
  std::uint32_t kth_key;
  std::uint64_t equal_left;

  void offer(std::uint64_t index, std::uint32_t bits) {
    const std::uint32_t key = topk_key_of_bits(bits);
    if (key > kth_key) {
      emitter.emit(index, bits);
    } else if (key == kth_key && equal_left > 0) {
      --equal_left;
      emitter.emit(index, bits);
    }
  }
};

template <typename T>
std::unique_ptr<T[]> scratch(std::size_t count) {
  return std::make_unique_for_overwrite<T[]>(count);
}

// Keys of the sample (compressors/topk/topk_math.h) of an n-element tensor with n > kTopkSampleAllCount.
// load_run(start, run) writes the f32 values of elements [start, start + kTopkSampleRun) into
// run; prefetch(start) hints that run is wanted soon.
template <typename Prefetch, typename LoadRun>
std::vector<std::uint32_t> sample_run_keys(std::size_t n, const TopkOptions& options,
                                           Prefetch&& prefetch, LoadRun&& load_run) {
  std::vector<std::uint32_t> keys(topk_sample_count(n));
  // Each run is a cache miss somewhere in the tensor: compute the positions first and prefetch
  // a few runs ahead so that the misses overlap.
  constexpr std::uint64_t kPrefetchAhead = 16;
  std::array<std::uint64_t, kTopkSampleGroups> starts;
  for (std::uint64_t segment = 0; segment < kTopkSampleGroups; ++segment)
    starts[segment] = topk_sample_run_start(n, segment, options.seed, options.step, options.tensor_id);
  float run[kTopkSampleRun];
  for (std::uint64_t segment = 0; segment < kTopkSampleGroups; ++segment) {
    if (segment + kPrefetchAhead < kTopkSampleGroups) prefetch(starts[segment + kPrefetchAhead]);
    load_run(starts[segment], run);
    for (std::uint64_t i = 0; i < kTopkSampleRun; ++i)
      keys[segment * kTopkSampleRun + i] = topk_key(run[i]);
  }
  return keys;
}

// Keys of the sample of `in` (compressors/topk/topk_math.h).
std::vector<std::uint32_t> sample_keys(ConstTensorView in, const TopkOptions& options) {
  const std::size_t n = in.count;
  if (n <= kTopkSampleAllCount) {
    std::vector<std::uint32_t> keys(topk_sample_count(n));
    for_each_f32_block(in, [&](const float* block, std::size_t first, std::size_t count) {
      for (std::size_t i = 0; i < count; ++i) keys[first + i] = topk_key(block[i]);
      return true;
    });
    return keys;
  }
  const auto* bytes = static_cast<const char*>(in.data);
  const std::size_t element_bytes = dtype_size(in.dtype);
  return sample_run_keys(
      n, options,
      [&](std::uint64_t start) {
        const char* ahead = bytes + start * element_bytes;
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + kTopkSampleRun * element_bytes - 1);
      },
      [&](std::uint64_t start, float* run) { load_as_f32(in, start, kTopkSampleRun, run); });
}

// Every element, in order (k == n).
template <typename IndexT>
void emit_all(ConstTensorView in, Emitter<IndexT>& emitter) {
  for_each_f32_block(in, [&](const float* block, std::size_t first, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) emitter.emit(first + i, float_bits(block[i]));
    return true;
  });
}

// Candidates of one pass: (index, f32 bits) in index order.
template <typename IndexT>
struct CandidateList {
  std::unique_ptr<IndexT[]> index;
  std::unique_ptr<std::uint32_t[]> bits;
  std::size_t capacity = 0;
  std::size_t count = 0;  // kTopkCollectOverflow after an overflow

  explicit CandidateList(std::size_t capacity_)
      : index(scratch<IndexT>(capacity_ + kTopkCollectSlack)),
        bits(scratch<std::uint32_t>(capacity_ + kTopkCollectSlack)),
        capacity(capacity_) {}

  bool overflowed() const { return count == kTopkCollectOverflow; }

  // The candidate pass over the whole tensor (step 2).
  void collect(ConstTensorView in, std::uint32_t threshold) {
    count = 0;
    for_each_f32_block(in, [&](const float* block, std::size_t first, std::size_t length) {
      const std::size_t added =
          collect_dispatch(block, length, threshold, static_cast<IndexT>(first),
                           index.get() + count, bits.get() + count, capacity - count);
      count = added == kTopkCollectOverflow ? kTopkCollectOverflow : count + added;
      return !overflowed();
    });
  }
};

// Emits the top-k from the tensor once the k-th key K and the count of larger keys are known.
// Phase A scans a prefix with threshold K and the ThresholdFilter until the k - greater
// lowest-index elements equal to K are out; phase B emits the larger keys after that prefix:
// from `larger` (every element with key > K, in index order) when given, else by a pass with
// threshold K + 1. Both phases run the vectorised candidate pass on slices.
template <typename IndexT>
void emit_from_tensor(ConstTensorView in, std::size_t k, KthKey kth,
                      const CandidateList<IndexT>* larger, Emitter<IndexT>& emitter) {
  ThresholdFilter<IndexT> filter{emitter, kth.key, k - kth.greater};
  constexpr std::size_t kSlice = kConvertBlock;
  auto slice_index = scratch<IndexT>(kSlice + kTopkCollectSlack);
  auto slice_bits = scratch<std::uint32_t>(kSlice + kTopkCollectSlack);
  for_each_f32_block(in, [&](const float* block, std::size_t first, std::size_t count) {
    for (std::size_t begin = 0; begin < count && emitter.written < k; begin += kSlice) {
      const std::size_t length = std::min(kSlice, count - begin);
      const std::uint64_t slice_first = first + begin;
      if (filter.equal_left == 0 && larger != nullptr) {
        // Phase B from the list: its entries at or after this slice.
        const IndexT* const list_begin = larger->index.get();
        const IndexT* const list_end = list_begin + larger->count;
        const IndexT* entry =
            std::lower_bound(list_begin, list_end, static_cast<IndexT>(slice_first));
        for (; entry != list_end; ++entry)
          emitter.emit(*entry, larger->bits[static_cast<std::size_t>(entry - list_begin)]);
        return false;
      }
      // Phase A: threshold K through the filter. Phase B without a list: threshold K + 1
      // (0x80000000 when K is the largest key: nothing qualifies).
      const std::uint32_t threshold = filter.equal_left > 0 ? kth.key : kth.key + 1;
      const std::size_t found =
          collect_dispatch(block + begin, length, threshold, static_cast<IndexT>(slice_first),
                           slice_index.get(), slice_bits.get(), kSlice);
      for (std::size_t j = 0; j < found; ++j) filter.offer(slice_index[j], slice_bits[j]);
    }
    return emitter.written < k;
  });
}

// Step 3: the exact top-k among at least k candidates that include every element with key >= K.
template <typename IndexT>
void select_among_candidates(const CandidateList<IndexT>& candidates, std::size_t k,
                             Emitter<IndexT>& emitter) {
  if (candidates.count == k) {
    for (std::size_t j = 0; j < k; ++j) emitter.emit(candidates.index[j], candidates.bits[j]);
    return;
  }
  const KthKey kth =
      kth_largest_key([&](auto&& sink) { sink(candidates.bits.get(), candidates.count); }, k);
  ThresholdFilter<IndexT> filter{emitter, kth.key, k - kth.greater};
  for (std::size_t j = 0; j < candidates.count && emitter.written < k; ++j)
    filter.offer(candidates.index[j], candidates.bits[j]);
}

// Step 5: radix select over the whole tensor. The top-digit histogram says exactly how many
// elements lie at or above the bin holding K; when they are few enough (at most
// max(capacity, n / 8), which bounds the scratch), one pass collects them and step 3 finishes
// (path radix_bin). Otherwise the two lower digits are refined over the tensor too and a final
// pass emits the result (path full_radix).
template <typename IndexT>
TopkPath select_by_radix(ConstTensorView in, std::size_t k, std::size_t capacity,
                         Emitter<IndexT>& emitter) {
  const auto visit_tensor = [&](auto&& sink) {
    for_each_f32_block(in, [&](const float* block, std::size_t, std::size_t count) {
      sink(block, count);
      return true;
    });
  };
  RadixSelect radix(k);
  radix.refine(visit_tensor);
  const std::uint64_t at_or_above = radix.greater() + radix.in_bin();
  if (at_or_above <= std::max<std::uint64_t>(capacity, in.count / 8)) {
    CandidateList<IndexT> candidates(static_cast<std::size_t>(at_or_above));
    candidates.collect(in, radix.bin_floor());
    GZ_REQUIRE(candidates.count == at_or_above, ErrorCode::internal, "topk: the pass found ",
               candidates.count, " elements at or above key ", radix.bin_floor(), ", the histogram ",
               at_or_above);
    select_among_candidates(candidates, k, emitter);
    return TopkPath::radix_bin;
  }
  for (int level = 1; level < kTopkDigitLevels; ++level) radix.refine(visit_tensor);
  emit_from_tensor<IndexT>(in, k, radix.result(), nullptr, emitter);
  return TopkPath::full_radix;
}

}  // namespace

std::size_t topk_collect(const float* values, std::size_t count, std::uint32_t threshold,
                         std::uint32_t first_index, std::uint32_t* index_out,
                         std::uint32_t* bits_out, std::size_t capacity) noexcept {
  return collect_dispatch(values, count, threshold, first_index, index_out, bits_out, capacity);
}

std::size_t topk_collect(const float* values, std::size_t count, std::uint32_t threshold,
                         std::uint64_t first_index, std::uint64_t* index_out,
                         std::uint32_t* bits_out, std::size_t capacity) noexcept {
  return collect_dispatch(values, count, threshold, first_index, index_out, bits_out, capacity);
}

std::size_t topk_candidate_capacity(std::size_t n, std::uint64_t sample_rank) noexcept {
  if (n <= kTopkSampleAllCount) return n;
  const std::uint64_t s = topk_sample_count(n);
  const std::uint64_t per_sample = (n + s - 1) / s;  // elements each sample element stands for
  const std::uint64_t room = (n - 4096) / 2;          // 2 * r * per_sample + 4096 <= n iff ...
  if (sample_rank > room / per_sample) return n;
  return std::min<std::uint64_t>(n, 2 * sample_rank * per_sample + 4096);
}

namespace {

// Steps 1 to 5 (compressors/topk/topk_cpu.h) for 0 < k < n on the tensor `in`. The two hooks let
// the fused error feedback form `in` during step 2: `sample()` returns step 1's sample keys of
// `in` as it will be; `first_pass(candidates, threshold, collect)` runs step 2, leaving `in` in
// its final state, with collect = false when the pass is known to overflow (then only
// candidates.count = kTopkCollectOverflow is required of it).
template <typename IndexT, typename Sample, typename FirstPass>
TopkResult select_in_steps(ConstTensorView in, std::size_t k, const TopkOptions& options,
                           Emitter<IndexT>& emitter, Sample&& sample, FirstPass&& first_pass) {
  const std::size_t n = in.count;
  TopkResult result;

  // Step 1: the sampled threshold.
  const std::uint64_t rank = topk_sample_rank(k, n, options.approx);
  {
    const std::vector<std::uint32_t> keys = sample();
    if (rank <= keys.size()) {
      result.threshold =
          kth_largest_key([&](auto&& sink) { sink(keys.data(), keys.size()); }, rank).key;
    }
  }

  // Step 2: the candidate pass. When the threshold is 0 every element qualifies: it could only
  // overflow.
  const std::size_t capacity = topk_candidate_capacity(n, rank);
  CandidateList<IndexT> candidates(capacity);
  first_pass(candidates, result.threshold, !(result.threshold == 0 && capacity < n));
  result.candidates = candidates.count;

  if (!candidates.overflowed() && candidates.count >= k) {
    select_among_candidates(candidates, k, emitter);  // step 3
    result.path = TopkPath::candidates;
  } else if (options.approx && !candidates.overflowed() && candidates.count >= (k + 1) / 2) {
    // Approx: the candidates are the exact top-`count` set; accept them.
    for (std::size_t j = 0; j < candidates.count; ++j)
      emitter.emit(candidates.index[j], candidates.bits[j]);
    result.path = TopkPath::approx_accepted;
  } else if (candidates.overflowed()) {
    // Step 4: more than capacity >= k elements have key >= t, so K >= t. Collect key > t.
    candidates.collect(in, result.threshold + 1);
    if (!candidates.overflowed() && candidates.count >= k) {
      select_among_candidates(candidates, k, emitter);
      result.path = TopkPath::candidates;
    } else if (!candidates.overflowed()) {
      // Fewer than k keys above t and at least k at or above it: K = t.
      emit_from_tensor(in, k, KthKey{result.threshold, candidates.count}, &candidates, emitter);
      result.path = TopkPath::tie_class;
    }
  }
  if (result.path == TopkPath::empty) {
    candidates = CandidateList<IndexT>(0);  // release the scratch first
    result.path = select_by_radix(in, k, capacity, emitter);  // step 5
  }
  result.count = emitter.written;
  GZ_REQUIRE(result.count == k || result.path == TopkPath::approx_accepted, ErrorCode::internal,
             "topk_select: selected ", result.count, " entries, wanted ", k);
  return result;
}

void require_selectable(std::size_t n, std::size_t k, std::size_t index_bytes, bool has_data) {
  GZ_REQUIRE(k <= n, ErrorCode::invalid_argument, "topk_select: k = ", k, " exceeds the ", n,
             " elements");
  GZ_REQUIRE(index_bytes == 8 || n <= (std::uint64_t{1} << 32), ErrorCode::invalid_argument,
             "topk_select: ", n, " elements need 64-bit indices");
  GZ_REQUIRE(has_data || n == 0, ErrorCode::invalid_argument, "topk_select: null data for ", n,
             " elements");
}

// e[i] = g[i] + e[i] for i < count; true when some sum is NaN or Inf. Branch-free so that it
// vectorises.
bool add_into(const float* g, float* e, std::size_t count) noexcept {
  std::uint32_t non_finite = 0;
  for (std::size_t i = 0; i < count; ++i) {
    e[i] = g[i] + e[i];
    non_finite |= static_cast<std::uint32_t>(kernels::f32_bits_nonfinite(float_bits(e[i])));
  }
  return non_finite != 0;
}

}  // namespace

template <typename IndexT>
TopkResult topk_select(ConstTensorView in, std::size_t k, const TopkOptions& options,
                       IndexT* index_out, float* value_out) {
  require_selectable(in.count, k, sizeof(IndexT), in.data != nullptr);
  Emitter<IndexT> emitter{index_out, value_out};
  if (k == 0) return TopkResult{};
  if (k == in.count) {
    emit_all(in, emitter);
    return TopkResult{in.count, TopkPath::all, 0, 0};
  }
  return select_in_steps(
      in, k, options, emitter, [&] { return sample_keys(in, options); },
      [&](CandidateList<IndexT>& candidates, std::uint32_t threshold, bool collect) {
        if (collect) candidates.collect(in, threshold);
        else candidates.count = kTopkCollectOverflow;
      });
}

template <typename IndexT>
TopkResult topk_select_with_feedback(const float* g, float* e, std::size_t n, std::size_t k,
                                     const TopkOptions& options, IndexT* index_out,
                                     float* value_out, bool& any_non_finite) {
  require_selectable(n, k, sizeof(IndexT), g != nullptr && e != nullptr);
  const ConstTensorView corrected{e, n, DType::f32, Device{}};
  if (k == 0 || k == n || n <= kTopkSampleAllCount) {
    // Nothing to gain from fusing (k == 0 still owes the residual its g), or the sample is the
    // whole tensor: form g' first.
    any_non_finite = add_into(g, e, n);
    return topk_select<IndexT>(corrected, k, options, index_out, value_out);
  }
  any_non_finite = false;
  Emitter<IndexT> emitter{index_out, value_out};
  // Step 1 reads g + e at the sampled runs; the sum is the same f32 add as the pass's.
  const auto sample = [&] {
    return sample_run_keys(
        n, options,
        [&](std::uint64_t start) {
          __builtin_prefetch(g + start);
          __builtin_prefetch(g + start + kTopkSampleRun - 1);
          __builtin_prefetch(e + start);
          __builtin_prefetch(e + start + kTopkSampleRun - 1);
        },
        [&](std::uint64_t start, float* run) {
          for (std::uint64_t i = 0; i < kTopkSampleRun; ++i) run[i] = g[start + i] + e[start + i];
        });
  };
  // Step 2 with the adds inside: on AVX2 in the candidate pass's own registers; otherwise
  // block by block, the add writing a block of g' into e and the candidate pass reading it
  // back while it is still in L1. After an overflow the adds go on without collecting.
  const auto first_pass = [&](CandidateList<IndexT>& candidates, std::uint32_t threshold,
                              bool collect) {
    if (!collect) {
      any_non_finite = add_into(g, e, n);
      candidates.count = kTopkCollectOverflow;
      return;
    }
    if (active_isa() == Isa::avx2 && threshold <= kTopkKeyMask) {
      candidates.count = detail::topk_add_collect_avx2(
          g, e, n, threshold, IndexT{0}, candidates.index.get(), candidates.bits.get(),
          candidates.capacity, any_non_finite);
      return;
    }
    constexpr std::size_t kBlock = 4096;
    candidates.count = 0;
    bool non_finite = false;
    for (std::size_t begin = 0; begin < n; begin += kBlock) {
      const std::size_t length = std::min(kBlock, n - begin);
      non_finite |= add_into(g + begin, e + begin, length);
      if (candidates.overflowed()) continue;
      const std::size_t added = collect_dispatch(
          e + begin, length, threshold, static_cast<IndexT>(begin),
          candidates.index.get() + candidates.count, candidates.bits.get() + candidates.count,
          candidates.capacity - candidates.count);
      candidates.count =
          added == kTopkCollectOverflow ? kTopkCollectOverflow : candidates.count + added;
    }
    any_non_finite = non_finite;
  };
  return select_in_steps(corrected, k, options, emitter, sample, first_pass);
}

template TopkResult topk_select<std::uint32_t>(ConstTensorView, std::size_t, const TopkOptions&,
                                               std::uint32_t*, float*);
template TopkResult topk_select<std::uint64_t>(ConstTensorView, std::size_t, const TopkOptions&,
                                               std::uint64_t*, float*);
template TopkResult topk_select_with_feedback<std::uint32_t>(const float*, float*, std::size_t,
                                                             std::size_t, const TopkOptions&,
                                                             std::uint32_t*, float*, bool&);
template TopkResult topk_select_with_feedback<std::uint64_t>(const float*, float*, std::size_t,
                                                             std::size_t, const TopkOptions&,
                                                             std::uint64_t*, float*, bool&);

}  // namespace gradzip::kernels::cpu
