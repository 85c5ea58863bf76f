// Recursive halving/doubling (collectives/halving_doubling_allreduce.cpp) and the binomial tree
// (collectives/tree_allreduce.cpp) at any world size (ctest runs np 1..5, 6 and 8, so powers of
// two and folded ranks are both covered): the exact sum for `none`, the byte accounting, the
// exact structure for the context-free codecs (recomputed here from every rank's data), derived
// bounds for qsgd and the sparse codecs, every codec byte-identical on every rank, error
// feedback telescoping exactly on integer data with residuals of the documented keys and
// sizes, counts 0, 1 and below P, and f16 / bf16 tensors with sum and average through the
// Communicator.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::shard_begin;
using error_feedback::ResidualStore;

constexpr std::size_t kCounts[] = {0, 1, 2, 7, 1000, 4097};
constexpr double kF32Unit = 0x1p-24;

std::size_t as_index(int r) { return static_cast<std::size_t>(r); }

enum class Algo { rhd, tree };
const char* algo_name(Algo algo) { return algo == Algo::rhd ? "rhd" : "tree"; }

CollectiveStats run(Algo algo, const Codec& codec, std::span<float> data,
                    ResidualStore* residuals = nullptr, std::uint32_t step = 0,
                    const std::string& name = "layer.weight") {
  MpiTransport transport(MPI_COMM_WORLD);
  CollectiveStats stats;
  collectives::ReduceJob job{transport, codec, data, name, residuals, EncodeContext{7, step, 3, 0},
                             stats};
  if (algo == Algo::rhd)
    collectives::halving_doubling_allreduce(job);
  else
    collectives::tree_allreduce(job);
  return stats;
}

// ---- the halving/doubling geometry, restated from the file comment ----------------------------

struct Geometry {
  int ranks = 1, p2 = 1, extra = 0, steps = 0;
  explicit Geometry(int p) : ranks(p) {
    while (2 * p2 <= p) p2 *= 2;
    extra = p - p2;
    while ((1 << steps) < p2) ++steps;
  }
  int world_of(int h) const { return h < extra ? 2 * h : h + extra; }
  // -1 for a folded rank.
  int index_of(int rank) const {
    if (rank < 2 * extra) return rank % 2 == 1 ? -1 : rank / 2;
    return rank - extra;
  }
  bool has_folded_partner(int rank) const { return rank < 2 * extra && rank % 2 == 0; }
  // Halving step k of index h holding blocks [lo, lo + 2m): {keep_lo, send_lo, m}.
  struct Step {
    int keep_lo, send_lo, m;
  };
  Step step(int h, int k, int lo) const {
    const int m = p2 >> (k + 1);
    return (h & m) != 0 ? Step{lo + m, lo, m} : Step{lo, lo + m, m};
  }
};

std::size_t range_begin(std::size_t n, const Geometry& g, int b) { return shard_begin(n, g.p2, b); }

