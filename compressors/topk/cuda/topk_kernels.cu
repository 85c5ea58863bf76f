// CUDA top-k selection (algorithm and contract: compressors/topk/cuda/topk_kernels.h; planning and
// workspace layout: compressors/topk/cuda/topk_plan.h). The element math (keys, digits, sample
// positions and ranks) is compressors/topk/topk_math.h, shared with the CPU codec.
//
// Control flow lives on the device: the host launches a fixed sequence of kernels for a given
// (n, k, options), and each reads TopkDeviceState to learn whether and on what it works
// (kSourceNone: return at once). Every count is an integer; the atomics add integer counts into
// histograms and hand out tile tickets, and no output position depends on which block ran
// what when, so every run writes the same bytes.
//
// Compactions (steps 2, 4 and 6 of compressors/topk/cuda/topk_kernels.h), two variants (KernelVariant):
//  - fast, one pass: one_pass_kernel. Blocks take tiles by an atomic ticket (so a tile's
//    predecessors are all held by running blocks), load the tile, count it (block scan), and
//    warp 0 publishes the count and sums the predecessors' counts by decoupled look-back over
//    the TopkTileStatus records of the workspace (zeroed by a cudaMemsetAsync at the start of
//    every call); then the block writes its kept entries. The candidate pass writes positions
//    below the buffer's capacity only and its last tile leaves the total c in the state for the
//    decision. Index arithmetic: compressors/topk/cuda/topk_plan.h (tested on the host).
//  - reference, two passes: count_kernel per tile, CUB exclusive scans of the counts,
//    write_kernel (which skips tiles with nothing to keep).
#include <cuda_runtime.h>

#include <cuda/atomic>

#include <cstddef>
#include <type_traits>

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "compressors/topk/cuda/topk_kernels.h"
#include "compressors/topk/cuda/topk_plan.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"
#include "compressors/topk/topk_math.h"

