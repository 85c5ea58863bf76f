// Host-side planning of the CUDA top-k selection (compressors/topk/cuda/topk_kernels.h): which path a call
// takes, the candidate capacities, the tiling of the compaction passes and the layout of the
// workspace, for either compaction variant; and the index arithmetic of the one-pass
// compaction (tile items, kept positions, look-back). Plain C++17 with no CUDA dependency, so
// that it is unit-tested on any machine (compressors/topk/tests/test_topk_plan.cpp, which checks the
// layouts, and compressors/topk/tests/test_topk_one_pass.cpp, which runs the one-pass arithmetic tile by
// tile on the host against the CPU codec) and included by topk_cuda.cu.
//
// The selection the GPU makes is decided by these numbers and by the shared element math of
// compressors/topk/topk_math.h only:
//  - exact: the exact top-k under the ordering rule of compressors/topk/topk_math.h;
//  - approx: with t the sampled threshold and c the number of elements with key >= t, the
//    elements with key >= t when c <= topk_plan_cpu_capacity(n, r) and ceil(k/2) <= c < k,
//    else the exact top-k. This is the CPU codec's approx result (compressors/topk/topk_cpu.h: its
//    steps 3-5 all give the exact top-k, only "approx_accepted" gives the candidates), so the
//    payload bytes are the same as the CPU's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernel_variant.h"
#include "compressors/topk/topk_math.h"

namespace gradzip::kernels::cuda {

// Threads per block and elements per thread of the tile-based passes (count and compaction).
inline constexpr unsigned kTopkBlockThreads = 256;
inline constexpr unsigned kTopkItemsPerThread = 16;
inline constexpr std::uint64_t kTopkTile = std::uint64_t{kTopkBlockThreads} * kTopkItemsPerThread;
// Radix histogram: the largest digit range (topk_digit_bins(0)).
inline constexpr std::uint32_t kTopkHistogramBins = 2048;
// Alignment of every workspace region.
inline constexpr std::size_t kTopkWorkspaceAlign = 256;
// Bytes reserved for the device-side state of one call (struct TopkDeviceState in the .cu).
inline constexpr std::size_t kTopkStateBytes = 256;
// The least workspace any plan asks for, also when nothing is selected (k == 0 or k == n). A
// plan never asks for 0 bytes: a caller that allocates what the query says would then pass a
// null workspace, which topk_select takes for a size query, and nothing would run.
inline constexpr std::size_t kTopkMinWorkspaceBytes = kTopkWorkspaceAlign;

// Elements above which payload indices are u64 (compressors/topk/topk_codec.cpp: u32 iff n <= 2^32).
inline constexpr std::uint64_t kTopkMaxNarrowCount = std::uint64_t{1} << 32;

inline constexpr std::size_t topk_index_bytes(std::uint64_t n) noexcept {
  return n > kTopkMaxNarrowCount ? 8 : 4;
}

// Payload bytes of m entries for an n-element tensor (what follows the 32-byte header).
inline constexpr std::size_t topk_payload_bytes(std::uint64_t n, std::uint64_t m,
                                                bool half_values) noexcept {
  return static_cast<std::size_t>(m) * (topk_index_bytes(n) + (half_values ? 2 : 4));
}

// kernels::cpu::topk_candidate_capacity(n, rank), restated here (the CPU header needs C++20):
// part of the approx contract. Tested equal to the CPU function in test_topk_plan.cpp.
inline std::uint64_t topk_plan_cpu_capacity(std::uint64_t n, std::uint64_t sample_rank) noexcept {
  if (n <= kTopkSampleAllCount) return n;
  const std::uint64_t s = topk_sample_count(n);
  const std::uint64_t per_sample = (n + s - 1) / s;
  const std::uint64_t room = (n - 4096) / 2;
  if (sample_rank > room / per_sample) return n;
  const std::uint64_t capacity = 2 * sample_rank * per_sample + 4096;
  return capacity < n ? capacity : n;
}

// The GPU's candidate buffer: the CPU capacity, but at most max(n / 8, kTopkSampleAllCount)
// entries so that the workspace stays bounded for large k. When more candidates come out, the
// GPU selects over the whole tensor instead (same result, more passes).
inline std::uint64_t topk_plan_gpu_capacity(std::uint64_t n, std::uint64_t sample_rank) noexcept {
  const std::uint64_t cpu = topk_plan_cpu_capacity(n, sample_rank);
  std::uint64_t bound = n / 8;
  if (bound < kTopkSampleAllCount) bound = kTopkSampleAllCount;
  return cpu < bound ? cpu : bound;
}

// What the device does once c = #(key >= t) is known (decide_kernel calls this).
struct TopkDecision {
  bool accept = false;          // approx: the c candidates are the result (CPU approx_accepted)
  bool use_candidates = false;  // the result is selected from the candidate buffer
  std::uint64_t entries = 0;    // m
};

// The CPU accepts the candidates (path approx_accepted) iff approx, its candidate pass did not
// overflow (c <= cpu_capacity; a zero threshold with capacity < n counts as an overflow, and
// then c = n > capacity too) and ceil(k/2) <= c < k; every other CPU path gives the exact
// top-k. The candidates (every key >= t) hold the result when accepted or when c >= k; the GPU
// uses them when they fit its buffer. Requires 0 < k < n.
GZ_HOST_DEVICE GZ_INLINE TopkDecision topk_decide(std::uint64_t c, std::uint64_t k, bool approx,
                                                  std::uint64_t cpu_capacity,
                                                  std::uint64_t gpu_capacity) {
  TopkDecision decision;
  decision.accept = approx && c <= cpu_capacity && c < k && c >= k - k / 2;
  decision.use_candidates = (decision.accept || c >= k) && c <= gpu_capacity;
  decision.entries = decision.accept ? c : k;
  return decision;
}

// ---- one-pass compaction (KernelVariant::fast) ------------------------------------------------
//
// A compaction keeps, from a source of `count` keys in index order, every key > T and the
// first `need` keys == T (kTopkNeedAll: all of them), and writes the kept entries in index
// order. The source is cut into tiles of kTopkTile entries; tile j holds entries
// [j * kTopkTile, j * kTopkTile + topk_tile_items(count, j)). An entry's output position is
//   (keys > T before it) + min(keys == T before it, need)
// and "before it" splits into the tiles before its own (the tile's exclusive counts) and the
// entries before it in its tile (a block scan). The one-pass kernel takes tiles in the order of
// an atomically incremented ticket, publishes each tile's own counts (its aggregate) as soon as
// it has counted them, then sums its predecessors' counts walking back from the nearest one in
// windows of 32 (a warp; decoupled look-back): a predecessor that has published its inclusive
// counts ends the walk, one that has published only its aggregate adds that and the walk goes
// on. Then it publishes its own inclusive counts and writes its entries. A tile only waits for
// tiles with a lower ticket, whose blocks are running, so the pass always completes.

// Keep every key equal to the threshold.
inline constexpr std::uint64_t kTopkNeedAll = ~std::uint64_t{0};
// topk_keep_position() of an entry that is not kept.
inline constexpr std::uint64_t kTopkNotKept = ~std::uint64_t{0};

// Counts of kept-rule classes: keys > T, keys == T.
struct TopkCounts {
  std::uint64_t greater = 0;
  std::uint64_t equal = 0;
};

// Tiles covering `count` source entries.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_tile_count(std::uint64_t count) {
  return (count + kTopkTile - 1) / kTopkTile;
}

