// The hierarchical all-reduce (collectives/hierarchical_allreduce.cpp) with nodes of
// L = 1, 2 and P consecutive ranks at every world size P (so nodes of unequal size too: P = 3
// and P = 5 with L = 2): the exact sum for `none`, derived error bounds for fp16 and qsgd, an
// independently computed reference for sign, byte-identical results on every rank, distinct
// random streams per shard, the residual of the shard, and refusals of bad arguments on every
// rank.
//
// Node c holds ranks [c L, min((c + 1) L, P)); its exact partial sum x_c = sum over its ranks of
// the integer contributions g_r (exact in f32). With S = the smallest node's size, shard t of S
// is all-reduced across nodes by the ranks of local index t < S. Every expectation below is in
// terms of the x_c, computed locally on every rank.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::ReduceJob;
using collectives::shard_begin;
using collectives::Transport;
using error_feedback::ResidualStore;

constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;
constexpr std::size_t kSmallCounts[] = {0, 1, 7, 4097};
constexpr std::uint64_t kSeed = 21;

// The node and cross-node transports of `ranks_per_node` consecutive ranks per node, as the
// Communicator builds them.
struct Topology {
  int ranks_per_node = 1;
  int nodes = 1;
  int shards = 1;  // S: the smallest node's size
  std::unique_ptr<Transport> intra, inter;
};

Topology make_topology(MpiTransport& world, int ranks_per_node) {
  Topology topology;
  const int ranks = world.size(), rank = world.rank();
  topology.ranks_per_node = ranks_per_node;
  topology.nodes = (ranks + ranks_per_node - 1) / ranks_per_node;
  topology.shards = ranks - (topology.nodes - 1) * ranks_per_node;  // the last node's size
  topology.intra = world.split(rank / ranks_per_node, rank);
  topology.inter = world.split(topology.intra->rank(), rank);
  return topology;
}

// L = 1, 2 and P, each once.
std::vector<int> node_sizes(int ranks) {
  std::vector<int> sizes = {1, 2, ranks};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](int l) { return l > ranks; }),
              sizes.end());
  return sizes;
}

std::vector<float> contribution(std::size_t count, int rank) {
  return testing::integer_contribution(count, rank, kSeed);
}

// x_c for every node c (exact: integers of magnitude <= 1000 L).
std::vector<std::vector<float>> node_partials(std::size_t count, int ranks, int ranks_per_node) {
  std::vector<std::vector<float>> partials;
  for (int first = 0; first < ranks; first += ranks_per_node) {
    std::vector<float> partial(count, 0.0f);
    for (int r = first; r < std::min(ranks, first + ranks_per_node); ++r) {
      const std::vector<float> g = contribution(count, r);
      for (std::size_t i = 0; i < count; ++i) partial[i] += g[i];
    }
    partials.push_back(std::move(partial));
  }
  return partials;
}

using testing::same_bits;

struct Outcome {
  std::vector<float> data;
  CollectiveStats stats;
};

Outcome run_hierarchical(MpiTransport& world, Topology& topology, const Codec& codec,
                         std::size_t count, ResidualStore& store,
                         Algorithm inner = Algorithm::auto_select) {
  Outcome outcome{contribution(count, world.rank()), {}};
  EncodeContext ctx;
  ctx.seed = codec.spec().seed;
  ctx.tensor_id = 3;
  ReduceJob job{world, codec, outcome.data, "grad",
                codec.spec().error_feedback ? &store : nullptr, ctx, outcome.stats};
  collectives::hierarchical_allreduce(job, *topology.intra, *topology.inter, inner);
  return outcome;
}

ResidualStore fresh_store(const MpiTransport& world) {
  return ResidualStore(static_cast<std::uint32_t>(world.size()),
                       static_cast<std::uint32_t>(world.rank()), ResizePolicy::error);
}

// One hierarchical call with `codec` on fresh residuals for every node size L and every count,
// each checked for what every call must show (identical bytes on all ranks, the algorithm's
// name, the unequal-node note) and then by `check`.
using LayoutCheck = std::function<void(Topology& topology, std::size_t count,
                                       const Outcome& outcome, const ResidualStore& store)>;