namespace gradzip::kernels::cuda {
namespace {

constexpr std::uint64_t kNeedAll = kTopkNeedAll;  // keep every key equal to the threshold
constexpr unsigned kWarpThreads = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr unsigned kThreads = kTopkBlockThreads;
constexpr unsigned kItems = kTopkItemsPerThread;
constexpr unsigned kHistogramUnroll = 4;
constexpr unsigned kChooseItems = kTopkHistogramBins / kThreads;  // 8 bins per thread

enum Source : std::uint32_t {
  kSourceNone = 0,        // the step does not run
  kSourceSample = 1,      // the sample keys
  kSourceTensor = 2,      // d_in[0, n), index = position
  kSourceCandidates = 3,  // the candidate list (index, f32 bits), state.candidates entries
};

// A compaction: keep every key > threshold, and the first `need` keys == threshold in index
// order (kNeedAll: all of them), from `source`.
struct Rule {
  std::uint32_t source;
  std::uint32_t threshold;
  std::uint64_t need;
};

struct TopkDeviceState {
  // The radix select in progress (sample select, then the main select).
  std::uint32_t select_source;
  std::uint32_t select_key;        // digits chosen so far (lower digits 0)
  std::uint64_t select_count;      // keys of a list source
  std::uint64_t select_k;          // rank wanted (1-based)
  std::uint64_t select_remaining;  // rank within the chosen prefix
  std::uint64_t select_greater;    // keys above the chosen prefix
  std::uint32_t sample_threshold;  // t
  std::uint32_t failed;            // internal error: a select ran out of keys
  std::uint64_t candidates;        // c = #(key >= t)
  std::uint64_t entries;           // m
  Rule rules[2];                   // 0: candidate pass over the tensor, 1: final compaction
  // One-pass compactions (fast variant), per rule: the next tile ticket, and the kept-rule
  // counts of the whole source (keys > T, keys == T), written by the block of the last tile.
  unsigned long long tickets[2];
  std::uint64_t pass_greater[2];
  std::uint64_t pass_equal[2];
};
static_assert(sizeof(TopkDeviceState) <= kTopkStateBytes, "state does not fit its region");
static_assert(std::is_standard_layout_v<TopkDeviceState>, "run_select takes offsetof its fields");

template <typename IndexT>
struct Buffers {
  const float* in;
  std::uint64_t n;
  std::uint64_t tiles;  // count arrays hold tiles + 1 entries
  TopkDeviceState* state;
  unsigned long long* histogram;
  std::uint32_t* sample;
  std::uint64_t* gt_counts;
  std::uint64_t* eq_counts;
  std::uint64_t* gt_offsets;
  std::uint64_t* eq_offsets;
  IndexT* candidate_index;
  std::uint32_t* candidate_bits;
  std::uint64_t candidate_capacity;  // entries the candidate buffer holds
  TopkTileStatus* tile_status;       // fast: 2 * tiles records (rule i's at i * tiles)
};

// Where the payload goes: indices at `payload`, values after `entries` indices.
struct PayloadOut {
  std::byte* payload;
  bool half_values;
  bool aligned;  // payload is aligned to the index width (then every store is aligned)
};

template <typename T>
__device__ __forceinline__ void store(std::byte* at, T value, bool aligned) {
  if (aligned) detail::store_word<T, true>(at, 0, value);
  else detail::store_word<T, false>(at, 0, value);
}

template <typename IndexT>
__device__ __forceinline__ void store_entry(const PayloadOut& out, std::uint64_t entries,
                                            std::uint64_t position, std::uint64_t index,
                                            std::uint32_t bits) {
  store(out.payload + position * sizeof(IndexT), static_cast<IndexT>(index), out.aligned);
  std::byte* const values = out.payload + entries * sizeof(IndexT);
  if (out.half_values) {
    store(values + position * 2, f32_to_f16_bits(bits_float(bits)), out.aligned);
  } else {
    store(values + position * 4, bits, out.aligned);
  }
}

// ---- setup, sample --------------------------------------------------------------------------

__global__ void setup_kernel(TopkDeviceState* state, unsigned long long* histogram,
                             bool sample_used, std::uint64_t sample_count,
                             std::uint64_t sample_rank) {
  for (unsigned bin = threadIdx.x; bin < kTopkHistogramBins; bin += blockDim.x) histogram[bin] = 0;
  if (threadIdx.x != 0) return;
  TopkDeviceState s{};
  s.select_source = sample_used ? kSourceSample : kSourceNone;
  s.select_count = sample_count;
  s.select_k = sample_rank;
  s.select_remaining = sample_rank;
  s.rules[0] = Rule{kSourceTensor, 0, kNeedAll};  // t = 0 unless the sample select sets it
  s.rules[1] = Rule{kSourceNone, 0, kNeedAll};
  *state = s;
}

// Keys of the sample (compressors/topk/topk_math.h): the whole tensor up to kTopkSampleAllCount, else
// kTopkSampleRun consecutive elements of each of kTopkSampleGroups segments.
__global__ void sample_kernel(const float* in, std::uint64_t n, std::uint64_t sample_count,
                              std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                              std::uint32_t* sample) {
  for (std::uint64_t j = detail::global_thread(); j < sample_count; j += detail::grid_threads()) {
    std::uint64_t position = j;
    if (n > kTopkSampleAllCount) {
      position = topk_sample_run_start(n, j / kTopkSampleRun, seed, step, tensor_id) +
                 j % kTopkSampleRun;
    }
    sample[j] = topk_key(in[position]);
  }
}

// ---- radix select ---------------------------------------------------------------------------

template <typename LoadKey>
__device__ __forceinline__ void histogram_loop(LoadKey load_key, std::uint64_t count, int level,
                                               int shift, std::uint32_t wanted,
                                               std::uint32_t* counts) {
  const std::uint64_t chunk = std::uint64_t{blockDim.x} * kHistogramUnroll;
  for (std::uint64_t base = blockIdx.x * chunk; base < count; base += gridDim.x * chunk) {
    std::uint32_t keys[kHistogramUnroll];
#pragma unroll
    for (unsigned q = 0; q < kHistogramUnroll; ++q) {
      const std::uint64_t i = base + q * blockDim.x + threadIdx.x;
      keys[q] = i < count ? load_key(i) : 0xFFFFFFFFu;  // 0xFFFFFFFF: no key, never matches
    }
#pragma unroll
    for (unsigned q = 0; q < kHistogramUnroll; ++q) {
      if (keys[q] != 0xFFFFFFFFu && (keys[q] >> shift) == wanted)
        atomicAdd(&counts[topk_key_digit(keys[q], level)], 1u);
    }
  }
}

// Histogram of digit `level` of the keys whose higher digits equal the chosen prefix, added
// into the global histogram (which the choose kernel reads and clears).
template <typename IndexT>
__global__ void __launch_bounds__(kThreads) histogram_kernel(Buffers<IndexT> b, int level) {
  __shared__ std::uint32_t counts[kTopkHistogramBins];
  const TopkDeviceState* const state = b.state;
  const std::uint32_t source = state->select_source;
  if (source == kSourceNone) return;
  const std::uint64_t count = source == kSourceTensor ? b.n : state->select_count;
  // As the CPU's RadixSelect: the prefix is the digits above this level (none at level 0:
  // keys are < 2^31, so key >> 31 == 0 == wanted).
  const int shift = level == 0 ? 31 : topk_digit_shift(level - 1);
  const std::uint32_t wanted = state->select_key >> shift;
  const std::uint32_t bins = topk_digit_bins(level);
  for (unsigned bin = threadIdx.x; bin < bins; bin += blockDim.x) counts[bin] = 0;
  __syncthreads();
  if (source == kSourceSample) {
    const std::uint32_t* const keys = b.sample;
    histogram_loop([keys](std::uint64_t i) { return keys[i]; }, count, level, shift, wanted, counts);
  } else if (source == kSourceTensor) {
    const float* const in = b.in;
    histogram_loop([in](std::uint64_t i) { return topk_key(in[i]); }, count, level, shift, wanted,
                   counts);
  } else {
    const std::uint32_t* const bits = b.candidate_bits;
    histogram_loop([bits](std::uint64_t i) { return topk_key_of_bits(bits[i]); }, count, level,
                   shift, wanted, counts);
  }
  __syncthreads();
  for (unsigned bin = threadIdx.x; bin < bins; bin += blockDim.x) {
    if (counts[bin] != 0) atomicAdd(&b.histogram[bin], static_cast<unsigned long long>(counts[bin]));
  }
}

// One block: picks the bin of digit `level` that holds the wanted rank (the CPU's loop from the
// top bin down, as a suffix sum), updates the select state and clears the histogram. After the
// last level, phase 0 (sample select) sets the threshold t; phase 1 (main select) sets the
// final rule: keys > K, and `remaining` keys == K.
__global__ void __launch_bounds__(kThreads) choose_kernel(TopkDeviceState* state,
                                                          unsigned long long* histogram, int level,
                                                          int phase) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int found;
  if (state->select_source == kSourceNone) return;
  const std::uint64_t remaining = level == 0 ? state->select_k : state->select_remaining;
  const std::uint64_t greater = level == 0 ? 0 : state->select_greater;
  const std::uint32_t key = level == 0 ? 0 : state->select_key;
  if (threadIdx.x == 0) found = 0;
  // Thread t holds bins 2047 - 8t, 2047 - 8t - 1, ...: the inclusive scan is the suffix sum.
  unsigned long long counts[kChooseItems];
  unsigned long long at_or_above[kChooseItems];
#pragma unroll
  for (unsigned q = 0; q < kChooseItems; ++q)
    counts[q] = histogram[kTopkHistogramBins - 1 - (threadIdx.x * kChooseItems + q)];
  __syncthreads();  // every thread has read the state and the histogram
  Scan(scan_storage).InclusiveSum(counts, at_or_above);
#pragma unroll
  for (unsigned q = 0; q < kChooseItems; ++q) {
    const std::uint32_t bin = kTopkHistogramBins - 1 - (threadIdx.x * kChooseItems + q);
    const std::uint64_t above = at_or_above[q] - counts[q];
    if (at_or_above[q] >= remaining && above < remaining) {  // exactly one bin (counts > 0)
      const std::uint32_t chosen = key | (bin << topk_digit_shift(level));
      state->select_key = chosen;
      state->select_remaining = remaining - above;
      state->select_greater = greater + above;
      if (level == kTopkDigitLevels - 1) {
        if (phase == 0) {
          state->sample_threshold = chosen;
          state->rules[0].threshold = chosen;
        } else {
          state->rules[1].threshold = chosen;
          state->rules[1].need = remaining - above;
        }
      }
      found = 1;
    }
    histogram[bin] = 0;
  }
  __syncthreads();
  if (threadIdx.x == 0 && found == 0) state->failed = 1;
}

// ---- candidate count and decision -----------------------------------------------------------

// Per tile of kTopkTile source entries (tiles [0, b.tiles], the ones past the source count 0):
// the keys > rule threshold and == rule threshold.
template <typename IndexT>
__global__ void __launch_bounds__(kThreads) count_kernel(Buffers<IndexT> b, int rule_index) {
  using Reduce = cub::BlockReduce<std::uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage reduce_storage;
  const TopkDeviceState* const state = b.state;
  const Rule rule = state->rules[rule_index];
  if (rule.source == kSourceNone) return;
  const std::uint64_t count = rule.source == kSourceTensor ? b.n : state->candidates;
  for (std::uint64_t tile = blockIdx.x; tile <= b.tiles; tile += gridDim.x) {
    const std::uint64_t base = tile * kTopkTile;
    // Packed counts: (keys > T) << 16 | (keys == T); at most kTopkTile = 4096 each.
    std::uint32_t packed = 0;
    if (base < count) {
#pragma unroll
      for (unsigned q = 0; q < kItems; ++q) {
        const std::uint64_t i = base + q * kThreads + threadIdx.x;
        if (i < count) {
          const std::uint32_t key = rule.source == kSourceTensor ? topk_key(b.in[i])
                                                                 : topk_key_of_bits(b.candidate_bits[i]);
          packed += (key > rule.threshold ? (1u << 16) : 0u) + (key == rule.threshold ? 1u : 0u);
        }
      }
    }
    const std::uint32_t total = Reduce(reduce_storage).Sum(packed);
    if (threadIdx.x == 0) {
      b.gt_counts[tile] = total >> 16;
      b.eq_counts[tile] = total & 0xFFFFu;
    }
    __syncthreads();  // reduce_storage is reused by the next tile
  }
}

// One thread, after the candidate count (reference: after its scans; greater_total and
// equal_total point at the last exclusive sums; fast: at the one-pass totals in the state): c,
// whether approx accepts the candidates, where the main select and the final compaction read
// from, and m.
__global__ void decide_kernel(TopkDeviceState* state, const std::uint64_t* greater_total,
                              const std::uint64_t* equal_total, std::uint64_t k, bool approx,
                              std::uint64_t cpu_capacity, std::uint64_t gpu_capacity) {
  TopkDeviceState& s = *state;
  const std::uint64_t c = *greater_total + *equal_total;
  s.candidates = c;
  const TopkDecision decision = topk_decide(c, k, approx, cpu_capacity, gpu_capacity);
  const bool accept = decision.accept;
  const bool use_candidates = decision.use_candidates;
  const std::uint32_t source = use_candidates ? kSourceCandidates : kSourceTensor;
  s.rules[0].source = use_candidates ? kSourceTensor : kSourceNone;
  s.entries = decision.entries;
  s.select_key = 0;
  s.select_greater = 0;
  s.select_k = k;
  s.select_remaining = k;
  s.select_count = c;
  if (accept) {
    s.select_source = kSourceNone;
    s.rules[1] = Rule{source, s.sample_threshold, kNeedAll};  // every key >= t
  } else if (use_candidates && c == k) {
    s.select_source = kSourceNone;
    s.rules[1] = Rule{source, 0, kNeedAll};  // every candidate
  } else {
    s.select_source = source;
    s.rules[1] = Rule{source, 0, kNeedAll};  // threshold and need: the main select's last level
  }
}

// ---- compaction -----------------------------------------------------------------------------

// The block-wide CUB primitives of the tile passes (write_kernel, one_pass_kernel): loads of
// kItems per thread and a block scan, sharing one shared-memory union.
template <typename IndexT>
struct TileWork {
  using LoadFloat = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using LoadBits = cub::BlockLoad<std::uint32_t, kThreads, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using LoadIndex = cub::BlockLoad<IndexT, kThreads, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Scan = cub::BlockScan<std::uint32_t, kThreads>;
  union Storage {
    typename LoadFloat::TempStorage load_float;
    typename LoadBits::TempStorage load_bits;
    typename LoadIndex::TempStorage load_index;
    typename Scan::TempStorage scan;
  };

