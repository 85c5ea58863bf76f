// Host-side planning of the CUDA top-k (compressors/topk/cuda/topk_plan.h), checked without a GPU: the
// capacity restated from the CPU equals the CPU's, the workspace layout of either variant
// (fast: one-pass compactions with look-back records; reference: count arrays and CUB scan
// storage) has exactly the regions its kernels use, each aligned, large enough and disjoint
// from the others, and the device's decision rule (topk_decide, fed with the sample threshold and the
// candidate count the kernels compute) predicts the CPU codec's approx result — entry count,
// path and entries — which is what makes the GPU's approx payload the CPU's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gradzip/tensor_view.h"
#include "compressors/topk/topk_cpu.h"
#include "compressors/topk/cuda/topk_plan.h"
#include "compressors/topk/topk_math.h"

namespace gradzip {
namespace {

using kernels::cuda::KernelVariant;
using kernels::cuda::make_topk_plan;
using kernels::cuda::TopkPlan;
using kernels::cuda::TopkPlanKind;
using kernels::cuda::TopkRegion;

constexpr KernelVariant kVariants[] = {KernelVariant::fast, KernelVariant::reference};

const char* variant_name(KernelVariant variant) {
  return variant == KernelVariant::fast ? "fast" : "reference";
}

TEST(TopkPlan, CpuCapacityIsTheCpusOwn) {
  const std::uint64_t counts[] = {0, 1, 7, 4096, 65535, 65536, 65537, 70001, 100000,
                                  (std::uint64_t{1} << 20) + 3, std::uint64_t{1} << 26,
                                  std::uint64_t{1} << 28, (std::uint64_t{1} << 32) + 5,
                                  std::uint64_t{1} << 40, std::uint64_t{1} << 50};
  for (std::uint64_t n : counts) {
    for (std::uint64_t rank : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{17},
                               std::uint64_t{700}, std::uint64_t{32768}, std::uint64_t{65536},
                               std::uint64_t{65537}, std::uint64_t{1} << 40}) {
      EXPECT_EQ(kernels::cuda::topk_plan_cpu_capacity(n, rank),
                kernels::cpu::topk_candidate_capacity(n, rank))
          << "n=" << n << " rank=" << rank;
    }
  }
}

TEST(TopkPlan, KindsFollowK) {
  for (KernelVariant variant : kVariants) {
    SCOPED_TRACE(variant_name(variant));
    EXPECT_EQ(make_topk_plan(0, 0, false, false, variant, 0).kind, TopkPlanKind::empty);
    EXPECT_EQ(make_topk_plan(10, 0, true, false, variant, 0).kind, TopkPlanKind::empty);
    EXPECT_EQ(make_topk_plan(10, 10, false, true, variant, 0).kind, TopkPlanKind::all);
    EXPECT_EQ(make_topk_plan(1, 0, false, false, variant, 0).kind, TopkPlanKind::empty);
    EXPECT_EQ(make_topk_plan(1, 1, false, false, variant, 0).kind, TopkPlanKind::all);
    EXPECT_EQ(make_topk_plan(10, 3, false, false, variant, 0).kind, TopkPlanKind::select);
    EXPECT_EQ(make_topk_plan(10, 3, false, false, variant, 0).variant, variant);
    EXPECT_EQ(make_topk_plan(std::uint64_t{1} << 32, 5, false, false, variant, 0).index_bytes, 4u);
    EXPECT_EQ(make_topk_plan((std::uint64_t{1} << 32) + 1, 5, false, false, variant, 0).index_bytes,
              8u);
  }
  EXPECT_EQ(kernels::cuda::topk_payload_bytes(100, 7, false), 7u * 8);
  EXPECT_EQ(kernels::cuda::topk_payload_bytes(100, 7, true), 7u * 6);
  EXPECT_EQ(kernels::cuda::topk_payload_bytes((std::uint64_t{1} << 32) + 1, 7, true), 7u * 10);
}

// A plan that asked for 0 bytes made a caller that allocates the queried size pass a null
// workspace, which topk_select takes for a size query: nothing ran for k == n or k == 0.
TEST(TopkPlan, EveryPlanAsksForAnAlignedWorkspaceOfAtLeast256Bytes) {
  const std::uint64_t counts[] = {0, 1, 2, 3, 255, 256, 4096, 4097, 65537,
                                  (std::uint64_t{1} << 20) + 3, (std::uint64_t{1} << 32) + 5};
  int kinds_seen[3] = {0, 0, 0};
  for (std::uint64_t n : counts) {
    for (std::uint64_t k : {std::uint64_t{0}, std::uint64_t{1}, n / 2, n - (n > 0), n}) {
      if (k > n) continue;
      for (bool approx : {false, true}) {
        for (std::size_t scan_temp : {std::size_t{0}, std::size_t{1}, std::size_t{767}}) {
          for (KernelVariant variant : kVariants) {
            const TopkPlan plan = make_topk_plan(n, k, approx, false, variant, scan_temp);
            SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " approx=" << approx
                                              << " scan_temp=" << scan_temp << " "
                                              << variant_name(variant));
            ++kinds_seen[static_cast<int>(plan.kind)];
            EXPECT_GE(plan.workspace_bytes, kernels::cuda::kTopkMinWorkspaceBytes);
            EXPECT_EQ(kernels::cuda::kTopkMinWorkspaceBytes, 256u);
            EXPECT_EQ(plan.workspace_bytes % kernels::cuda::kTopkWorkspaceAlign, 0u);
            const TopkPlanKind expected = k == 0   ? TopkPlanKind::empty
                                          : k == n ? TopkPlanKind::all
                                                   : TopkPlanKind::select;
            EXPECT_EQ(plan.kind, expected);
            // Nothing to select: exactly the minimum, and no region.
            if (expected != TopkPlanKind::select) {
              EXPECT_EQ(plan.workspace_bytes, kernels::cuda::kTopkMinWorkspaceBytes);
              EXPECT_EQ(plan.state.bytes + plan.histogram.bytes + plan.sample.bytes +
                            plan.gt_counts.bytes + plan.scan_temp.bytes + plan.tile_status.bytes +
                            plan.candidate_index.bytes + plan.candidate_bits.bytes,
                        0u);
            }
          }
        }
      }
    }
  }
  for (int kind = 0; kind < 3; ++kind) EXPECT_GT(kinds_seen[kind], 0) << "plan kind " << kind;
}