void for_each_layout(const Codec& codec, std::span<const std::size_t> counts,
                     const std::string& inner, const LayoutCheck& check) {
  MpiTransport world(MPI_COMM_WORLD);
  for (int ranks_per_node : node_sizes(world.size())) {
    Topology topology = make_topology(world, ranks_per_node);
    for (std::size_t count : counts) {
      SCOPED_TRACE(codec.name() + ", " + std::to_string(ranks_per_node) +
                   " ranks per node, count " + std::to_string(count));
      ResidualStore store = fresh_store(world);
      const Outcome outcome = run_hierarchical(world, topology, codec, count, store);
      EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(outcome.data)));
      EXPECT_EQ(outcome.stats.algorithm, "hier/" + inner);
      const bool unequal = topology.shards < topology.ranks_per_node;
      EXPECT_EQ(outcome.stats.note.find("nodes of unequal size") != std::string::npos, unequal)
          << outcome.stats.note;
      check(topology, count, outcome, store);
    }
  }
}

TEST(HierarchicalAllreduce, NoneGivesTheExactSumLikeMpiAllreduce) {
  MpiTransport world(MPI_COMM_WORLD);
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
  counts.push_back(kLargeCount);
  for_each_layout(*codec, counts, "ring", [&](Topology& topology, std::size_t count,
                                              const Outcome& outcome, const ResidualStore&) {
    std::vector<float> expected = contribution(count, world.rank());
    world.allreduce_f32_sum(expected);  // exact: integer sums below 2^24
    EXPECT_TRUE(same_bits(outcome.data, expected));
    // Step (c) alone brings every element this rank does not hold: 4 (n - own shard) bytes.
    const int local = topology.intra->rank();
    const std::size_t own = local < topology.shards
                                ? shard_begin(count, topology.shards, local + 1) -
                                      shard_begin(count, topology.shards, local)
                                : 0;
    if (topology.intra->size() > 1) {
      EXPECT_GE(outcome.stats.received_bytes, (count - own) * sizeof(float));
    }
  });
}

// fp16 across nodes (auto: the ring over the m nodes). Every encode rounds an integer partial
// sum p to f16: |fp16(p) - p| <= u |p|, u = 2^-11 (|p| <= 5000 < 65504: no overflow; integers
// stay integers, so every f32 add is exact). Each exact partial sum of element i is bounded by
// A_i = sum_c |x_c[i]|; a value that went through j roundings differs from its exact partial
// by e_j <= (1 + u) e_{j-1} + u A_i, so e_E <= A_i ((1 + u)^E - 1). The ring encodes each
// element m times (m - 1 reduce-scatter hops, 1 all-gather), SRA twice: E = max(m, 2).
TEST(HierarchicalAllreduce, Fp16IsWithinTheRoundingBoundOfTheNodeSums) {
  const int ranks = testing::world_size();
  const std::unique_ptr<Codec> codec = make_codec("fp16");
  for_each_layout(*codec, kSmallCounts, "ring", [&](Topology& topology, std::size_t count,
                                                    const Outcome& outcome, const ResidualStore&) {
    const double growth = std::pow(1.0 + 0x1p-11, std::max(topology.nodes, 2)) - 1.0;
    const auto partials = node_partials(count, ranks, topology.ranks_per_node);
    std::size_t over_bound = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;
      for (const auto& x : partials) {
        exact += x[i];
        magnitude += std::fabs(x[i]);
      }
      if (std::fabs(outcome.data[i] - exact) > magnitude * growth) ++over_bound;
    }
    EXPECT_EQ(over_bound, 0u);
  });
}

// qsgd:bits=8 across nodes (auto: SRA, two compressions). One qsgd encode of a bucket with
// scale M = max |v| rounds each element stochastically between adjacent levels M q / 127, so
// its error is < M / 127. SRA: each node's x_c (bucket max <= M_c = max_i |x_c[i]|) is encoded
// once, and the owner's sum s of the decoded values (|s| <= sum_c M_c, decoded magnitudes never
// exceed the scale) once more: error < 2 A / 127 with A = sum_c M_c, plus f32 roundings of the
// decode and the <= 5-term sums (< 10 x 2^-24 A, covered by 1e-5 A).
TEST(HierarchicalAllreduce, QsgdIsWithinTwoQuantisationStepsOfTheNodeSums) {
  const int ranks = testing::world_size();
  const std::unique_ptr<Codec> codec = make_codec("qsgd:bits=8");
  for_each_layout(*codec, kSmallCounts, "sra", [&](Topology& topology, std::size_t count,
                                                   const Outcome& outcome, const ResidualStore&) {
    const auto partials = node_partials(count, ranks, topology.ranks_per_node);
    double scale_sum = 0;
    for (const auto& x : partials) {
      float largest = 0;
      for (float v : x) largest = std::max(largest, std::fabs(v));
      scale_sum += largest;
    }
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (const auto& x : partials) exact += x[i];
      worst = std::max(worst, std::fabs(outcome.data[i] - exact));
    }
    EXPECT_LE(worst, scale_sum * (2.0 / 127.0 + 1e-5));
  });
}