// The halving/doubling result recomputed from every rank's data (no error feedback), valid for
// codecs whose encode ignores the EncodeContext (none, fp16, bf16, sign, exact top-k): the fold
// (decode_add of the folded rank's message), the halving steps (all messages of a step formed
// before any is added), the owner's encode, every block decoded.
std::vector<float> rhd_reference(const Codec& codec, const std::vector<std::vector<float>>& all,
                                 std::size_t n) {
  const Geometry g(static_cast<int>(all.size()));
  std::vector<std::vector<float>> held(as_index(g.p2));
  for (int h = 0; h < g.p2; ++h) {
    held[as_index(h)] = all[as_index(g.world_of(h))];
    if (h < g.extra) {
      const auto message =
          testing::encode_message(codec, host_view(all[as_index(2 * h + 1)].data(), n));
      codec.decode_add(message, held[as_index(h)].data(), n);
    }
  }
  std::vector<int> lo(as_index(g.p2), 0);
  for (int k = 0; k < g.steps; ++k) {
    std::vector<std::vector<std::byte>> messages(as_index(g.p2));
    for (int h = 0; h < g.p2; ++h) {
      const Geometry::Step s = g.step(h, k, lo[as_index(h)]);
      const std::size_t begin = range_begin(n, g, s.send_lo),
                        end = range_begin(n, g, s.send_lo + s.m);
      messages[as_index(h)] =
          testing::encode_message(codec, host_view(held[as_index(h)].data() + begin, end - begin));
    }
    for (int h = 0; h < g.p2; ++h) {
      const Geometry::Step s = g.step(h, k, lo[as_index(h)]);
      const std::size_t begin = range_begin(n, g, s.keep_lo),
                        end = range_begin(n, g, s.keep_lo + s.m);
      codec.decode_add(messages[as_index(h ^ s.m)], held[as_index(h)].data() + begin, end - begin);
      lo[as_index(h)] = s.keep_lo;
    }
  }
  std::vector<float> result(n);
  for (int h = 0; h < g.p2; ++h) {
    const std::size_t begin = range_begin(n, g, h), count = range_begin(n, g, h + 1) - begin;
    const auto message =
        testing::encode_message(codec, host_view(held[as_index(h)].data() + begin, count));
    codec.decode(message, host_view(result.data() + begin, count));
  }
  return result;
}

// The tree's result for context-free codecs on integer data (every f32 partial sum exact, so
// the reduce order does not matter): D(C(exact sum)).
std::vector<float> tree_reference(const Codec& codec, const std::vector<std::vector<float>>& all,
                                  std::size_t n) {
  std::vector<float> sum(n, 0.0f);
  for (const auto& x : all)
    for (std::size_t i = 0; i < n; ++i) sum[i] += x[i];
  const auto message = testing::encode_message(codec, host_view(sum.data(), n));
  return testing::decode_to_f32(codec, message, n);
}

// ---- codec none: the exact sum -----------------------------------------------------------------

TEST(HalvingDoublingAndTree, NoneGivesTheExactSumEqualToMpiAllreduce) {
  const auto codec = make_codec("none");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  std::vector<std::size_t> counts(std::begin(kCounts), std::end(kCounts));
  counts.push_back((std::size_t{1} << 18) + 3);
  for (Algo algo : {Algo::rhd, Algo::tree}) {
    for (std::size_t n : counts) {
      SCOPED_TRACE(std::string(algo_name(algo)) + ", count " + std::to_string(n));
      std::vector<float> data = testing::integer_contribution(n, rank, 11);
      std::vector<float> mpi_sum = data;
      MPI_Allreduce(MPI_IN_PLACE, mpi_sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      run(algo, *codec, data);
      // Integers in [-1000, 1000] over few ranks: every f32 partial sum is exact.
      const std::size_t wrong = testing::first_difference_from_integer_sum(data, ranks, 11);
      EXPECT_EQ(wrong, n) << "element " << wrong << " differs from the exact sum";
      EXPECT_TRUE(testing::same_bits(data, mpi_sum));
      EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
    }
  }
}

// ---- bytes on the wire (docs/algorithms.md), codec none: e(m) = 32 + 4m ------------------------

TEST(HalvingDoubling, StatsCountEveryMessageOnce) {
  const auto codec = make_codec("none");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const Geometry g(ranks);
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{4097}}) {
    SCOPED_TRACE("count " + std::to_string(n));
    std::vector<float> data = testing::integer_contribution(n, rank, 5);
    const CollectiveStats stats = run(Algo::rhd, *codec, data);
    const auto e = [](std::size_t m) { return std::uint64_t{32} + 4 * m; };
    std::uint64_t sent = 0, received = 0, messages = 0, encoded_in = 0, encoded_out = 0;
    const int h = g.index_of(rank);
    if (h < 0) {
      sent = e(n), messages = 1, encoded_in = 4 * n, encoded_out = e(n);
      received = 32 * as_index(g.p2) + 4 * n;
    } else {
      if (g.has_folded_partner(rank)) {
        received += e(n);
        sent += 32 * as_index(g.p2) + 4 * n;
        messages += as_index(g.p2);
      }
      int lo = 0;
      for (int k = 0; k < g.steps; ++k) {
        const Geometry::Step s = g.step(h, k, lo);
        const std::size_t send = range_begin(n, g, s.send_lo + s.m) - range_begin(n, g, s.send_lo);
        const std::size_t keep = range_begin(n, g, s.keep_lo + s.m) - range_begin(n, g, s.keep_lo);
        sent += e(send), received += e(keep), ++messages;
        encoded_in += 4 * send, encoded_out += e(send);
        lo = s.keep_lo;
      }
      const std::size_t owned = range_begin(n, g, h + 1) - range_begin(n, g, h);
      encoded_in += 4 * owned, encoded_out += e(owned);
      for (int m = 1; m < g.p2; m *= 2) {
        const int mine = h & ~(m - 1), theirs = (h ^ m) & ~(m - 1);
        sent += 32 * as_index(m) + 4 * (range_begin(n, g, mine + m) - range_begin(n, g, mine));
        received +=
            32 * as_index(m) + 4 * (range_begin(n, g, theirs + m) - range_begin(n, g, theirs));
        messages += as_index(m);
      }
    }
    EXPECT_EQ(stats.sent_header_bytes, 32 * messages);
    EXPECT_EQ(stats.sent_index_bytes, 0u);
    EXPECT_EQ(stats.sent_bytes(), sent);
    EXPECT_EQ(stats.received_bytes, received);
    EXPECT_EQ(stats.encoded_input_bytes, encoded_in);
    EXPECT_EQ(stats.encoded_message_bytes, encoded_out);
    EXPECT_DOUBLE_EQ(stats.compression_ratio,
                     static_cast<double>(encoded_in) / static_cast<double>(encoded_out));
  }
}