struct UsedRegion {
  const char* name;
  TopkRegion region;
  std::size_t needed;  // bytes the kernels touch in it
};

// The regions the kernels of `plan`'s variant use, in layout order, with the bytes each needs:
// stated here from what the kernels read and write, independently of the planner.
std::vector<UsedRegion> used_regions(const TopkPlan& plan, std::size_t scan_temp_bytes) {
  const std::size_t tiles = static_cast<std::size_t>(plan.tiles);
  const std::size_t capacity = static_cast<std::size_t>(plan.gpu_capacity);
  std::vector<UsedRegion> regions = {
      {"state", plan.state, 256},
      {"histogram", plan.histogram, 2048 * 8},
      {"sample", plan.sample, static_cast<std::size_t>(plan.sample_count) * 4},
  };
  if (plan.variant == KernelVariant::reference) {
    for (const auto& [name, region] : {std::pair{"gt_counts", plan.gt_counts},
                                       std::pair{"eq_counts", plan.eq_counts},
                                       std::pair{"gt_offsets", plan.gt_offsets},
                                       std::pair{"eq_offsets", plan.eq_offsets}}) {
      regions.push_back({name, region, (tiles + 1) * 8});
    }
    regions.push_back({"scan_temp", plan.scan_temp, scan_temp_bytes});
  } else {
    // A record of 3 u64 per tile, for each of the two passes.
    regions.push_back({"tile_status", plan.tile_status, 2 * tiles * 24});
  }
  regions.push_back({"candidate_index", plan.candidate_index, capacity * plan.index_bytes});
  regions.push_back({"candidate_bits", plan.candidate_bits, capacity * 4});
  return regions;
}

std::size_t aligned(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256; }