  // This thread's kItems source entries of the tile at `base` (`valid` of them real, blocked
  // arrangement): the key bits of the tensor's values (from_tensor) or of the candidate list,
  // and, from the candidate list, their indices. Ends with a barrier, so `storage` is free.
  __device__ __forceinline__ static void load(Storage& storage, const Buffers<IndexT>& b,
                                              std::uint64_t base, int valid, bool from_tensor,
                                              std::uint32_t (&bits)[kItems], IndexT (&index)[kItems]) {
    if (from_tensor) {
      float values[kItems];
      LoadFloat(storage.load_float).Load(b.in + base, values, valid, 0.0f);
#pragma unroll
      for (unsigned q = 0; q < kItems; ++q) bits[q] = float_bits(values[q]);
    } else {
      LoadBits(storage.load_bits).Load(b.candidate_bits + base, bits, valid, 0u);
      __syncthreads();
      LoadIndex(storage.load_index).Load(b.candidate_index + base, index, valid, IndexT{0});
    }
    __syncthreads();
  }
};

// Stable compaction of the rule's source by tiles: an entry's position is the number of kept
// entries before it, (keys > T before it) + min(keys == T before it, need), from the scanned
// tile counts and a block scan inside the tile. kToPayload: write the payload (rule 1), else
// the candidate list (rule 0).
template <typename IndexT, bool kToPayload>
__global__ void __launch_bounds__(kThreads)
    write_kernel(Buffers<IndexT> b, int rule_index, PayloadOut out) {
  using Tile = TileWork<IndexT>;
  using Scan = typename Tile::Scan;
  __shared__ typename Tile::Storage storage;
  const TopkDeviceState* const state = b.state;
  const Rule rule = state->rules[rule_index];
  if (rule.source == kSourceNone) return;
  const std::uint64_t count = rule.source == kSourceTensor ? b.n : state->candidates;
  const std::uint64_t entries = state->entries;
  for (std::uint64_t tile = blockIdx.x; tile < b.tiles; tile += gridDim.x) {
    const std::uint64_t base = tile * kTopkTile;
    if (base >= count) break;
    const std::uint64_t gt_first = b.gt_offsets[tile];
    const std::uint64_t eq_first = b.eq_offsets[tile];
    const bool any_greater = b.gt_offsets[tile + 1] != gt_first;
    const bool any_equal = b.eq_offsets[tile + 1] != eq_first && eq_first < rule.need;
    if (!any_greater && !any_equal) continue;  // nothing kept here: the tile is not read
    const std::uint64_t left = count - base;
    const int valid = static_cast<int>(left < kTopkTile ? left : kTopkTile);
    std::uint32_t bits[kItems];
    IndexT index[kItems];
    Tile::load(storage, b, base, valid, rule.source == kSourceTensor, bits, index);
    if (rule.source == kSourceTensor) {
#pragma unroll
      for (unsigned q = 0; q < kItems; ++q) index[q] = static_cast<IndexT>(base + threadIdx.x * kItems + q);
    }
    std::uint32_t packed = 0;
#pragma unroll
    for (unsigned q = 0; q < kItems; ++q) {
      if (static_cast<int>(threadIdx.x * kItems + q) < valid) {
        const std::uint32_t key = topk_key_of_bits(bits[q]);
        packed += (key > rule.threshold ? (1u << 16) : 0u) + (key == rule.threshold ? 1u : 0u);
      }
    }
    std::uint32_t before = 0;
    Scan(storage.scan).ExclusiveSum(packed, before);
    std::uint64_t greater = gt_first + (before >> 16);
    std::uint64_t equal = eq_first + (before & 0xFFFFu);
#pragma unroll
    for (unsigned q = 0; q < kItems; ++q) {
      if (static_cast<int>(threadIdx.x * kItems + q) >= valid) continue;
      const std::uint32_t key = topk_key_of_bits(bits[q]);
      std::uint64_t position = kNeedAll;
      if (key > rule.threshold) {
        position = greater + (equal < rule.need ? equal : rule.need);
        ++greater;
      } else if (key == rule.threshold) {
        if (equal < rule.need) position = greater + equal;
        ++equal;
      }
      if (position == kNeedAll) continue;
      if constexpr (kToPayload) {
        store_entry<IndexT>(out, entries, position, index[q], bits[q]);
      } else {
        b.candidate_index[position] = index[q];
        b.candidate_bits[position] = bits[q];
      }
    }
    __syncthreads();  // storage is reused by the next tile
  }
}

// ---- one-pass compaction (fast variant) -----------------------------------------------------

using DeviceWord = ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>;

__device__ __forceinline__ std::uint64_t load_acquire(std::uint64_t& word) {
  return DeviceWord(word).load(::cuda::memory_order_acquire);
}
__device__ __forceinline__ std::uint64_t load_relaxed(std::uint64_t& word) {
  return DeviceWord(word).load(::cuda::memory_order_relaxed);
}
__device__ __forceinline__ void store_relaxed(std::uint64_t& word, std::uint64_t value) {
  DeviceWord(word).store(value, ::cuda::memory_order_relaxed);
}
__device__ __forceinline__ void store_release(std::uint64_t& word, std::uint64_t value) {
  DeviceWord(word).store(value, ::cuda::memory_order_release);
}

// Inclusive counts first, then (release) the flag: a reader that sees the flag (acquire) sees
// the counts.
__device__ __forceinline__ void publish_inclusive(TopkTileStatus& status, std::uint32_t aggregate,
                                                  TopkCounts inclusive) {
  store_relaxed(status.inclusive_greater, inclusive.greater);
  store_relaxed(status.inclusive_equal, inclusive.equal);
  store_release(status.word, topk_status_word(kTopkTileInclusive, aggregate));
}

__device__ __forceinline__ std::uint64_t warp_sum(std::uint64_t value) {
  auto v = static_cast<unsigned long long>(value);
#pragma unroll
  for (unsigned offset = kWarpThreads / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// Called by the 32 lanes of warp 0 of the block that holds `tile` (statuses: this pass's
// records). Publishes the tile's packed aggregate, walks back over its predecessors (windows of
// 32 tiles, lane L reading tile nearest - L) until a window holds an inclusive tile, publishes
// the tile's inclusive counts and returns its exclusive counts (the same in every lane).
// Every predecessor's block is running (tickets), so each flag it waits for gets set.
__device__ TopkCounts look_back(TopkTileStatus* statuses, std::uint64_t tile,
                                std::uint32_t aggregate) {
  const unsigned lane = threadIdx.x % kWarpThreads;
  const TopkCounts own = topk_unpack_counts(aggregate);
  TopkCounts exclusive;
  if (tile == 0) {
    if (lane == 0) publish_inclusive(statuses[0], aggregate, own);
    return exclusive;
  }
  if (lane == 0) store_relaxed(statuses[tile].word, topk_status_word(kTopkTileAggregate, aggregate));
  std::uint64_t nearest = tile - 1;
  for (;;) {
    const bool reads = topk_lookback_lane_reads(nearest, lane);
    TopkTileStatus* const status = reads ? &statuses[nearest - lane] : nullptr;
    std::uint64_t word = topk_status_word(kTopkTileInclusive, 0);  // lanes past tile 0
    for (;;) {
      if (reads) word = load_acquire(status->word);
      if (__all_sync(kFullWarp, topk_status_flag(word) != kTopkTileUnset)) break;
      __nanosleep(64);
    }
    const unsigned stop = topk_lookback_stop_lane(
        __ballot_sync(kFullWarp, topk_status_flag(word) == kTopkTileInclusive));
    TopkCounts inclusive;
    if (reads && lane == stop) {
      inclusive.greater = load_relaxed(status->inclusive_greater);
      inclusive.equal = load_relaxed(status->inclusive_equal);
    }
    const TopkCounts mine = topk_lookback_lane_counts(lane, stop, word, inclusive);
    exclusive.greater += warp_sum(mine.greater);
    exclusive.equal += warp_sum(mine.equal);
    if (stop < kWarpThreads) break;
    nearest -= kWarpThreads;  // no inclusive tile in the window, so it did not reach tile 0
  }
  if (lane == 0) {
    TopkCounts inclusive = exclusive;
    inclusive.greater += own.greater;
    inclusive.equal += own.equal;
    publish_inclusive(statuses[tile], aggregate, inclusive);
  }
  return exclusive;
}

// The rule's compaction in one pass over its source (tiles of kTopkTile entries, taken by
// ticket in a loop until none is left, so any grid size works). An entry's position is
// topk_keep_position() from the tile's exclusive counts (look-back) and the counts before it in
// the tile (block scan). kToPayload: writes the payload (rule 1, from the tensor or the
// candidates); else the candidate buffer (rule 0, always from the tensor), positions below its
// capacity only. The block of the source's last tile stores the totals in
// state->pass_greater / pass_equal.
// Occupancy: the candidate pass (the hot one) is held to 40 registers, 6 blocks per SM, so
// that other resident blocks keep loading while some wait in their look-back (ptxas, sm_90:
// no spills at either bound).
template <typename IndexT, bool kToPayload>
__global__ void __launch_bounds__(kThreads, kToPayload ? 3 : 6)
    one_pass_kernel(Buffers<IndexT> b, int rule_index, PayloadOut out) {
  using Tile = TileWork<IndexT>;
  using Scan = typename Tile::Scan;
  __shared__ typename Tile::Storage storage;
  __shared__ std::uint64_t shared_tile;
  __shared__ std::uint64_t shared_greater;
  __shared__ std::uint64_t shared_equal;
  TopkDeviceState* const state = b.state;
  const Rule rule = state->rules[rule_index];
  if (rule.source == kSourceNone) return;
  // Rule 0 reads the tensor only: the candidate-source code is compiled out of its kernel.
  const bool from_tensor = !kToPayload || rule.source == kSourceTensor;
  const std::uint64_t count = from_tensor ? b.n : state->candidates;
  const std::uint64_t tiles = topk_tile_count(count);
  const std::uint64_t entries = kToPayload ? state->entries : 0;
  TopkTileStatus* const statuses = b.tile_status + static_cast<std::uint64_t>(rule_index) * b.tiles;
  for (;;) {
    if (threadIdx.x == 0) shared_tile = atomicAdd(&state->tickets[rule_index], 1ull);
    __syncthreads();
    const std::uint64_t tile = shared_tile;
    if (tile >= tiles) break;  // the same for every thread of the block
    const std::uint64_t base = tile * kTopkTile;
    const int valid = static_cast<int>(topk_tile_items(count, tile));
    // Item q of this thread is entry base + first + q of the source (blocked arrangement).
    const std::uint64_t first = std::uint64_t{threadIdx.x} * kItems;
    std::uint32_t bits[kItems];
    IndexT index[kItems];  // candidate source only; the tensor's index is the position
    Tile::load(storage, b, base, valid, from_tensor, bits, index);
    std::uint32_t packed = 0;
#pragma unroll
    for (unsigned q = 0; q < kItems; ++q) {
      if (first + q < static_cast<std::uint64_t>(valid))
        packed += topk_pack_counts(topk_key_of_bits(bits[q]), rule.threshold);
    }
    std::uint32_t before = 0;
    std::uint32_t aggregate = 0;
    Scan(storage.scan).ExclusiveSum(packed, before, aggregate);
    if (threadIdx.x < kWarpThreads) {
      const TopkCounts exclusive = look_back(statuses, tile, aggregate);
      if (threadIdx.x == 0) {
        shared_greater = exclusive.greater;
        shared_equal = exclusive.equal;
        if (tile == tiles - 1) {
          const TopkCounts own = topk_unpack_counts(aggregate);
          state->pass_greater[rule_index] = exclusive.greater + own.greater;
          state->pass_equal[rule_index] = exclusive.equal + own.equal;
        }
      }
    }
    __syncthreads();
    const TopkCounts in_tile = topk_unpack_counts(before);
    TopkCounts running;
    running.greater = shared_greater + in_tile.greater;
    running.equal = shared_equal + in_tile.equal;
#pragma unroll
    for (unsigned q = 0; q < kItems; ++q) {
      if (first + q >= static_cast<std::uint64_t>(valid)) continue;
      const std::uint64_t position =
          topk_keep_position(topk_key_of_bits(bits[q]), rule.threshold, rule.need, running);
      if (position == kTopkNotKept) continue;
      const IndexT entry_index = from_tensor ? static_cast<IndexT>(base + first + q) : index[q];
      if constexpr (kToPayload) {
        store_entry<IndexT>(out, entries, position, entry_index, bits[q]);
      } else if (position < b.candidate_capacity) {
        b.candidate_index[position] = entry_index;
        b.candidate_bits[position] = bits[q];
      }
    }
    __syncthreads();  // storage and the shared words are reused by the next tile
  }
}

__global__ void finish_kernel(const TopkDeviceState* state, std::uint64_t* entries_out) {
  *entries_out = state->failed != 0 ? kNeedAll : state->entries;
}

// k == n: every element in order.
template <typename IndexT>
__global__ void all_kernel(const float* in, std::uint64_t n, PayloadOut out,
                           std::uint64_t* entries_out) {
  const std::uint64_t first = detail::global_thread();
  for (std::uint64_t i = first; i < n; i += detail::grid_threads())
    store_entry<IndexT>(out, n, i, i, float_bits(in[i]));
  if (first == 0 && entries_out != nullptr) *entries_out = n;
}

// ---- host side ------------------------------------------------------------------------------

void check_launch(const char* step, std::uint64_t n, std::uint64_t k) {
  const cudaError_t status = cudaGetLastError();
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported, "cuda.topk_select: ", step,
             " failed for n = ", n, ", k = ", k, ": ", cudaGetErrorString(status));
}

std::size_t scan_temp_bytes(std::uint64_t n) {
  std::size_t bytes = 0;
  const cudaError_t status = cub::DeviceScan::ExclusiveSum(
      nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
      static_cast<std::uint64_t*>(nullptr), static_cast<std::int64_t>(topk_plan_scan_items(n)));
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported,
             "cuda.topk_select: CUB scan size query failed for n = ", n, ": ",
             cudaGetErrorString(status));
  return bytes;
}

TopkPlan plan_for(std::uint64_t n, std::uint64_t k, const TopkCudaOptions& options) {
  GZ_REQUIRE(k <= n, ErrorCode::invalid_argument, "cuda.topk_select: k = ", k, " exceeds the ",
             n, " elements");
  const bool scans = k > 0 && k < n && options.variant == KernelVariant::reference;
  return make_topk_plan(n, k, options.approx, options.half_values, options.variant,
                        scans ? scan_temp_bytes(n) : 0);
}

unsigned multiprocessors() {
  int device = 0;
  int count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0) {
    cudaGetLastError();  // clear it; the launches report a missing device
    return 132;
  }
  return static_cast<unsigned>(count);
}