// Tree, codec none: rank r != 0 sends its f32 partial sum once; every rank forwards rank 0's
// message to each child r + m, m < lowbit(r) (all m < P for rank 0).
TEST(Tree, StatsCountEveryMessageOnce) {
  const auto codec = make_codec("none");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::size_t n = 4097, e = 32 + 4 * n;
  std::vector<float> data = testing::integer_contribution(n, rank, 5);
  const CollectiveStats stats = run(Algo::tree, *codec, data);
  int lowest = 1;
  while (lowest < ranks) lowest *= 2;
  if (rank != 0) lowest = rank & -rank;
  std::uint64_t children = 0, reduce_children = 0;
  for (int m = lowest / 2; m >= 1; m /= 2)
    if (rank + m < ranks) ++children;
  for (int m = 1; m < ranks && (rank & m) == 0; m *= 2)
    if (rank + m < ranks) ++reduce_children;
  const std::uint64_t sent_messages = (rank != 0 ? 1 : 0) + children;
  EXPECT_EQ(stats.sent_header_bytes, 32 * sent_messages);
  EXPECT_EQ(stats.sent_bytes(), sent_messages * e);
  EXPECT_EQ(stats.received_bytes, (reduce_children + (rank != 0 ? 1 : 0)) * e);
  // One encode per rank: its partial sum (none) on ranks != 0, the final message on rank 0.
  EXPECT_EQ(stats.encoded_input_bytes, 4 * n);
}

// ---- lossy codecs ------------------------------------------------------------------------------

// Codecs whose encode ignores the EncodeContext: the result is the structure recomputed here,
// bit for bit, on every rank.
TEST(HalvingDoublingAndTree, ContextFreeCodecsEqualTheRecomputedStructure) {
  const int rank = testing::world_rank();
  for (const char* spec : {"none", "fp16", "bf16", "sign:bucket=64", "topk:ratio=0.05"}) {
    const auto codec = make_codec(spec);
    for (Algo algo : {Algo::rhd, Algo::tree}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}}) {
        SCOPED_TRACE(std::string(spec) + ", " + algo_name(algo) + ", count " + std::to_string(n));
        // Integer data keeps the tree's f32 reduce exact in any order; rhd's structure is
        // recomputed in its own order, so Gaussian data checks it there.
        std::vector<float> data = algo == Algo::tree
                                      ? testing::integer_contribution(n, rank, 17, 300)
                                      : testing::gaussian_contribution(n, rank, 17);
        const auto all = testing::gather_all(data);
        const std::vector<float> expected =
            algo == Algo::rhd ? rhd_reference(*codec, all, n) : tree_reference(*codec, all, n);
        run(algo, *codec, data);
        EXPECT_TRUE(testing::same_bits(data, expected));
        EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
      }
    }
  }
}

