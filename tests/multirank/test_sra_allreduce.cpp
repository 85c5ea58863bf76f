// Scatter-reduce-allgather (collectives/sra_allreduce.cpp) at any world size: the exact sum for
// `none`, derived error bounds for qsgd / fp16 / top-k, the exact two-stage structure for the
// deterministic codecs (sign, fp16, top-k), byte-identical results on every rank, the shards
// of sra_reduce_scatter, the byte accounting, error feedback with the server-side residual
// over many calls, and malformed size tables or messages making every rank throw together.
#include <gtest/gtest.h>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::shard_begin;
using error_feedback::ResidualStore;

constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;
constexpr std::size_t kSmallCounts[] = {0, 1, 7, 4097};
// Unit roundoff of f32 round-to-nearest: |fl(a op b) - (a op b)| <= kF32Unit * |fl(a op b)|.
constexpr double kF32Unit = 0x1p-24;

std::size_t as_index(int r) { return static_cast<std::size_t>(r); }

// Runs SRA over MPI_COMM_WORLD (or a tampering wrapper) on one rank's data.
struct SraRunner {
  explicit SraRunner(collectives::Transport& transport_) : transport(transport_) {}

  collectives::Transport& transport;
  CollectiveStats stats;

  void allreduce(const Codec& codec, std::span<float> data, ResidualStore* residuals = nullptr,
                 std::uint32_t step = 0, const std::string& name = "layer.weight") {
    collectives::ReduceJob job{transport, codec, data, name, residuals,
                               EncodeContext{7, step, 3, 0}, stats};
    collectives::sra_allreduce(job);
  }
  void reduce_scatter(const Codec& codec, std::span<float> data) {
    collectives::ReduceJob job{transport, codec, data, "layer.weight", nullptr, EncodeContext{},
                               stats};
    collectives::sra_reduce_scatter(job);
  }
};

std::vector<double> exact_sum_of(const std::vector<std::vector<float>>& all, std::size_t n) {
  std::vector<double> sum(n, 0.0);
  for (const auto& contribution : all)
    for (std::size_t i = 0; i < n; ++i) sum[i] += contribution[i];
  return sum;
}

// The SRA result computed independently from every rank's data: per chunk c of P, the f32 sum
// in rank order of D(C(x_r[chunk])), then (server_stage) D(C(that sum)). Only valid for codecs
// whose encode ignores the EncodeContext (none, fp16, bf16, sign, exact top-k).
std::vector<float> two_stage_reference(const Codec& codec,
                                       const std::vector<std::vector<float>>& all, std::size_t n,
                                       bool server_stage) {
  const int ranks = static_cast<int>(all.size());
  std::vector<float> result(n, 0.0f);
  for (int c = 0; c < ranks; ++c) {
    const std::size_t begin = shard_begin(n, ranks, c), count = shard_begin(n, ranks, c + 1) - begin;
    std::vector<float> sum(count, 0.0f);
    for (const auto& x : all) {
      const auto message = testing::encode_message(codec, host_view(x.data() + begin, count));
      codec.decode_add(message, sum.data(), count);
    }
    if (server_stage) {
      const auto message = testing::encode_message(codec, host_view(sum.data(), count));
      sum = testing::decode_to_f32(codec, message, count);
    }
    std::copy(sum.begin(), sum.end(), result.begin() + static_cast<std::ptrdiff_t>(begin));
  }
  return result;
}

// Index of the first element where |result - exact| exceeds bound (n when none does).
std::size_t first_outside_bound(std::span<const float> result, const std::vector<double>& exact,
                                const std::vector<double>& bound) {
  for (std::size_t i = 0; i < result.size(); ++i)
    if (!(std::abs(static_cast<double>(result[i]) - exact[i]) <= bound[i])) return i;
  return result.size();
}

// ---- codec none: the exact sum ----------------------------------------------------------------