// Blocks for a grid-stride loop over `work` units, at most `cap`.
unsigned blocks_for(std::uint64_t work, std::uint64_t cap) {
  return detail::clamp_blocks(work, cap);
}

template <typename T>
T* region(std::byte* workspace, const TopkRegion& where) {
  return where.bytes == 0 ? nullptr : reinterpret_cast<T*>(workspace + where.offset);
}

template <typename IndexT>
void run_select(const TopkPlan& plan, const float* d_in, const TopkCudaOptions& options,
                const PayloadOut& out, std::uint64_t* d_entries_out, std::byte* workspace,
                cudaStream_t stream) {
  const std::uint64_t n = plan.n;
  const std::uint64_t k = plan.k;
  const bool one_pass = plan.variant == KernelVariant::fast;
  Buffers<IndexT> b;
  b.in = d_in;
  b.n = n;
  b.tiles = plan.tiles;
  b.state = region<TopkDeviceState>(workspace, plan.state);
  b.histogram = region<unsigned long long>(workspace, plan.histogram);
  b.sample = region<std::uint32_t>(workspace, plan.sample);
  b.gt_counts = region<std::uint64_t>(workspace, plan.gt_counts);
  b.eq_counts = region<std::uint64_t>(workspace, plan.eq_counts);
  b.gt_offsets = region<std::uint64_t>(workspace, plan.gt_offsets);
  b.eq_offsets = region<std::uint64_t>(workspace, plan.eq_offsets);
  b.candidate_index = region<IndexT>(workspace, plan.candidate_index);
  b.candidate_bits = region<std::uint32_t>(workspace, plan.candidate_bits);
  b.candidate_capacity = plan.gpu_capacity;
  b.tile_status = region<TopkTileStatus>(workspace, plan.tile_status);
  void* const scan_temp = workspace + plan.scan_temp.offset;

  const std::uint64_t sms = multiprocessors();
  // Histogram blocks: enough to fill the GPU, and at most 2^30 keys per block (32-bit counts).
  const auto histogram_blocks = [&](std::uint64_t count) {
    const std::uint64_t chunk = std::uint64_t{kThreads} * kHistogramUnroll;
    const std::uint64_t floor_blocks = (count >> 30) + 1;
    const std::uint64_t cap = 4 * sms > floor_blocks ? 4 * sms : floor_blocks;
    return blocks_for((count + chunk - 1) / chunk, cap);
  };
  const unsigned tile_blocks = blocks_for(plan.tiles + 1, 8 * sms);
  // One-pass grids. The candidate pass: a block per tile (up to the launch limit), so that the
  // scheduler keeps as many tiles in flight as fit while some blocks wait in their look-back.
  // The final compaction's source size is known on the device only (usually the candidates, a
  // few tiles): a persistent grid that takes tiles until none is left.
  const unsigned tensor_pass_blocks = blocks_for(plan.tiles, 65535u * 8);
  const unsigned final_pass_blocks = tile_blocks;
  const auto scan = [&](const char* step) {
    const auto items = static_cast<std::int64_t>(plan.tiles + 1);
    std::size_t temp_bytes = plan.scan_temp.bytes;
    cudaError_t status = cub::DeviceScan::ExclusiveSum(scan_temp, temp_bytes, b.gt_counts,
                                                       b.gt_offsets, items, stream);
    if (status == cudaSuccess) {
      status = cub::DeviceScan::ExclusiveSum(scan_temp, temp_bytes, b.eq_counts, b.eq_offsets,
                                             items, stream);
    }
    GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported, "cuda.topk_select: ", step,
               " scan failed for n = ", n, ", k = ", k, ": ", cudaGetErrorString(status));
  };

  // 1. Setup (one-pass: the look-back records start unset) and the sample's threshold t.
  if (one_pass) {
    const cudaError_t status =
        cudaMemsetAsync(b.tile_status, 0, plan.tile_status.bytes, stream);
    GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported,
               "cuda.topk_select: clearing the tile records failed for n = ", n, ", k = ", k,
               ": ", cudaGetErrorString(status));
  }
  setup_kernel<<<1, kThreads, 0, stream>>>(b.state, b.histogram, plan.sample_used,
                                           plan.sample_count, plan.sample_rank);
  check_launch("setup", n, k);
  if (plan.sample_used) {
    sample_kernel<<<blocks_for((plan.sample_count + kThreads - 1) / kThreads, 1024), kThreads, 0,
                    stream>>>(d_in, n, plan.sample_count, options.seed, options.step,
                              options.tensor_id, b.sample);
    check_launch("sample", n, k);
    for (int level = 0; level < kTopkDigitLevels; ++level) {
      histogram_kernel<IndexT><<<histogram_blocks(plan.sample_count), kThreads, 0, stream>>>(b, level);
      choose_kernel<<<1, kThreads, 0, stream>>>(b.state, b.histogram, level, 0);
    }
    check_launch("sample select", n, k);
  }
  // 2.-4. The candidates (key >= t) and c, then the decision. One pass: the candidates are
  // written as they are counted (those that fit the buffer). Reference: count, scan, decide,
  // then write (when they are used).
  if (one_pass) {
    one_pass_kernel<IndexT, false><<<tensor_pass_blocks, kThreads, 0, stream>>>(b, 0, out);
    check_launch("candidate pass", n, k);
    auto* const state_bytes = reinterpret_cast<std::byte*>(b.state);
    decide_kernel<<<1, 1, 0, stream>>>(
        b.state,
        reinterpret_cast<const std::uint64_t*>(state_bytes + offsetof(TopkDeviceState, pass_greater)),
        reinterpret_cast<const std::uint64_t*>(state_bytes + offsetof(TopkDeviceState, pass_equal)),
        k, plan.approx, plan.cpu_capacity, plan.gpu_capacity);
    check_launch("decide", n, k);
  } else {
    count_kernel<IndexT><<<tile_blocks, kThreads, 0, stream>>>(b, 0);
    check_launch("candidate count", n, k);
    scan("candidate count");
    decide_kernel<<<1, 1, 0, stream>>>(b.state, b.gt_offsets + plan.tiles,
                                       b.eq_offsets + plan.tiles, k, plan.approx,
                                       plan.cpu_capacity, plan.gpu_capacity);
    check_launch("decide", n, k);
    write_kernel<IndexT, false><<<tile_blocks, kThreads, 0, stream>>>(b, 0, out);
    check_launch("candidate write", n, k);
  }
  // 5. The k-th key over the candidates or the tensor (skipped when accepted or c == k).
  for (int level = 0; level < kTopkDigitLevels; ++level) {
    histogram_kernel<IndexT><<<histogram_blocks(n), kThreads, 0, stream>>>(b, level);
    choose_kernel<<<1, kThreads, 0, stream>>>(b.state, b.histogram, level, 1);
  }
  check_launch("radix select", n, k);
  // 6. The payload.
  if (one_pass) {
    one_pass_kernel<IndexT, true><<<final_pass_blocks, kThreads, 0, stream>>>(b, 1, out);
    check_launch("payload pass", n, k);
  } else {
    count_kernel<IndexT><<<tile_blocks, kThreads, 0, stream>>>(b, 1);
    check_launch("final count", n, k);
    scan("final count");
    write_kernel<IndexT, true><<<tile_blocks, kThreads, 0, stream>>>(b, 1, out);
    check_launch("payload write", n, k);
  }
  if (d_entries_out != nullptr) {
    finish_kernel<<<1, 1, 0, stream>>>(b.state, d_entries_out);
    check_launch("finish", n, k);
  }
}