// qsgd:bits=b (s = 2^(b-1) - 1 levels; a compression of y errs by at most scale/s + 2^-20 scale
// with scale <= Y = max |y| of the message, see test_sra_allreduce.cpp), with M = max |x_r,i|
// and A = max_i sum_r |x_r,i| over all ranks:
//   rhd: the fold (x folded messages hold element i, each one contribution: x eps(M)); halving
//     step k: P'/2^(k+1) messages hold element i, each a partial sum of at most
//     w 2^k contributions (w = 2 with folds) plus the error so far E, so |y| <= Y_k =
//     min(w 2^k M, A) + E; each message's decode_add adds an f32 rounding <= u (A + E); the
//     owner's encode of the full sum: eps(A + E).
//   tree: the exact f32 sum (P - 1 adds, <= (P - 1) u A) and one encode: eps(A (1 + P u)).
double qsgd_bound(Algo algo, int bits, int ranks, double M, double A) {
  const double levels = static_cast<double>((1 << (bits - 1)) - 1);
  const auto eps = [&](double y) { return y / levels + 0x1p-20 * y; };
  if (algo == Algo::tree) {
    const double adds = (ranks - 1) * kF32Unit * A;
    return (adds + eps(A + adds)) * (1 + 0x1p-20);
  }
  const Geometry g(ranks);
  double error = g.extra * (eps(M) + kF32Unit * A);
  const double w = g.extra > 0 ? 2 : 1;
  for (int k = 0; k < g.steps; ++k) {
    const double count = static_cast<double>(g.p2 >> (k + 1));
    const double y = std::min(w * (1 << k) * M, A) + error;
    error += count * (eps(y) + kF32Unit * (A + error));
  }
  return (error + eps(A + error)) * (1 + 0x1p-20);
}

TEST(HalvingDoublingAndTree, QsgdErrorWithinTheDerivedBound) {
  const int ranks = testing::world_size(), rank = testing::world_rank();
  for (int bits : {2, 4, 8}) {
    const auto codec = make_codec("qsgd:bucket=128,bits=" + std::to_string(bits));
    for (Algo algo : {Algo::rhd, Algo::tree}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}}) {
        SCOPED_TRACE(std::to_string(bits) + " bits, " + algo_name(algo) + ", count " +
                     std::to_string(n));
        std::vector<float> data = testing::gaussian_contribution(n, rank, 31 + bits);
        const auto all = testing::gather_all(data);
        double M = 0, A = 0;
        std::vector<double> exact(n, 0.0);
        for (std::size_t i = 0; i < n; ++i) {
          double magnitude = 0;
          for (const auto& x : all) {
            exact[i] += x[i];
            magnitude += std::abs(static_cast<double>(x[i]));
            M = std::max(M, std::abs(static_cast<double>(x[i])));
          }
          A = std::max(A, magnitude);
        }
        const double bound = qsgd_bound(algo, bits, ranks, M, A);
        run(algo, *codec, data);
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(data[i] - exact[i]));
        EXPECT_LE(worst, bound);
        EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
      }
    }
  }
}