// Every region the variant uses: 256-aligned, exactly the bytes its kernels need, inside the
// workspace, disjoint from every other; the workspace is the sum of the aligned regions (no
// slack beyond alignment); the other variant's regions are absent.
void expect_layout(const TopkPlan& plan, std::size_t scan_temp_bytes) {
  ASSERT_EQ(plan.kind, TopkPlanKind::select);
  static_assert(sizeof(kernels::cuda::TopkTileStatus) == 24);
  const std::vector<UsedRegion> regions = used_regions(plan, scan_temp_bytes);
  std::size_t total = 0;
  for (std::size_t j = 0; j < regions.size(); ++j) {
    const UsedRegion& a = regions[j];
    SCOPED_TRACE(a.name);
    EXPECT_EQ(a.region.offset % kernels::cuda::kTopkWorkspaceAlign, 0u);
    EXPECT_EQ(a.region.bytes, a.needed);
    EXPECT_EQ(a.region.offset, total);  // in layout order, packed
    EXPECT_LE(a.region.offset + a.needed, plan.workspace_bytes);
    total += aligned(a.needed);
    for (std::size_t i = 0; i < j; ++i) {
      const UsedRegion& b = regions[i];
      const bool disjoint = a.region.offset >= b.region.offset + b.needed ||
                            b.region.offset >= a.region.offset + a.needed;
      EXPECT_TRUE(disjoint) << a.name << " overlaps " << b.name;
    }
  }
  EXPECT_EQ(plan.workspace_bytes, total);
  if (plan.variant == KernelVariant::fast) {
    EXPECT_EQ(plan.gt_counts.bytes + plan.eq_counts.bytes + plan.gt_offsets.bytes +
                  plan.eq_offsets.bytes + plan.scan_temp.bytes,
              0u);
  } else {
    EXPECT_EQ(plan.tile_status.bytes, 0u);
  }
}

TEST(TopkPlan, WorkspaceRegionsAreDisjointAlignedAndLargeEnough) {
  const std::uint64_t tile = kernels::cuda::kTopkTile;
  for (std::uint64_t n : {std::uint64_t{2}, std::uint64_t{3}, tile - 1, tile, tile + 1,
                          2 * tile - 1, 2 * tile, 2 * tile + 1, std::uint64_t{65535},
                          std::uint64_t{65536}, std::uint64_t{65537}, std::uint64_t{70001},
                          (std::uint64_t{1} << 20) + 3, std::uint64_t{1} << 28,
                          std::uint64_t{1} << 32, (std::uint64_t{1} << 32) + 1,
                          (std::uint64_t{1} << 32) + 5, std::uint64_t{1} << 40}) {
    for (std::uint64_t k : {std::uint64_t{1}, n / 100 + 1, n / 2, n - 1}) {
      if (k == 0 || k >= n) continue;
      for (bool approx : {false, true}) {
        for (KernelVariant variant : kVariants) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " approx=" << approx
                                            << " " << variant_name(variant));
          const TopkPlan plan = make_topk_plan(n, k, approx, false, variant, 12345);
          ASSERT_EQ(plan.kind, TopkPlanKind::select);
          EXPECT_EQ(plan.variant, variant);
          EXPECT_EQ(plan.index_bytes, n > (std::uint64_t{1} << 32) ? 8u : 4u);
          EXPECT_EQ(plan.sample_count, kernels::topk_sample_count(n));
          EXPECT_EQ(plan.sample_rank, kernels::topk_sample_rank(k, n, approx));
          EXPECT_EQ(plan.sample_used, plan.sample_rank <= plan.sample_count);
          EXPECT_LE(plan.gpu_capacity, plan.cpu_capacity);
          EXPECT_LE(plan.gpu_capacity, std::max<std::uint64_t>(n / 8, kernels::kTopkSampleAllCount));
          // The final compaction reads the candidates or the tensor: at most n entries, so at
          // most `tiles` tiles, which the second half of the look-back records covers.
          EXPECT_LE(plan.gpu_capacity, n);
          EXPECT_EQ(plan.tiles, kernels::cuda::topk_tile_count(n));
          EXPECT_GE(plan.tiles * tile, n);
          EXPECT_LT((plan.tiles - 1) * tile, n);
          expect_layout(plan, 12345);
          // The two variants agree on everything but the compaction regions.
          const TopkPlan other = make_topk_plan(
              n, k, approx, false,
              variant == KernelVariant::fast ? KernelVariant::reference : KernelVariant::fast, 12345);
          EXPECT_EQ(other.gpu_capacity, plan.gpu_capacity);
          EXPECT_EQ(other.tiles, plan.tiles);
          EXPECT_EQ(other.sample.offset, plan.sample.offset);
        }
      }
    }
  }
  // The performance case, 1% of 2^28: the candidate buffer is about 2k entries.
  for (KernelVariant variant : kVariants) {
    const TopkPlan plan = make_topk_plan(std::uint64_t{1} << 28, 2684355, false, false, variant, 0);
    EXPECT_LT(plan.gpu_capacity, 5 * std::uint64_t{2684355} / 2);
    EXPECT_LT(plan.workspace_bytes, std::size_t{64} << 20);
  }
}