// Entries of tile `tile` of a `count`-entry source: kTopkTile, fewer in the last (tail) tile,
// 0 past the end.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_tile_items(std::uint64_t count, std::uint64_t tile) {
  if (tile >= topk_tile_count(count)) return 0;
  const std::uint64_t left = count - tile * kTopkTile;
  return static_cast<std::uint32_t>(left < kTopkTile ? left : kTopkTile);
}

// One key's counts, packed as (key > T) << 16 | (key == T). A sum of packed counts over at
// most kTopkTile (4096) keys stays packed: each class fits 16 bits, the sum 32.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_pack_counts(std::uint32_t key, std::uint32_t threshold) {
  return (key > threshold ? (1u << 16) : 0u) + (key == threshold ? 1u : 0u);
}

GZ_HOST_DEVICE GZ_INLINE TopkCounts topk_unpack_counts(std::uint32_t packed) {
  TopkCounts counts;
  counts.greater = packed >> 16;
  counts.equal = packed & 0xFFFFu;
  return counts;
}

// The output position of the next entry (key) of the source, `before` holding the counts of
// every entry before it; advances `before` past it. kTopkNotKept when the entry is not kept
// (key < T, or a key == T after `need` of them).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_keep_position(std::uint32_t key, std::uint32_t threshold,
                                                          std::uint64_t need, TopkCounts& before) {
  std::uint64_t position = kTopkNotKept;
  if (key > threshold) {
    position = before.greater + (before.equal < need ? before.equal : need);
    ++before.greater;
  } else if (key == threshold) {
    if (before.equal < need) position = before.greater + before.equal;
    ++before.equal;
  }
  return position;
}