TEST(SraAllreduce, NoneGivesTheExactSumEqualToMpiAllreduce) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("none");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
  counts.push_back(kLargeCount);
  for (std::size_t n : counts) {
    SCOPED_TRACE("count " + std::to_string(n));
    std::vector<float> data = testing::integer_contribution(n, rank, 11);
    std::vector<float> mpi_sum = data;
    MPI_Allreduce(MPI_IN_PLACE, mpi_sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    SraRunner runner{transport};
    runner.allreduce(*codec, data);
    // Integers in [-1000, 1000] over few ranks: every f32 partial sum is exact.
    const std::size_t wrong = testing::first_difference_from_integer_sum(data, ranks, 11);
    EXPECT_EQ(wrong, n) << "element " << wrong << " differs from the exact sum";
    EXPECT_TRUE(testing::same_bits(data, mpi_sum));
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
  }
}

// Bytes on the wire for `none` (32-byte header + 4 bytes per element per message):
// scatter-reduce sends the P - 1 foreign chunks once each; the all-gather sends the owned chunk
// to P - 1 ranks. Received bytes mirror that. Encoded: the P worker messages and the owner's.
TEST(SraAllreduce, StatsCountEveryMessageOnce) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("none");
  const std::size_t ranks = as_index(testing::world_size()), rank = as_index(testing::world_rank());
  const std::size_t n = 4097;
  const std::size_t owned = shard_begin(n, static_cast<int>(ranks), static_cast<int>(rank) + 1) -
                            shard_begin(n, static_cast<int>(ranks), static_cast<int>(rank));
  std::vector<float> data = testing::integer_contribution(n, static_cast<int>(rank), 5);
  SraRunner runner{transport};
  runner.allreduce(*codec, data);
  const CollectiveStats& stats = runner.stats;
  EXPECT_EQ(stats.sent_header_bytes, 2 * (ranks - 1) * 32);
  EXPECT_EQ(stats.sent_index_bytes, 0u);
  EXPECT_EQ(stats.sent_payload_bytes, 4 * (n - owned) + (ranks - 1) * 4 * owned);
  EXPECT_EQ(stats.received_bytes, (ranks - 1) * (32 + 4 * owned) + (ranks - 1) * 32 + 4 * (n - owned));
  EXPECT_EQ(stats.encoded_input_bytes, 4 * (n + owned));
  EXPECT_EQ(stats.encoded_message_bytes, 32 * ranks + 4 * n + 32 + 4 * owned);
  EXPECT_DOUBLE_EQ(stats.compression_ratio,
                   static_cast<double>(4 * (n + owned)) / static_cast<double>(32 * ranks + 4 * n + 32 + 4 * owned));
  EXPECT_GT(stats.encode_seconds + stats.decode_seconds, 0.0);
}

TEST(SraReduceScatter, NoneShardsHoldTheExactSumOfTheirSlice) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("none");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  for (std::size_t n : kSmallCounts) {
    SCOPED_TRACE("count " + std::to_string(n));
    std::vector<float> data = testing::integer_contribution(n, rank, 23);
    SraRunner runner{transport};
    runner.reduce_scatter(*codec, data);
    const std::vector<double> exact = testing::exact_sum(
        n, ranks, 23, [](std::size_t c, int r, std::uint64_t s) {
          return testing::integer_contribution(c, r, s);
        });
    // Uneven shards: 4097 over 2..5 ranks and 7 over 2..5 ranks differ by one element; 1 over
    // P > 1 leaves empty shards.
    for (std::size_t i = shard_begin(n, ranks, rank); i < shard_begin(n, ranks, rank + 1); ++i)
      ASSERT_EQ(static_cast<double>(data[i]), exact[i]) << "element " << i;
  }
}

// Reduce-scatter with a lossy, context-free codec: the shard is the f32 sum, in rank order, of
// every rank's decoded message, with no second compression.
TEST(SraReduceScatter, SignShardIsTheRankOrderSumOfDecodedContributions) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("sign:bucket=64");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  for (std::size_t n : {std::size_t{7}, std::size_t{4097}}) {
    SCOPED_TRACE("count " + std::to_string(n));
    std::vector<float> data = testing::gaussian_contribution(n, rank, 29);
    const std::vector<float> expected = two_stage_reference(*codec, testing::gather_all(data), n, false);
    SraRunner runner{transport};
    runner.reduce_scatter(*codec, data);
    const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
    EXPECT_TRUE(testing::same_bits(std::span<const float>(data).subspan(begin, end - begin),
                              std::span<const float>(expected).subspan(begin, end - begin)));
  }
}