// Layouts worked out by hand. n = 4097, k = 1: two tiles (the second holds one element), the
// sample and the candidate buffer are the whole tensor (4097 entries, 16388 bytes -> 16640).
TEST(TopkPlan, LayoutsWorkedOutByHand) {
  const TopkPlan fast = make_topk_plan(4097, 1, false, false, KernelVariant::fast, 767);
  EXPECT_EQ(fast.tiles, 2u);
  EXPECT_EQ(fast.gpu_capacity, 4097u);
  EXPECT_EQ(fast.state.offset, 0u);
  EXPECT_EQ(fast.histogram.offset, 256u);
  EXPECT_EQ(fast.sample.offset, 16640u);
  EXPECT_EQ(fast.tile_status.offset, 33280u);
  EXPECT_EQ(fast.tile_status.bytes, 96u);  // 2 passes x 2 tiles x 24 bytes
  EXPECT_EQ(fast.candidate_index.offset, 33536u);
  EXPECT_EQ(fast.candidate_bits.offset, 50176u);
  EXPECT_EQ(fast.workspace_bytes, 66816u);
  EXPECT_EQ(fast.scan_temp.bytes, 0u);  // the fast variant takes no CUB scan storage

  const TopkPlan reference = make_topk_plan(4097, 1, false, false, KernelVariant::reference, 767);
  EXPECT_EQ(reference.sample.offset, 16640u);
  EXPECT_EQ(reference.gt_counts.offset, 33280u);
  EXPECT_EQ(reference.gt_counts.bytes, 24u);  // 3 u64 (tiles + 1)
  EXPECT_EQ(reference.eq_counts.offset, 33536u);
  EXPECT_EQ(reference.gt_offsets.offset, 33792u);
  EXPECT_EQ(reference.eq_offsets.offset, 34048u);
  EXPECT_EQ(reference.scan_temp.offset, 34304u);
  EXPECT_EQ(reference.scan_temp.bytes, 767u);
  EXPECT_EQ(reference.candidate_index.offset, 35072u);
  EXPECT_EQ(reference.candidate_bits.offset, 51712u);
  EXPECT_EQ(reference.workspace_bytes, 68352u);

  // n = 2^32 + 5, k = 1, exact: u64 indices, 2^20 + 1 tiles (the last holds 5), r = 21 so the
  // buffer is 2 * 21 * 65537 + 4096 = 2756650 entries.
  const std::uint64_t n = (std::uint64_t{1} << 32) + 5;
  const TopkPlan wide = make_topk_plan(n, 1, false, false, KernelVariant::fast, 0);
  EXPECT_EQ(wide.index_bytes, 8u);
  EXPECT_EQ(wide.tiles, (std::uint64_t{1} << 20) + 1);
  EXPECT_EQ(wide.gpu_capacity, 2756650u);
  EXPECT_EQ(wide.sample.offset, 16640u);
  EXPECT_EQ(wide.tile_status.offset, 278784u);
  EXPECT_EQ(wide.tile_status.bytes, 50331696u);
  EXPECT_EQ(wide.candidate_index.offset, 50610688u);
  EXPECT_EQ(wide.candidate_index.bytes, 22053200u);
  EXPECT_EQ(wide.candidate_bits.offset, 72664064u);
  EXPECT_EQ(wide.workspace_bytes, 83690752u);
}