template <typename IndexT>
void run_all(const float* d_in, std::uint64_t n, const PayloadOut& out,
             std::uint64_t* d_entries_out, cudaStream_t stream) {
  const std::uint64_t blocks = (n + kThreads - 1) / kThreads;
  all_kernel<IndexT><<<blocks_for(blocks, 65535u * 8), kThreads, 0, stream>>>(d_in, n, out,
                                                                              d_entries_out);
  check_launch("copy of every element", n, n);
}

}  // namespace

std::size_t topk_workspace_bytes(std::uint64_t n, std::uint64_t k, const TopkCudaOptions& options) {
  if (emulated::active()) return emulated::topk_workspace_bytes(n, k, options);
  return plan_for(n, k, options).workspace_bytes;
}

void topk_select(const float* d_in, std::uint64_t n, std::uint64_t k,
                 const TopkCudaOptions& options, std::byte* d_payload,
                 std::uint64_t* d_entries_out, void* d_workspace, std::size_t* workspace_bytes,
                 void* stream) {
  if (emulated::active())
    return emulated::topk_select(d_in, n, k, options, d_payload, d_entries_out, d_workspace,
                                 workspace_bytes, stream);
  GZ_REQUIRE(workspace_bytes != nullptr, ErrorCode::invalid_argument,
             "cuda.topk_select: workspace_bytes is null");
  const TopkPlan plan = plan_for(n, k, options);
  if (d_workspace == nullptr) {
    *workspace_bytes = plan.workspace_bytes;
    return;
  }
  GZ_REQUIRE(*workspace_bytes >= plan.workspace_bytes, ErrorCode::invalid_argument,
             "cuda.topk_select: workspace of ", *workspace_bytes, " bytes, n = ", n, ", k = ", k,
             " needs ", plan.workspace_bytes);
  GZ_REQUIRE(reinterpret_cast<std::uintptr_t>(d_workspace) % kTopkWorkspaceAlign == 0,
             ErrorCode::invalid_argument, "cuda.topk_select: workspace not ",
             kTopkWorkspaceAlign, "-byte aligned");
  GZ_REQUIRE(k == 0 || (d_in != nullptr && d_payload != nullptr), ErrorCode::invalid_argument,
             "cuda.topk_select: null input or payload for n = ", n, ", k = ", k);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (plan.kind == TopkPlanKind::empty) {
    if (d_entries_out != nullptr) {
      const cudaError_t status =
          cudaMemsetAsync(d_entries_out, 0, sizeof(std::uint64_t), cuda_stream);
      GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported,
                 "cuda.topk_select: memset of the entry count failed: ", cudaGetErrorString(status));
    }
    return;
  }
  const PayloadOut out{d_payload, options.half_values,
                       reinterpret_cast<std::uintptr_t>(d_payload) % plan.index_bytes == 0};
  const bool wide = plan.index_bytes == sizeof(std::uint64_t);
  if (plan.kind == TopkPlanKind::all) {
    if (wide) run_all<std::uint64_t>(d_in, n, out, d_entries_out, cuda_stream);
    else run_all<std::uint32_t>(d_in, n, out, d_entries_out, cuda_stream);
    return;
  }
  auto* const workspace = static_cast<std::byte*>(d_workspace);
  if (wide) run_select<std::uint64_t>(plan, d_in, options, out, d_entries_out, workspace, cuda_stream);
  else run_select<std::uint32_t>(plan, d_in, options, out, d_entries_out, workspace, cuda_stream);
}

}  // namespace gradzip::kernels::cuda