// Top-k and random-k with f32 values decode every element to its exact value or 0, so every
// partial sum (and the result) is the f32 sum of a subset of the contributions:
// |result_i - exact_i| <= sum of the dropped |x_r,i| + the adds' rounding <= A_i (1 + P u).
// And the result is one owner message per block (rhd: the P' blocks; tree: the whole tensor),
// so each block holds between 1 (Gaussian data: a kept sum is not 0) and k_for(block size)
// non-zero values.
TEST(HalvingDoublingAndTree, SparseCodecsLoseAtMostTheDroppedContributions) {
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const Geometry g(ranks);
  for (const char* spec : {"topk:ratio=0.1,approx=on", "randk:ratio=0.25"}) {
    const auto codec = make_codec(spec);
    for (Algo algo : {Algo::rhd, Algo::tree}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}}) {
        SCOPED_TRACE(std::string(spec) + ", " + algo_name(algo) + ", count " + std::to_string(n));
        std::vector<float> data = testing::gaussian_contribution(n, rank, 37);
        const auto all = testing::gather_all(data);
        run(algo, *codec, data);
        std::size_t outside = n;
        for (std::size_t i = 0; i < n && outside == n; ++i) {
          double exact = 0, magnitude = 0;
          for (const auto& x : all) exact += x[i], magnitude += std::abs(static_cast<double>(x[i]));
          if (!(std::abs(data[i] - exact) <= magnitude * (1 + ranks * kF32Unit))) outside = i;
        }
        EXPECT_EQ(outside, n) << "element " << outside;
        const int blocks = algo == Algo::rhd ? g.p2 : 1;
        for (int b = 0; b < blocks; ++b) {
          const std::size_t begin = shard_begin(n, blocks, b), end = shard_begin(n, blocks, b + 1);
          if (begin == end) continue;
          const auto nonzero = static_cast<std::size_t>(std::count_if(
              data.begin() + static_cast<std::ptrdiff_t>(begin),
              data.begin() + static_cast<std::ptrdiff_t>(end), [](float v) { return v != 0.0f; }));
          EXPECT_GE(nonzero, 1u) << "block " << b;
          EXPECT_LE(nonzero, codec->spec().k_for(end - begin)) << "block " << b;
        }
        EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
      }
    }
  }
}

// Every codec variant runs at every count (0, 1, below P) and ends byte-identical everywhere.
TEST(HalvingDoublingAndTree, EveryCodecEndsByteIdenticalOnEveryRank) {
  const int rank = testing::world_rank();
  for (const char* spec : testing::kAllCodecs) {
    const auto codec = make_codec(spec);
    for (Algo algo : {Algo::rhd, Algo::tree}) {
      for (std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}}) {
        SCOPED_TRACE(std::string(spec) + ", " + algo_name(algo) + ", count " + std::to_string(n));
        std::vector<float> data = testing::gaussian_contribution(n, rank, 41);
        run(algo, *codec, data);
        ASSERT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
        for (float v : data) ASSERT_TRUE(std::isfinite(v));
      }
    }
  }
}

// ---- error feedback ----------------------------------------------------------------------------

// The residuals each rank holds after a call, as (key, first element of the tensor it covers,
// size): the documented layout (collectives/halving_doubling_allreduce.cpp).
struct ResidualPlace {
  std::string key;
  std::size_t begin, count;
};

std::vector<ResidualPlace> rhd_residual_places(const std::string& name, std::size_t n, int rank,
                                               int ranks) {
  const Geometry g(ranks);
  const int h = g.index_of(rank);
  std::vector<ResidualPlace> places;
  if (h < 0 || g.steps > 0) places.push_back({name, 0, n});
  if (h < 0) return places;
  int lo = 0;
  for (int k = 0; k < g.steps; ++k) {
    const Geometry::Step s = g.step(h, k, lo);
    const std::size_t begin = range_begin(n, g, s.send_lo);
    if (k > 0)
      places.push_back({collectives::residual_key(collectives::ResidualRole::halving_step, name, k), begin,
                        range_begin(n, g, s.send_lo + s.m) - begin});
    lo = s.keep_lo;
  }
  const std::size_t owned = range_begin(n, g, h);
  places.push_back(
      {collectives::residual_key(collectives::ResidualRole::halving_owner, name), owned, range_begin(n, g, h + 1) - owned});
  return places;
}