// sign has no useful per-element bound (a bucket's elements all decode to +-mean |x|), so the
// result is compared bit for bit with a reference that does not use the hierarchical code:
// every rank of local index t < S runs the flat SRA itself over the same cross-node group on
// shard t of its node's exact sum x_c (sign draws no random numbers, so the tensor id does not
// matter), with a fresh error-feedback store, like the algorithm's first call. Every shard is
// checked by the ranks that own it; the others hold the same bytes (identical_on_all_ranks).
TEST(HierarchicalAllreduce, SignEqualsFlatSraOverTheNodeSums) {
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::unique_ptr<Codec> codec = make_codec("sign");
  ASSERT_TRUE(codec->spec().error_feedback);
  for_each_layout(*codec, kSmallCounts, "sra", [&](Topology& topology, std::size_t count,
                                                   const Outcome& outcome,
                                                   const ResidualStore& store) {
    const int local = topology.intra->rank();
    if (local >= topology.shards) {
      EXPECT_FALSE(store.contains("grad@hier")) << "an idle rank encoded a shard";
      return;
    }
    const std::size_t begin = shard_begin(count, topology.shards, local);
    const std::size_t end = shard_begin(count, topology.shards, local + 1);
    // The residual of the shard this rank compressed.
    ASSERT_TRUE(store.contains("grad@hier"));
    EXPECT_EQ(store.residual("grad@hier").size(), end - begin);

    const std::vector<float> node_sum = node_partials(count, ranks, topology.ranks_per_node)[
        static_cast<std::size_t>(rank / topology.ranks_per_node)];
    std::vector<float> expected(node_sum.begin() + static_cast<std::ptrdiff_t>(begin),
                                node_sum.begin() + static_cast<std::ptrdiff_t>(end));
    ResidualStore reference_store(static_cast<std::uint32_t>(ranks),
                                  static_cast<std::uint32_t>(rank), ResizePolicy::error);
    CollectiveStats reference_stats;
    ReduceJob reference{*topology.inter, *codec, expected, "reference", &reference_store,
                        EncodeContext{}, reference_stats};
    collectives::run_flat_allreduce(reference, Algorithm::sra);
    EXPECT_TRUE(same_bits(std::span<const float>(outcome.data).subspan(begin, end - begin),
                          expected));
  });
}

// The cross-node stage of shard t runs with tensor id ^ f(t), so shards whose inputs are equal
// draw different stochastic rounding: with every node holding the same values in each of its
// S shards (n = 3840 splits evenly for S = 2..5), qsgd's results for the shards must differ.
// Without the mixing they would be bit-identical (same inter rank, same seed, same offsets).
// A worker residual "grad" (another algorithm's, or residuals folded into it) is compensated by
// no encode here (the inner algorithm keeps "grad@hier"): it must reach the result, not be
// stranded. With `none` through error feedback one call delivers every rank's input plus its
// old worker residual exactly (integers), and afterwards every residual, folded into "grad"
// (ResidualStore::fold_into, through the placements "grad@hier" and its inner ones record), is 0.
TEST(HierarchicalAllreduce, AWorkerResidualItDoesNotCompensateIsDeliveredNotStranded) {
  MpiTransport world(MPI_COMM_WORLD);
  const auto codec = make_codec("none:ef=on");
  ASSERT_TRUE(codec->spec().error_feedback);
  for (int ranks_per_node : node_sizes(world.size())) {
    Topology topology = make_topology(world, ranks_per_node);
    for (std::size_t count : {std::size_t{5}, std::size_t{1000}}) {
      SCOPED_TRACE(std::to_string(ranks_per_node) + " ranks per node, count " + std::to_string(count));
      ResidualStore store = fresh_store(world);
      const std::vector<float> left = testing::integer_contribution(count, world.rank(), kSeed + 1);
      std::copy(left.begin(), left.end(), store.residual("grad", count).begin());
      std::vector<double> expected(count);
      const std::vector<float> mine = contribution(count, world.rank());
      for (std::size_t i = 0; i < count; ++i) expected[i] = double{mine[i]} + double{left[i]};
      MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
      const Outcome outcome = run_hierarchical(world, topology, *codec, count, store, Algorithm::sra);
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(double{outcome.data[i]}, expected[i]) << "element " << i;
      store.fold_into("grad", count);
      EXPECT_EQ(store.names(), std::vector<std::string>{"grad"});
      for (const float e : store.residual("grad")) ASSERT_EQ(e, 0.0f);
    }
  }
}