// ---- lossy codecs: derived bounds and the two-stage structure ---------------------------------

// Every rank's contributions, their exact (f64) sum and the per-element error bound of a codec.
struct LossyCase {
  std::vector<std::vector<float>> all;
  std::vector<double> exact;
  std::vector<double> bound;
};

LossyCase gather_case(const std::vector<float>& mine) {
  LossyCase lossy;
  lossy.all = testing::gather_all(mine);
  lossy.exact = exact_sum_of(lossy.all, mine.size());
  lossy.bound.assign(mine.size(), 0.0);
  return lossy;
}

// Runs SRA on this rank's `data` and checks: |result - exact| <= bound per element, the result
// equals `reference` bit for bit when one is given, and every rank holds the same bytes.
void expect_sra_within_bound(collectives::Transport& transport, const Codec& codec,
                             std::vector<float> data, const LossyCase& lossy,
                             const std::vector<float>* reference = nullptr) {
  SraRunner runner{transport};
  runner.allreduce(codec, data);
  const std::size_t n = data.size();
  const std::size_t outside = first_outside_bound(data, lossy.exact, lossy.bound);
  EXPECT_EQ(outside, n) << "element " << outside << ": " << data[outside] << " vs exact "
                        << lossy.exact[outside] << ", bound " << lossy.bound[outside];
  if (reference != nullptr) {
    EXPECT_TRUE(testing::same_bits(data, *reference));
  }
  EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
}

// qsgd:bits=B (B >= 2), s = 2^(B-1) - 1 levels, buckets of K elements counted from the chunk's
// start (worker and server messages of chunk c both start at shard_begin(n, P, c), so a server
// bucket covers the same elements as the workers' buckets).
//   Worker r, element j of bucket b: scale_r = max |x_r| over b, step_r = scale_r / s.
//     Stochastic rounding picks floor(y) or floor(y) + 1 for y = |x| / step_r, so
//     |D(C(x)) - x| < step_r. The f32 operations (inv = s / scale, y = |x| * inv, y + u, q * step)
//     add at most 9 u scale_r with u = 2^-24; we allow 2^-20 scale_r.
//   Owner sum s_j = f32 sum of P decoded values, each |d_r| <= scale_r: the P - 1 additions add
//     at most (P - 1) u sum_r scale_r.
//   => |s_j - exact_j| <= W_b = sum_r (step_r + 2^-20 scale_r) + P u sum_r scale_r.
//   Server: scale_S = max_{j in b} |s_j| <= S_b = max_{j in b} |exact_j| + W_b, and its error is
//     < scale_S / s + 2^-20 scale_S <= S_b (1/s + 2^-20).
//   Bound per element of bucket b: W_b + S_b (1/s + 2^-20).
void set_qsgd_bound(LossyCase& lossy, int bits, std::size_t bucket) {
  const int ranks = static_cast<int>(lossy.all.size());
  const std::size_t n = lossy.exact.size();
  const double levels = static_cast<double>((1 << (bits - 1)) - 1);
  constexpr double kEncodeDecodeRounding = 0x1p-20;
  for (int c = 0; c < ranks; ++c) {
    const std::size_t chunk_end = shard_begin(n, ranks, c + 1);
    for (std::size_t b = shard_begin(n, ranks, c); b < chunk_end; b += bucket) {
      const std::size_t e = std::min(b + bucket, chunk_end);
      double worker = 0.0, scale_sum = 0.0;
      for (const auto& x : lossy.all) {
        double scale = 0.0;
        for (std::size_t j = b; j < e; ++j) scale = std::max(scale, std::abs(static_cast<double>(x[j])));
        worker += scale / levels + kEncodeDecodeRounding * scale;
        scale_sum += scale;
      }
      worker += ranks * kF32Unit * scale_sum;
      double server_scale = 0.0;
      for (std::size_t j = b; j < e; ++j)
        server_scale = std::max(server_scale, std::abs(lossy.exact[j]) + worker);
      const double server = server_scale / levels + kEncodeDecodeRounding * server_scale;
      for (std::size_t j = b; j < e; ++j) lossy.bound[j] = worker + server;
    }
  }
}