// Exact top-k with f32 values on integer data: g + e, D(C(.)) (each element its value or 0),
// g + e - D and every partial sum are integers below 2^24, so f32 does them exactly and error
// feedback telescopes with no rounding at all:
//   sum over calls of the result + sum over ranks and residuals (placed at the elements they
//   cover) == sum over calls and ranks of the inputs, element for element.
TEST(HalvingDoublingAndTree, ErrorFeedbackTelescopesExactlyOnIntegerData) {
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const auto codec = make_codec("topk:ratio=0.05");
  const std::string name = "layer.weight";
  for (Algo algo : {Algo::rhd, Algo::tree}) {
    for (std::size_t n : {std::size_t{3}, std::size_t{1000}}) {
      SCOPED_TRACE(std::string(algo_name(algo)) + ", count " + std::to_string(n));
      ResidualStore store(static_cast<std::uint32_t>(ranks), static_cast<std::uint32_t>(rank),
                          ResizePolicy::error);
      std::vector<double> inputs(n, 0.0), outputs(n, 0.0);
      for (std::uint32_t step = 0; step < 12; ++step) {
        std::vector<float> data = testing::integer_contribution(n, rank, 500 + step, 100);
        for (std::size_t i = 0; i < n; ++i) inputs[i] += data[i];
        run(algo, *codec, data, &store, step, name);
        for (std::size_t i = 0; i < n; ++i) outputs[i] += data[i];
        ASSERT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
      }
      const std::vector<ResidualPlace> places =
          algo == Algo::rhd ? rhd_residual_places(name, n, rank, ranks)
          : rank == 0
              ? std::vector<ResidualPlace>{{collectives::residual_key(collectives::ResidualRole::tree_root, name), 0, n}}
              : std::vector<ResidualPlace>{};
      EXPECT_EQ(store.size(), places.size());
      std::vector<double> residuals(n, 0.0);
      for (const ResidualPlace& place : places) {
        ASSERT_TRUE(store.contains(place.key)) << place.key;
        const std::span<const float> e = store.residual(place.key);
        ASSERT_EQ(e.size(), place.count) << place.key;
        for (std::size_t j = 0; j < e.size(); ++j) residuals[place.begin + j] += e[j];
      }
      MPI_Allreduce(MPI_IN_PLACE, inputs.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, residuals.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
      double undelivered = 0;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(outputs[i] + residuals[i], inputs[i]) << "element " << i;
        undelivered = std::max(undelivered, std::abs(outputs[i] - inputs[i]));
      }
      // The residuals carry real mass (5 % density of 1000 elements drops most of them).
      if (n == 1000) {
        EXPECT_GT(undelivered, 0.0);
      }
    }
  }
}

// A worker residual "<name>" that these algorithms' encodes do not compensate (left by another
// algorithm for the same name, as algo=auto may switch, or holding residuals folded into it)
// must reach the result, not be stranded: with the lossless `none` codec through error
// feedback, one call delivers every rank's input plus every rank's old worker residual exactly
// (integers), and afterwards every residual, folded into "<name>" (ResidualStore::fold_into,
// which also checks the placements the algorithms record), is zero.
TEST(HalvingDoublingAndTree, AWorkerResidualTheyDoNotCompensateIsDeliveredNotStranded) {
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const auto codec = make_codec("none");
  const std::string name = "layer.weight";
  for (Algo algo : {Algo::rhd, Algo::tree}) {
    for (std::size_t n : {std::size_t{3}, std::size_t{1000}}) {
      SCOPED_TRACE(std::string(algo_name(algo)) + ", count " + std::to_string(n));
      ResidualStore store(static_cast<std::uint32_t>(ranks), static_cast<std::uint32_t>(rank),
                          ResizePolicy::error);
      const std::vector<float> left = testing::integer_contribution(n, rank, 900, 50);
      std::copy(left.begin(), left.end(), store.residual(name, n).begin());
      std::vector<float> data = testing::integer_contribution(n, rank, 901, 50);
      std::vector<double> expected(n);
      for (std::size_t i = 0; i < n; ++i) expected[i] = double{data[i]} + double{left[i]};
      MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
      run(algo, *codec, data, &store, 0, name);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(double{data[i]}, expected[i]) << "element " << i;
      store.fold_into(name, n);
      EXPECT_EQ(store.names(), std::vector<std::string>{name});
      for (const float e : store.residual(name)) ASSERT_EQ(e, 0.0f);
    }
  }
}