TEST(HierarchicalAllreduce, ShardsDrawDifferentRandomNumbers) {
  MpiTransport world(MPI_COMM_WORLD);
  const int ranks = world.size();
  const std::unique_ptr<Codec> codec = make_codec("qsgd:bits=4");
  const std::size_t count = 3840;
  int checked = 0;
  for (int ranks_per_node : node_sizes(ranks)) {
    Topology topology = make_topology(world, ranks_per_node);
    if (topology.shards < 2) continue;
    SCOPED_TRACE(std::to_string(ranks_per_node) + " ranks per node");
    const std::size_t shard = count / static_cast<std::size_t>(topology.shards);
    const std::vector<float> pattern = testing::gaussian_contribution(shard, world.rank(), 9);
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = pattern[i % shard];
    CollectiveStats stats;
    ReduceJob job{world, *codec, data, "grad", nullptr, EncodeContext{}, stats};
    collectives::hierarchical_allreduce(job, *topology.intra, *topology.inter,
                                        Algorithm::auto_select);
    const std::span<const float> result(data);
    EXPECT_FALSE(same_bits(result.first(shard), result.subspan(shard, shard)))
        << "shards 0 and 1 were rounded with the same random numbers";
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no node layout with two or more shards at one rank";
}

// Transports that do not form nodes and per-local-index groups are refused on every rank (here
// the whole world as both the node and the cross-node group: P ranks of local index 0..P-1,
// but an "inter" group of P ranks where one per node (1) is expected).
TEST(HierarchicalAllreduce, TransportsThatAreNotNodesAreRefusedOnEveryRank) {
  MpiTransport world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "one rank is always one node";
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::vector<float> data = contribution(7, world.rank());
  CollectiveStats stats;
  ReduceJob job{world, *codec, data, "grad", nullptr, EncodeContext{}, stats};
  std::string text;
  EXPECT_EQ(testing::error_code_of(
                [&] { collectives::hierarchical_allreduce(job, world, world, Algorithm::ring); },
                &text),
            ErrorCode::invalid_argument);
  EXPECT_NE(text.find("expected one per node (1)"), std::string::npos) << text;
}

// A failure in the cross-node stage on one rank of a node reaches every rank of that node, and
// nobody hangs: one node of P ranks; rank 0's residual for "grad@hier" is registered with the
// wrong size (ResizePolicy::error), so its error-feedback encode throws size_mismatch; the
// other ranks finish their shards, gather, and then throw internal naming local rank 0 instead
// of returning a result with shard 0 missing.
TEST(HierarchicalAllreduce, AFailedShardMakesEveryRankOfTheNodeThrow) {
  MpiTransport world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a node of two or more ranks";
  Topology topology = make_topology(world, world.size());
  const std::unique_ptr<Codec> codec = make_codec("sign");
  const std::size_t count = 4097;
  ResidualStore store = fresh_store(world);
  if (world.rank() == 0) store.residual("grad@hier", count + 1);
  std::string text;
  const ErrorCode code = testing::error_code_of(
      [&] { run_hierarchical(world, topology, *codec, count, store); }, &text);
  if (world.rank() == 0) {
    EXPECT_EQ(code, ErrorCode::size_mismatch) << text;
  } else {
    EXPECT_EQ(code, ErrorCode::internal) << text;
    EXPECT_NE(text.find("failed on local rank 0"), std::string::npos) << text;
  }
}

TEST(HierarchicalAllreduce, AHierarchicalInnerAlgorithmIsRefusedOnEveryRank) {
  MpiTransport world(MPI_COMM_WORLD);
  Topology topology = make_topology(world, 2 <= world.size() ? 2 : 1);
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::vector<float> data = contribution(7, world.rank());
  CollectiveStats stats;
  ReduceJob job{world, *codec, data, "grad", nullptr, EncodeContext{}, stats};
  EXPECT_EQ(testing::error_code_of([&] {
              collectives::hierarchical_allreduce(job, *topology.intra, *topology.inter,
                                                  Algorithm::hier);
            }),
            ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace gradzip