// fp16, round to nearest even: |fp16(v) - v| <= 2^-11 |v| + 2^-25 (half a unit in the last place
// of a normal value, half the subnormal spacing 2^-24 below 2^-14; the data stay far below the
// f16 maximum). Workers: sum_r (2^-11 |x_r| + 2^-25). The decoded values have
// sum_r |d_r| <= D = sum_r (|x_r| (1 + 2^-11) + 2^-25); the f32 sum adds <= P u D; the server
// cast of |s| <= D (1 + P u) adds <= 2^-11 D (1 + P u) + 2^-25.
void set_fp16_bound(LossyCase& lossy) {
  const double ranks = static_cast<double>(lossy.all.size());
  for (std::size_t j = 0; j < lossy.bound.size(); ++j) {
    double worker = 0.0, decoded = 0.0;
    for (const auto& x : lossy.all) {
      const double magnitude = std::abs(static_cast<double>(x[j]));
      worker += 0x1p-11 * magnitude + 0x1p-25;
      decoded += magnitude * (1 + 0x1p-11) + 0x1p-25;
    }
    lossy.bound[j] = worker + ranks * kF32Unit * decoded +
                     0x1p-11 * decoded * (1 + ranks * kF32Unit) + 0x1p-25;
  }
}

// The k-th largest of `values` (1 <= k <= size).
double kth_largest(std::vector<double> values, std::size_t k) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   values.end(), std::greater<>());
  return values[k - 1];
}

// Exact top-k keeps the k = k_for(m) largest |x| of each m-element message and drops the rest,
// values unchanged. Worker r, chunk c: a dropped element has |x_r,j| <= tau_r,c, the smallest
// kept magnitude, so its error is <= min(|x_r,j|, tau_r,c); kept elements are exact.
// The owner's f32 sum of P values (each 0 or x_r,j) adds <= P u sum_r |x_r,j|, so
//   |s_j - exact_j| <= W_j = sum_r min(|x_r,j|, tau_r,c) + P u sum_r |x_r,j|.
// The server drops s_j only if |s_j| is at most the k-th largest |s| of the chunk, and
// |s_j| <= U_j = |exact_j| + W_j for every j, so the k-th largest |s| is <= the k-th largest U:
// server error <= min(U_j, kth_largest(U)). Bound: W_j + min(U_j, kth_largest(U)).
void set_topk_bound(LossyCase& lossy, const CompressionSpec& spec) {
  const int ranks = static_cast<int>(lossy.all.size());
  const std::size_t n = lossy.exact.size();
  for (int c = 0; c < ranks; ++c) {
    const std::size_t begin = shard_begin(n, ranks, c), count = shard_begin(n, ranks, c + 1) - begin;
    if (count == 0) continue;
    const std::size_t k = spec.k_for(count);
    std::vector<double> worker(count, 0.0), upper(count);
    for (const auto& x : lossy.all) {
      std::vector<double> magnitude(count);
      for (std::size_t j = 0; j < count; ++j) magnitude[j] = std::abs(static_cast<double>(x[begin + j]));
      const double tau = kth_largest(magnitude, k);
      for (std::size_t j = 0; j < count; ++j)
        worker[j] += std::min(magnitude[j], tau) + ranks * kF32Unit * magnitude[j];
    }
    for (std::size_t j = 0; j < count; ++j) upper[j] = std::abs(lossy.exact[begin + j]) + worker[j];
    const double server_tau = kth_largest(upper, k);
    for (std::size_t j = 0; j < count; ++j)
      lossy.bound[begin + j] = worker[j] + std::min(upper[j], server_tau);
  }
}