// qsgd's residuals have the documented keys and sizes too, and a second call with error
// feedback differs from the same call without it (the residual is added before encoding).
TEST(HalvingDoubling, QsgdResidualsHaveTheDocumentedKeysAndChangeTheNextCall) {
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const auto codec = make_codec("qsgd:bits=2,bucket=64");
  const std::string name = "w";
  const std::size_t n = 999;
  ResidualStore store(static_cast<std::uint32_t>(ranks), static_cast<std::uint32_t>(rank),
                      ResizePolicy::error);
  std::vector<float> first = testing::gaussian_contribution(n, rank, 3);
  run(Algo::rhd, *codec, first, &store, 0, name);
  const std::vector<ResidualPlace> places = rhd_residual_places(name, n, rank, ranks);
  ASSERT_EQ(store.size(), places.size());
  bool any_nonzero = false;
  for (const ResidualPlace& place : places) {
    ASSERT_TRUE(store.contains(place.key)) << place.key;
    const auto e = store.residual(place.key);
    ASSERT_EQ(e.size(), place.count) << place.key;
    any_nonzero = any_nonzero || std::any_of(e.begin(), e.end(), [](float v) { return v != 0.0f; });
  }
  EXPECT_TRUE(any_nonzero);
  std::vector<float> with_ef = testing::gaussian_contribution(n, rank, 4), without = with_ef;
  run(Algo::rhd, *codec, with_ef, &store, 1, name);
  run(Algo::rhd, *codec, without, nullptr, 1, name);
  EXPECT_FALSE(testing::same_bits(with_ef, without));
}

// ---- through the Communicator: dtypes, sum and average ----------------------------------------

TEST(HalvingDoublingAndTree, CommunicatorReducesF32F16AndBf16WithSumAndAverage) {
  Communicator comm = Communicator::world();
  const int ranks = testing::world_size(), rank = testing::world_rank();
  for (Algo algo : {Algo::rhd, Algo::tree}) {
    const CompressionSpec spec =
        CompressionSpec::parse(std::string("none:algo=") + algo_name(algo));
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{300}}) {
          SCOPED_TRACE(::testing::Message()
                       << algo_name(algo) << " " << dtype_name(dtype)
                       << (op == ReduceOp::sum ? " sum" : " average") << " count=" << n);
          // Multiples of P, small enough that f16 / bf16 hold every value and sum exactly
          // (bf16: integers up to 256; |x| <= 8 * 4, |sum| <= 8 * 32): x / P is an integer, so
          // the average is exact too.
          std::vector<double> exact(n, 0.0);
          for (int r = 0; r < ranks; ++r) {
            const std::vector<float> x = testing::integer_contribution(n, r, 61, 4);
            for (std::size_t i = 0; i < n; ++i)
              exact[i] += op == ReduceOp::sum ? ranks * x[i] : x[i];
          }
          std::vector<float> values = testing::integer_contribution(n, rank, 61, 4);
          for (float& v : values) v *= static_cast<float>(ranks);
          testing::HostTensor tensor(dtype, values);
          const CollectiveStats stats = comm.allreduce(tensor.view(), "t", spec, op);
          EXPECT_EQ(stats.algorithm, algo_name(algo));
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(tensor.at(i), exact[i]) << "element " << i;
          EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(tensor.to_f32())));
        }
      }
    }
    // A lossy codec through the Communicator: the same algorithm, identical bytes everywhere.
    const CompressionSpec lossy =
        CompressionSpec::parse(std::string("qsgd:bits=4,algo=") + algo_name(algo));
    std::vector<float> values = testing::gaussian_contribution(513, rank, 67);
    const CollectiveStats stats =
        comm.allreduce(host_view(values.data(), values.size()), "q", lossy);
    EXPECT_EQ(stats.algorithm, algo_name(algo));
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(values)));
  }
}

}  // namespace
}  // namespace gradzip