// A tile's look-back record (the workspace holds one per tile and pass, zeroed before the
// pass). `word` is flag << 32 | the tile's packed aggregate, so that the aggregate and its flag
// are published by one 64-bit store; the inclusive counts (counts of every entry up to the
// tile's end) are written before the flag turns kTopkTileInclusive. The flag only increases.
struct TopkTileStatus {
  std::uint64_t word;
  std::uint64_t inclusive_greater;
  std::uint64_t inclusive_equal;
};
inline constexpr std::uint32_t kTopkTileUnset = 0;      // not counted yet: wait
inline constexpr std::uint32_t kTopkTileAggregate = 1;  // own counts in the word
inline constexpr std::uint32_t kTopkTileInclusive = 2;  // inclusive counts valid too

GZ_HOST_DEVICE GZ_INLINE std::uint64_t topk_status_word(std::uint32_t flag,
                                                        std::uint32_t packed_aggregate) {
  return (std::uint64_t{flag} << 32) | packed_aggregate;
}
GZ_HOST_DEVICE GZ_INLINE std::uint32_t topk_status_flag(std::uint64_t word) {
  return static_cast<std::uint32_t>(word >> 32);
}
GZ_HOST_DEVICE GZ_INLINE TopkCounts topk_status_aggregate(std::uint64_t word) {
  return topk_unpack_counts(static_cast<std::uint32_t>(word));
}

// Look-back window: lane L (0..31) reads the status of tile `nearest - L`, nearest = the
// window's closest predecessor (the tile before the caller's, then 32 less per window). Lanes
// past tile 0 (L > nearest) read nothing and count as inclusive with zero counts; tile 0 is
// always inclusive, so a window that reaches it ends the walk.
GZ_HOST_DEVICE GZ_INLINE bool topk_lookback_lane_reads(std::uint64_t nearest, unsigned lane) {
  return lane <= nearest;
}

// The first lane whose tile is inclusive (the walk ends there), 32 when none is.
GZ_HOST_DEVICE GZ_INLINE unsigned topk_lookback_stop_lane(std::uint32_t inclusive_lanes) {
  if (inclusive_lanes == 0) return 32u;
#if defined(__CUDA_ARCH__)
  return static_cast<unsigned>(__ffs(static_cast<int>(inclusive_lanes)) - 1);
#else
  return static_cast<unsigned>(__builtin_ctz(inclusive_lanes));
#endif
}

// What lane `lane` adds to the caller's exclusive counts: the aggregate of a tile closer than
// the stop lane's, the inclusive counts of the stop lane's tile, nothing beyond.
GZ_HOST_DEVICE GZ_INLINE TopkCounts topk_lookback_lane_counts(unsigned lane, unsigned stop_lane,
                                                              std::uint64_t word,
                                                              TopkCounts inclusive) {
  if (lane < stop_lane) return topk_status_aggregate(word);
  if (lane == stop_lane) return inclusive;
  return TopkCounts{};
}

// ---- workspace --------------------------------------------------------------------------------

inline std::size_t topk_align_up(std::size_t bytes) noexcept {
  return (bytes + kTopkWorkspaceAlign - 1) / kTopkWorkspaceAlign * kTopkWorkspaceAlign;
}

enum class TopkPlanKind {
  empty,   // k == 0: no entries, nothing read
  all,     // k == n: every element, in order
  select,  // 0 < k < n: sample, candidates, radix select, compaction
};

// A byte range of the workspace; bytes == 0: the plan does not use it.
struct TopkRegion {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

struct TopkPlan {
  std::uint64_t n = 0;
  std::uint64_t k = 0;
  bool approx = false;
  bool half_values = false;
  // fast: one-pass compactions (look-back); reference: count pass, scans, write pass.
  KernelVariant variant = KernelVariant::fast;
  std::size_t index_bytes = 4;
  TopkPlanKind kind = TopkPlanKind::empty;

  // Sampling (kind == select).
  std::uint64_t sample_count = 0;  // s
  std::uint64_t sample_rank = 0;   // r (1-based); the threshold is 0 when r > s
  bool sample_used = false;        // r <= s
  std::uint64_t cpu_capacity = 0;  // the approx acceptance bound
  std::uint64_t gpu_capacity = 0;  // candidate buffer entries

  // Tiles of the compaction passes over the tensor: ceil(n / kTopkTile). Reference: the count
  // arrays hold tiles + 1 entries (the last stays 0, so its exclusive sum is the total).
  std::uint64_t tiles = 0;