// The kernels' steps 1-3 on the host: sample keys at the shared positions, t = the r-th largest
// (0 when r > s), c = #(key >= t), and the decision.
struct Emulated {
  std::uint32_t threshold = 0;
  std::uint64_t candidates = 0;
  kernels::cuda::TopkDecision decision;
};

Emulated emulate(const std::vector<float>& x, std::uint64_t k, bool approx, std::uint64_t seed,
                 std::uint32_t step, std::uint32_t tensor_id) {
  const std::uint64_t n = x.size();
  const TopkPlan plan = make_topk_plan(n, k, approx, false, KernelVariant::fast, 0);
  std::vector<std::uint32_t> sample(plan.sample_count);
  for (std::uint64_t j = 0; j < plan.sample_count; ++j) {
    const std::uint64_t position =
        n <= kernels::kTopkSampleAllCount
            ? j
            : kernels::topk_sample_run_start(n, j / kernels::kTopkSampleRun, seed, step, tensor_id) +
                  j % kernels::kTopkSampleRun;
    sample[j] = kernels::topk_key(x[position]);
  }
  Emulated result;
  if (plan.sample_used) {
    std::nth_element(sample.begin(), sample.begin() + (plan.sample_rank - 1), sample.end(),
                     std::greater<>());
    result.threshold = sample[plan.sample_rank - 1];
  }
  for (float v : x) result.candidates += kernels::topk_key(v) >= result.threshold ? 1 : 0;
  result.decision = kernels::cuda::topk_decide(result.candidates, k, approx, plan.cpu_capacity,
                                               plan.gpu_capacity);
  return result;
}

TEST(TopkPlan, DecisionPredictsTheCpuResult) {
  int accepted = 0;
  int exact_from_candidates = 0;
  for (std::size_t n : {std::size_t{1000}, std::size_t{70001}, (std::size_t{1} << 20) + 3}) {
    for (int data = 0; data < 2; ++data) {
      std::mt19937_64 random(n + data);
      std::vector<float> x(n);
      std::normal_distribution<float> normal;
      std::uniform_int_distribution<int> small(-3, 3);
      for (auto& v : x) v = data == 0 ? normal(random) : 0.5f * static_cast<float>(small(random));
      for (std::uint64_t k : {std::uint64_t{1}, std::uint64_t{n / 100}, std::uint64_t{n / 3}}) {
        for (std::uint64_t seed = 0; seed < 6; ++seed) {
          for (bool approx : {false, true}) {
            const Emulated emulated = emulate(x, k, approx, seed, 4, 1);
            std::vector<std::uint32_t> indices(k);
            std::vector<float> values(k);
            const kernels::cpu::TopkOptions options{approx, seed, 4, 1};
            const auto cpu = kernels::cpu::topk_select<std::uint32_t>(
                host_view(x.data(), x.size()), k, options, indices.data(), values.data());
            const std::string what = "n=" + std::to_string(n) + " data=" + std::to_string(data) +
                                     " k=" + std::to_string(k) + " seed=" + std::to_string(seed) +
                                     (approx ? " approx" : " exact");
            EXPECT_EQ(cpu.threshold, emulated.threshold) << what;
            if (cpu.candidates != kernels::cpu::kTopkCollectOverflow) {
              EXPECT_EQ(cpu.candidates, emulated.candidates) << what;
            }
            EXPECT_EQ(cpu.count, emulated.decision.entries) << what;
            EXPECT_EQ(cpu.path == kernels::cpu::TopkPath::approx_accepted, emulated.decision.accept)
                << what;
            if (emulated.decision.accept) {
              ++accepted;
              // The result is every element with key >= t, in index order.
              std::vector<std::uint32_t> expected;
              for (std::size_t i = 0; i < n; ++i)
                if (kernels::topk_key(x[i]) >= emulated.threshold) expected.push_back(static_cast<std::uint32_t>(i));
              indices.resize(cpu.count);
              EXPECT_EQ(indices, expected) << what;
            }
            if (!approx && emulated.decision.use_candidates) ++exact_from_candidates;
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(exact_from_candidates, 0);
}

}  // namespace
}  // namespace gradzip