TEST(SraAllreduce, QsgdErrorWithinTheTwoStageBound) {
  MpiTransport transport(MPI_COMM_WORLD);
  for (int bits : {2, 4, 8}) {
    const auto codec = make_codec("qsgd:bits=" + std::to_string(bits) + ",bucket=128");
    std::vector<std::size_t> counts = {1, 7, 4097};
    if (bits == 4) counts.push_back(kLargeCount);
    for (std::size_t n : counts) {
      SCOPED_TRACE("bits " + std::to_string(bits) + ", count " + std::to_string(n));
      const std::vector<float> data = testing::gaussian_contribution(n, testing::world_rank(), 31 + bits);
      LossyCase lossy = gather_case(data);
      set_qsgd_bound(lossy, bits, 128);
      expect_sra_within_bound(transport, *codec, data, lossy);
    }
  }
}

// fp16, sign and exact top-k ignore the EncodeContext, so the test can also recompute the exact
// two-stage result from every rank's data.
TEST(SraAllreduce, Fp16ErrorWithinTheTwoCastsBoundAndEqualsTheTwoStageReference) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("fp16");
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}}) {
    SCOPED_TRACE("count " + std::to_string(n));
    const std::vector<float> data = testing::gaussian_contribution(n, testing::world_rank(), 41);
    LossyCase lossy = gather_case(data);
    set_fp16_bound(lossy);
    const std::vector<float> reference = two_stage_reference(*codec, lossy.all, n, true);
    expect_sra_within_bound(transport, *codec, data, lossy, &reference);
  }
}

TEST(SraAllreduce, TopkErrorWithinTheDroppedMassBoundAndEqualsTheTwoStageReference) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("topk:ratio=0.05");
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}}) {
    SCOPED_TRACE("count " + std::to_string(n));
    const std::vector<float> data = testing::gaussian_contribution(n, testing::world_rank(), 43);
    LossyCase lossy = gather_case(data);
    set_topk_bound(lossy, codec->spec());
    const std::vector<float> reference = two_stage_reference(*codec, lossy.all, n, true);
    expect_sra_within_bound(transport, *codec, data, lossy, &reference);
  }
}

// sign has no small worst-case bound (one bucket scale stands for every element), so check the
// exact structure instead: the result is D(C_sign(sum_r D(C_sign(x_r)))) per chunk, recomputed
// here from every rank's data, and decodes to +-scale of its server bucket.
TEST(SraAllreduce, SignEqualsTheTwoStageReference) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("sign:bucket=64");
  const int ranks = testing::world_size(), rank = testing::world_rank();
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}, kLargeCount}) {
    SCOPED_TRACE("count " + std::to_string(n));
    std::vector<float> data = testing::gaussian_contribution(n, rank, 47);
    const std::vector<float> reference = two_stage_reference(*codec, testing::gather_all(data), n, true);
    SraRunner runner{transport};
    runner.allreduce(*codec, data);
    EXPECT_TRUE(testing::same_bits(data, reference));
    // One magnitude per server bucket (64 elements counted from each chunk's start).
    for (int c = 0; c < ranks; ++c) {
      const std::size_t end = shard_begin(n, ranks, c + 1);
      for (std::size_t b = shard_begin(n, ranks, c); b < end; b += 64)
        for (std::size_t j = b; j < std::min(b + 64, end); ++j)
          ASSERT_EQ(std::abs(data[j]), std::abs(data[b])) << "element " << j;
    }
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
  }
}

// ---- error feedback with the server-side residual ---------------------------------------------

