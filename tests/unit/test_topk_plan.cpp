// Host-side planning of the CUDA top-k (kernels/cuda/topk_plan.h), checked without a GPU: the
// capacity restated from the CPU equals the CPU's, the workspace layout is disjoint and
// aligned, and the device's decision rule (topk_decide, fed with the sample threshold and the
// candidate count the kernels compute) predicts the CPU codec's approx result — entry count,
// path and entries — which is what makes the GPU's approx payload the CPU's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "gradzip/tensor_view.h"
#include "kernels/cpu/topk_cpu.h"
#include "kernels/cuda/topk_plan.h"
#include "kernels/topk_math.h"

namespace gradzip {
namespace {

using kernels::cuda::make_topk_plan;
using kernels::cuda::TopkPlan;
using kernels::cuda::TopkPlanKind;

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
  EXPECT_EQ(make_topk_plan(0, 0, false, false, 0).kind, TopkPlanKind::empty);
  EXPECT_EQ(make_topk_plan(10, 0, true, false, 0).kind, TopkPlanKind::empty);
  EXPECT_EQ(make_topk_plan(10, 10, false, true, 0).kind, TopkPlanKind::all);
  EXPECT_EQ(make_topk_plan(1, 1, false, false, 0).kind, TopkPlanKind::all);
  EXPECT_EQ(make_topk_plan(10, 3, false, false, 0).kind, TopkPlanKind::select);
  EXPECT_EQ(make_topk_plan(std::uint64_t{1} << 32, 5, false, false, 0).index_bytes, 4u);
  EXPECT_EQ(make_topk_plan((std::uint64_t{1} << 32) + 1, 5, false, false, 0).index_bytes, 8u);
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
          const TopkPlan plan = make_topk_plan(n, k, approx, false, scan_temp);
          SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " approx=" << approx
                                            << " scan_temp=" << scan_temp);
          ++kinds_seen[static_cast<int>(plan.kind)];
          EXPECT_GE(plan.workspace_bytes, kernels::cuda::kTopkMinWorkspaceBytes);
          EXPECT_EQ(kernels::cuda::kTopkMinWorkspaceBytes, 256u);
          EXPECT_EQ(plan.workspace_bytes % kernels::cuda::kTopkWorkspaceAlign, 0u);
          const TopkPlanKind expected = k == 0   ? TopkPlanKind::empty
                                        : k == n ? TopkPlanKind::all
                                                 : TopkPlanKind::select;
          EXPECT_EQ(plan.kind, expected);
        }
      }
    }
  }
  for (int kind = 0; kind < 3; ++kind) EXPECT_GT(kinds_seen[kind], 0) << "plan kind " << kind;
}

TEST(TopkPlan, WorkspaceRegionsAreDisjointAndAligned) {
  for (std::uint64_t n : {std::uint64_t{2}, std::uint64_t{4097}, std::uint64_t{65537},
                          (std::uint64_t{1} << 20) + 3, std::uint64_t{1} << 28,
                          (std::uint64_t{1} << 32) + 5}) {
    for (std::uint64_t k : {std::uint64_t{1}, n / 100 + 1, n / 2, n - 1}) {
      if (k == 0 || k >= n) continue;
      for (bool approx : {false, true}) {
        const TopkPlan plan = make_topk_plan(n, k, approx, false, 12345);
        ASSERT_EQ(plan.kind, TopkPlanKind::select);
        EXPECT_EQ(plan.sample_count, kernels::topk_sample_count(n));
        EXPECT_EQ(plan.sample_rank, kernels::topk_sample_rank(k, n, approx));
        EXPECT_EQ(plan.sample_used, plan.sample_rank <= plan.sample_count);
        EXPECT_LE(plan.gpu_capacity, plan.cpu_capacity);
        EXPECT_LE(plan.gpu_capacity, std::max<std::uint64_t>(n / 8, kernels::kTopkSampleAllCount));
        EXPECT_GE(plan.tiles * kernels::cuda::kTopkTile, n);
        EXPECT_LT((plan.tiles - 1) * kernels::cuda::kTopkTile, n);
        const std::size_t counts = (plan.tiles + 1) * 8;
        struct Region {
          std::size_t offset, bytes;
        };
        const Region regions[] = {
            {plan.state_offset, kernels::cuda::kTopkStateBytes},
            {plan.histogram_offset, kernels::cuda::kTopkHistogramBins * 8},
            {plan.sample_offset, plan.sample_count * 4},
            {plan.gt_counts_offset, counts},
            {plan.eq_counts_offset, counts},
            {plan.gt_offsets_offset, counts},
            {plan.eq_offsets_offset, counts},
            {plan.scan_temp_offset, plan.scan_temp_bytes},
            {plan.candidate_index_offset, plan.gpu_capacity * plan.index_bytes},
            {plan.candidate_bits_offset, plan.gpu_capacity * 4},
        };
        for (std::size_t j = 0; j < std::size(regions); ++j) {
          EXPECT_EQ(regions[j].offset % kernels::cuda::kTopkWorkspaceAlign, 0u) << j;
          const std::size_t end = regions[j].offset + regions[j].bytes;
          const std::size_t next =
              j + 1 < std::size(regions) ? regions[j + 1].offset : plan.workspace_bytes;
          EXPECT_LE(end, next) << "region " << j << " n=" << n << " k=" << k;
        }
      }
    }
  }
  // The performance case, 1% of 2^28: the candidate buffer is about 2k entries.
  const TopkPlan plan = make_topk_plan(std::uint64_t{1} << 28, 2684355, false, false, 0);
  EXPECT_LT(plan.gpu_capacity, 5 * std::uint64_t{2684355} / 2);
  EXPECT_LT(plan.workspace_bytes, std::size_t{64} << 20);
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
  const TopkPlan plan = make_topk_plan(n, k, approx, false, 0);
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