  // Workspace layout, kind == select only: every region used is kTopkWorkspaceAlign-aligned and
  // they do not overlap, in this order.
  TopkRegion state;       // kTopkStateBytes
  TopkRegion histogram;   // kTopkHistogramBins u64
  TopkRegion sample;      // sample_count u32 keys
  // Reference only.
  TopkRegion gt_counts;   // tiles + 1 u64: per tile, keys > T
  TopkRegion eq_counts;   // tiles + 1 u64: per tile, keys == T
  TopkRegion gt_offsets;  // tiles + 1 u64: exclusive sums of gt_counts
  TopkRegion eq_offsets;  // tiles + 1 u64: exclusive sums of eq_counts
  TopkRegion scan_temp;   // the CUB DeviceScan temporary storage (at least one alignment unit)
  // Fast only: 2 * tiles TopkTileStatus, [0, tiles) for the candidate pass, [tiles, 2 * tiles)
  // for the final compaction (whose source, the candidates or the tensor, has at most n
  // entries, so at most `tiles` tiles).
  TopkRegion tile_status;
  TopkRegion candidate_index;  // gpu_capacity indices (index_bytes each)
  TopkRegion candidate_bits;   // gpu_capacity u32 f32 bits
  std::size_t workspace_bytes = kTopkMinWorkspaceBytes;  // total; the minimum for empty / all
};

// The number of items each exclusive scan of the reference variant covers (tiles + 1).
inline std::uint64_t topk_plan_scan_items(std::uint64_t n) noexcept {
  return (n + kTopkTile - 1) / kTopkTile + 1;
}

// Plans a call. Requires k <= n (the caller checks). scan_temp_bytes: for the reference
// variant, what cub::DeviceScan::ExclusiveSum needs for topk_plan_scan_items(n) u64 items
// (ignored by the fast variant, which scans nothing).
inline TopkPlan make_topk_plan(std::uint64_t n, std::uint64_t k, bool approx, bool half_values,
                               KernelVariant variant, std::size_t scan_temp_bytes) noexcept {
  TopkPlan plan;
  plan.n = n;
  plan.k = k;
  plan.approx = approx;
  plan.half_values = half_values;
  plan.variant = variant;
  plan.index_bytes = topk_index_bytes(n);
  if (k == 0) {
    plan.kind = TopkPlanKind::empty;
    return plan;
  }
  if (k >= n) {
    plan.kind = TopkPlanKind::all;
    return plan;
  }
  plan.kind = TopkPlanKind::select;
  plan.sample_count = topk_sample_count(n);
  plan.sample_rank = topk_sample_rank(k, n, approx);
  plan.sample_used = plan.sample_rank <= plan.sample_count;
  plan.cpu_capacity = topk_plan_cpu_capacity(n, plan.sample_rank);
  plan.gpu_capacity = topk_plan_gpu_capacity(n, plan.sample_rank);
  plan.tiles = topk_tile_count(n);

  std::size_t offset = 0;
  // The next region of `bytes` (reserving at least one alignment unit).
  const auto take = [&offset](std::size_t bytes) {
    TopkRegion region;
    region.offset = offset;
    region.bytes = bytes;
    offset += topk_align_up(bytes == 0 ? 1 : bytes);
    return region;
  };
  plan.state = take(kTopkStateBytes);
  plan.histogram = take(kTopkHistogramBins * sizeof(std::uint64_t));
  plan.sample = take(static_cast<std::size_t>(plan.sample_count) * sizeof(std::uint32_t));
  if (variant == KernelVariant::reference) {
    const std::size_t count_bytes =
        static_cast<std::size_t>(plan.tiles + 1) * sizeof(std::uint64_t);
    plan.gt_counts = take(count_bytes);
    plan.eq_counts = take(count_bytes);
    plan.gt_offsets = take(count_bytes);
    plan.eq_offsets = take(count_bytes);
    plan.scan_temp = take(scan_temp_bytes);
  } else {
    plan.tile_status = take(2 * static_cast<std::size_t>(plan.tiles) * sizeof(TopkTileStatus));
  }
  plan.candidate_index = take(static_cast<std::size_t>(plan.gpu_capacity) * plan.index_bytes);
  plan.candidate_bits = take(static_cast<std::size_t>(plan.gpu_capacity) * sizeof(std::uint32_t));
  plan.workspace_bytes = offset;
  return plan;
}

}  // namespace gradzip::kernels::cuda