// Worker r (step t): g' = fl(g + e), e' = fl(g' - d_r) with d_r = D(C(g')); owner of chunk c:
// s = f32 sum of d_r in rank order, s' = fl(s + E), out = D(C(s')), E' = fl(s' - out).
// Hence out = sum_r (g_r + e_r - e'_r) + E - E' + (rounding), and summed over the calls
// (residuals start at 0) sum_t out_t + sum_r e_r,T + sum_owners E_T = sum_t sum_r g_r,t + R with
//   |R| <= sum_t [ sum_r u (|g'_r| + |e'_r| + (P - 1) |d_r|) + u (|s'| + |E'|) ]
// (the P - 1 partial sums of s are each <= sum_r |d_r|), where |g'| <= |g| + |e|,
// |d_r| <= |g'_r| + |e'_r| and |s'| <= |out| + |E'| (to first order in u). The test adds its own
// f64 summation slack, 2^-40 times the magnitudes summed.
TEST(SraAllreduce, ErrorFeedbackTelescopesOverWorkerAndServerResiduals) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::string name = "layer.weight";
  const std::string server_key = collectives::residual_key(collectives::ResidualRole::sra_server, name);
  for (const char* spec : {"qsgd:bits=2,bucket=64", "sign:bucket=64", "topk:ratio=0.05"}) {
    const auto codec = make_codec(spec);
    for (std::size_t n : {std::size_t{3}, std::size_t{1000}}) {
      SCOPED_TRACE(std::string(spec) + ", count " + std::to_string(n));
      const std::size_t owned_begin = shard_begin(n, ranks, rank);
      const std::size_t owned = shard_begin(n, ranks, rank + 1) - owned_begin;
      ResidualStore store(static_cast<std::uint32_t>(ranks), static_cast<std::uint32_t>(rank),
                          ResizePolicy::error);
      std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0), rounding(n, 0.0), magnitude(n, 0.0);
      std::vector<float> worker_before(n, 0.0f), server_before(owned, 0.0f);
      SraRunner runner{transport};
      for (std::uint32_t step = 0; step < 20; ++step) {
        const std::vector<float> gradient = testing::integer_contribution(n, rank, 1000 + step);
        std::vector<float> data = gradient;
        runner.allreduce(*codec, data, &store, step, name);
        ASSERT_TRUE(store.contains(server_key));
        const std::span<const float> worker = store.residual(name);
        const std::span<const float> server = store.residual(server_key);
        ASSERT_EQ(worker.size(), n);
        ASSERT_EQ(server.size(), owned);
        for (std::size_t j = 0; j < n; ++j) {
          const double g = gradient[j], out = data[j];
          const double corrected = std::abs(g) + std::abs(worker_before[j]);
          const double decoded = corrected + std::abs(worker[j]);
          sum_in[j] += g;
          sum_out[j] += out;
          rounding[j] += kF32Unit * (corrected + std::abs(worker[j]) + (ranks - 1) * decoded);
          magnitude[j] += std::abs(g) + std::abs(out) + std::abs(worker[j]);
        }
        for (std::size_t j = 0; j < owned; ++j) {
          const double out = data[owned_begin + j], residual = std::abs(server[j]);
          rounding[owned_begin + j] += kF32Unit * (std::abs(out) + 2 * residual);
          magnitude[owned_begin + j] += residual;
        }
        worker_before.assign(worker.begin(), worker.end());
        server_before.assign(server.begin(), server.end());
        ASSERT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
      }
      // Residuals left on every rank: workers everywhere, the server's on its owned chunk.
      std::vector<double> residual_sum(n, 0.0);
      for (std::size_t j = 0; j < n; ++j) residual_sum[j] = worker_before[j];
      for (std::size_t j = 0; j < owned; ++j) residual_sum[owned_begin + j] += server_before[j];
      for (std::vector<double>* v : {&sum_in, &residual_sum, &rounding, &magnitude})
        MPI_Allreduce(MPI_IN_PLACE, v->data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                      MPI_COMM_WORLD);
      double largest_bound = 0.0, largest_undelivered = 0.0;
      for (std::size_t j = 0; j < n; ++j) {
        const double bound = rounding[j] + 0x1p-40 * magnitude[j];
        ASSERT_LE(std::abs(sum_out[j] + residual_sum[j] - sum_in[j]), bound)
            << "element " << j << ": outputs " << sum_out[j] << " + residuals " << residual_sum[j]
            << " vs inputs " << sum_in[j];
        largest_bound = std::max(largest_bound, bound);
        largest_undelivered = std::max(largest_undelivered, std::abs(sum_out[j] - sum_in[j]));
      }
      // The residuals carry real mass: without them the identity would fail by far. (With 3
      // elements over several ranks a chunk can be a single element, which all three codecs
      // deliver exactly.)
      if (n >= 1000) {
        EXPECT_GT(largest_undelivered, 10 * largest_bound);
      }
    }
  }
}

