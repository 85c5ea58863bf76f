// Host-side planning of the CUDA top-k selection (kernels/cuda/topk_cuda.h): which path a call
// takes, the candidate capacities, the tiling of the compaction passes and the layout of the
// workspace. Plain C++17 with no CUDA dependency, so that it is unit-tested on any machine
// (tests/unit/test_topk_plan.cpp) and included by topk_cuda.cu.
//
// The selection the GPU makes is decided by these numbers and by the shared element math of
// kernels/topk_math.h only:
//  - exact: the exact top-k under the ordering rule of kernels/topk_math.h;
//  - approx: with t the sampled threshold and c the number of elements with key >= t, the
//    elements with key >= t when c <= topk_plan_cpu_capacity(n, r) and ceil(k/2) <= c < k,
//    else the exact top-k. This is the CPU codec's approx result (kernels/cpu/topk_cpu.h: its
//    steps 3-5 all give the exact top-k, only "approx_accepted" gives the candidates), so the
//    payload bytes are the same as the CPU's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/topk_math.h"

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

// Elements above which payload indices are u64 (compressors/topk.cpp: u32 iff n <= 2^32).
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

inline std::size_t topk_align_up(std::size_t bytes) noexcept {
  return (bytes + kTopkWorkspaceAlign - 1) / kTopkWorkspaceAlign * kTopkWorkspaceAlign;
}

enum class TopkPlanKind {
  empty,   // k == 0: no entries, nothing read
  all,     // k == n: every element, in order
  select,  // 0 < k < n: sample, candidates, radix select, compaction
};

struct TopkPlan {
  std::uint64_t n = 0;
  std::uint64_t k = 0;
  bool approx = false;
  bool half_values = false;
  std::size_t index_bytes = 4;
  TopkPlanKind kind = TopkPlanKind::empty;

  // Sampling (kind == select).
  std::uint64_t sample_count = 0;  // s
  std::uint64_t sample_rank = 0;   // r (1-based); the threshold is 0 when r > s
  bool sample_used = false;        // r <= s
  std::uint64_t cpu_capacity = 0;  // the approx acceptance bound
  std::uint64_t gpu_capacity = 0;  // candidate buffer entries

  // Tiles of the count / compaction passes: ceil(n / kTopkTile); the count arrays hold
  // tiles + 1 entries (the last stays 0, so its exclusive sum is the total).
  std::uint64_t tiles = 0;

  // Workspace layout (byte offsets, each kTopkWorkspaceAlign-aligned), kind == select only.
  std::size_t state_offset = 0;
  std::size_t histogram_offset = 0;   // kTopkHistogramBins u64
  std::size_t sample_offset = 0;      // sample_count u32 keys
  std::size_t gt_counts_offset = 0;   // tiles + 1 u64: per tile, keys > T
  std::size_t eq_counts_offset = 0;   // tiles + 1 u64: per tile, keys == T
  std::size_t gt_offsets_offset = 0;  // tiles + 1 u64: exclusive sums of gt_counts
  std::size_t eq_offsets_offset = 0;  // tiles + 1 u64: exclusive sums of eq_counts
  std::size_t scan_temp_offset = 0;   // scan_temp_bytes (CUB DeviceScan temporary storage)
  std::size_t scan_temp_bytes = 0;
  std::size_t candidate_index_offset = 0;  // gpu_capacity indices (index_bytes each)
  std::size_t candidate_bits_offset = 0;   // gpu_capacity u32 f32 bits
  std::size_t workspace_bytes = kTopkMinWorkspaceBytes;  // total; the minimum for empty / all
};

// The number of items each exclusive scan covers (tiles + 1).
inline std::uint64_t topk_plan_scan_items(std::uint64_t n) noexcept {
  return (n + kTopkTile - 1) / kTopkTile + 1;
}

// Plans a call. Requires k <= n (the caller checks). scan_temp_bytes: what
// cub::DeviceScan::ExclusiveSum needs for topk_plan_scan_items(n) u64 items.
inline TopkPlan make_topk_plan(std::uint64_t n, std::uint64_t k, bool approx, bool half_values,
                               std::size_t scan_temp_bytes) noexcept {
  TopkPlan plan;
  plan.n = n;
  plan.k = k;
  plan.approx = approx;
  plan.half_values = half_values;
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
  plan.tiles = (n + kTopkTile - 1) / kTopkTile;
  plan.scan_temp_bytes = scan_temp_bytes;

  const std::size_t count_bytes = static_cast<std::size_t>(plan.tiles + 1) * sizeof(std::uint64_t);
  std::size_t offset = 0;
  const auto take = [&offset](std::size_t bytes) {
    const std::size_t at = offset;
    offset += topk_align_up(bytes);
    return at;
  };
  plan.state_offset = take(kTopkStateBytes);
  plan.histogram_offset = take(kTopkHistogramBins * sizeof(std::uint64_t));
  plan.sample_offset = take(static_cast<std::size_t>(plan.sample_count) * sizeof(std::uint32_t));
  plan.gt_counts_offset = take(count_bytes);
  plan.eq_counts_offset = take(count_bytes);
  plan.gt_offsets_offset = take(count_bytes);
  plan.eq_offsets_offset = take(count_bytes);
  plan.scan_temp_offset = take(scan_temp_bytes == 0 ? 1 : scan_temp_bytes);
  plan.candidate_index_offset =
      take(static_cast<std::size_t>(plan.gpu_capacity) * plan.index_bytes);
  plan.candidate_bits_offset =
      take(static_cast<std::size_t>(plan.gpu_capacity) * sizeof(std::uint32_t));
  plan.workspace_bytes = offset;
  return plan;
}

}  // namespace gradzip::kernels::cuda