TEST(SraAllreduce, ServerResidualIsCheckpointedWithTheStore) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::string name = "layer.bias";
  const std::string server_key = collectives::residual_key(collectives::ResidualRole::sra_server, name);
  const auto codec = make_codec("qsgd:bits=2,bucket=16");
  const std::size_t n = 1001;
  ResidualStore store(static_cast<std::uint32_t>(ranks), static_cast<std::uint32_t>(rank),
                      ResizePolicy::error);
  std::vector<float> data = testing::gaussian_contribution(n, rank, 53);
  SraRunner runner{transport};
  runner.allreduce(*codec, data, &store, 0, name);
  ASSERT_TRUE(store.contains(name));
  ASSERT_TRUE(store.contains(server_key));
  const std::span<const float> server = store.residual(server_key);
  ASSERT_EQ(server.size(), shard_begin(n, ranks, rank + 1) - shard_begin(n, ranks, rank));
  // Over several ranks, the sum of differently scaled 2-bit values is off the owner's 3-level
  // grid, so its re-encode leaves a residual. (On one rank the owner re-encodes an already
  // quantised chunk with the same buckets, which loses nothing: the residual stays 0.)
  if (ranks > 1) {
    EXPECT_TRUE(std::any_of(server.begin(), server.end(), [](float e) { return e != 0.0f; }));
  }

  const std::filesystem::path path = std::filesystem::temp_directory_path() /
      ("gz_sra_" + std::to_string(::getpid()) + "_" + std::to_string(rank) + ".gzef");
  store.save(path);
  ResidualStore loaded(static_cast<std::uint32_t>(ranks), static_cast<std::uint32_t>(rank),
                       ResizePolicy::error);
  loaded.load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(loaded.contains(server_key));
  EXPECT_TRUE(testing::same_bits(loaded.residual(server_key), server));
}

// ---- malformed traffic: every rank throws, none waits -------------------------------------------

// Forwards to MPI, tampering with what the last rank announces or what every rank receives.
class TamperingTransport final : public testing::ForwardingTransport {
 public:
  enum class Tamper { oversized_announcement, corrupt_received_magic };
  TamperingTransport(MpiTransport& inner, Tamper tamper) : ForwardingTransport(inner), tamper_(tamper) {}

  std::string describe() const override { return "tampering " + inner().describe(); }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    inner().alltoallv(send, send_counts, recv, recv_counts);
    if (tamper_ != Tamper::corrupt_received_magic) return;
    std::size_t offset = 0;
    for (std::size_t bytes : recv_counts) {
      if (bytes > 0) recv[offset] ^= std::byte{0xFF};
      offset += bytes;
    }
  }
  void allgather_u64(std::span<const std::uint64_t> mine, std::span<std::uint64_t> all) override {
    std::vector<std::uint64_t> announced(mine.begin(), mine.end());
    if (tamper_ == Tamper::oversized_announcement && rank() == size() - 1 && !announced.empty())
      announced[0] += 1u << 20;  // far above any bound for the test's chunk sizes
    inner().allgather_u64(announced, all);
  }

 private:
  Tamper tamper_;
};

TEST(SraAllreduce, MalformedSizesOrMessagesThrowOnEveryRank) {
  if (testing::world_size() == 1) GTEST_SKIP() << "a single rank exchanges nothing to tamper with";
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("qsgd:bits=4,bucket=64");
  for (auto tamper : {TamperingTransport::Tamper::oversized_announcement,
                      TamperingTransport::Tamper::corrupt_received_magic}) {
    SCOPED_TRACE(tamper == TamperingTransport::Tamper::oversized_announcement ? "oversized size"
                                                                                : "bad magic");
    TamperingTransport tampering(transport, tamper);
    std::vector<float> data = testing::gaussian_contribution(4097, testing::world_rank(), 59);
    SraRunner runner{tampering};
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { runner.allreduce(*codec, data); }, &message),
              ErrorCode::malformed_message)
        << message;
    // Every rank left the call at the same point: the world still runs collectives in step.
    EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const char>("ok", 2))));
  }
}

}  // namespace
}  // namespace gradzip
