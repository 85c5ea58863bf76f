// The shared-index random-k all-reduce (collectives/randk_allreduce.cpp) at every world size
// ctest runs (1..5): the result is, exactly, the sum over ranks of the inputs at the indices
// compressors/randk/randk_cpu.h draws (rounded to f16 for values=fp16) and zero elsewhere, on every
// rank byte for byte; the bytes sent are the inner ring's; with error feedback every integer
// is delivered exactly once over the calls.
#include <gtest/gtest.h>

#include <mpi.h>

#include <bit>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "compressors/randk/randk_cpu.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::ReduceJob;
using collectives::shard_begin;

constexpr std::size_t kSmallCounts[] = {0, 1, 7, 4097};
constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;

std::vector<float> integers(std::size_t count, int rank, std::uint64_t seed) {
  return testing::integer_contribution(count, rank, seed);
}

using testing::same_bits;

// The context every rank passes; random-k keeps its seed (encode_context mixes no rank in).
EncodeContext context(std::uint32_t step) { return EncodeContext{42, step, 7, 0}; }

CollectiveStats run_randk(collectives::Transport& transport, const Codec& codec,
                          std::vector<float>& data, error_feedback::ResidualStore* residuals,
                          std::uint32_t step) {
  CollectiveStats stats;
  ReduceJob job{transport, codec, data, "grad", residuals, context(step), stats};
  collectives::randk_allreduce(job);
  return stats;
}

// `sums` at the k indices drawn for (n, step), as the wire's value type rounds them, zero
// elsewhere: the result the algorithm must produce, computed without it.
std::vector<float> expected_result(const CompressionSpec& spec, std::span<const double> sums,
                                   std::uint32_t step) {
  const std::size_t n = sums.size();
  std::vector<float> expected(n, 0.0f);
  for (std::uint64_t index : kernels::cpu::randk_indices(n, spec.k_for(n), context(step))) {
    const float sum = static_cast<float>(sums[index]);
    expected[index] =
        spec.values == DType::f16 ? kernels::f16_bits_to_f32(kernels::f32_to_f16_bits(sum)) : sum;
  }
  return expected;
}

TEST(RandkAllreduce, IsTheSumOfAllRanksAtTheSharedIndicesAndZeroElsewhere) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  for (const char* spec_text : {"randk:ratio=0.1", "randk:ratio=0.1,values=fp16"}) {
    const auto codec = make_codec(spec_text);
    const CompressionSpec& spec = codec->spec();
    std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
    if (spec.values == DType::f32) counts.push_back(kLargeCount);
    for (std::size_t n : counts) {
      SCOPED_TRACE(::testing::Message()
                   << spec_text << ", count " << n << ", " << ranks << " ranks");
      const std::uint64_t seed = 100 + n;
      std::vector<float> data = integers(n, rank, seed);
      const CollectiveStats stats = run_randk(transport, *codec, data, nullptr, 0);

      // Integers of magnitude <= 1000 over <= 5 ranks: the f32 ring sums are exact, and so are
      // the f16 values of the inputs; for values=fp16 the sums are rounded to f16 once (above
      // 2048 f16 steps by 2, so that rounding shows).
      const std::vector<float> expected =
          expected_result(spec, testing::exact_sum(n, ranks, seed, integers), 0);
      EXPECT_TRUE(same_bits(data, expected));
      EXPECT_TRUE(testing::identical_on_all_ranks(data));

      // One randk message encoded: 32 + 24 + k values.
      const std::size_t k = spec.k_for(n);
      EXPECT_EQ(stats.encoded_input_bytes, 4 * n);
      EXPECT_EQ(stats.encoded_message_bytes, 56 + k * dtype_size(spec.values));
      // What travels is the inner `none` ring over k f32 values: 2 (P - 1) messages, every chunk
      // of k but this rank's own in the reduce-scatter and but rank+1's in the all-gather.
      const auto chunk = [&](int c) {
        c = (c + ranks) % ranks;
        return shard_begin(k, ranks, c + 1) - shard_begin(k, ranks, c);
      };
      EXPECT_EQ(stats.sent_header_bytes, 64 * static_cast<std::uint64_t>(ranks - 1));
      EXPECT_EQ(stats.sent_index_bytes, 0u);
      EXPECT_EQ(stats.sent_payload_bytes,
                ranks == 1 ? 0 : 4 * ((k - chunk(rank)) + (k - chunk(rank + 1))));
    }
  }
}

// With error feedback each call sends, at its indices, sum_r (g_r + e_r) and every rank keeps
// the rest of g_r + e_r as its residual. With integer data every value stays an integer below
// 2^24 and all of it is exact, so over T calls
//   sum_t result_t + sum_r e_r(T) == sum_t sum_r g_r(t)   exactly,
// and each result equals the independent computation over g + e.
TEST(RandkAllreduce, ErrorFeedbackDeliversEveryIntegerExactly) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  const auto codec = make_codec("randk:ratio=0.1");
  constexpr int kCalls = 3;
  for (std::size_t n : {std::size_t{7}, std::size_t{4097}}) {
    SCOPED_TRACE(::testing::Message() << "count " << n << ", " << ranks << " ranks");
    error_feedback::ResidualStore store(static_cast<std::uint32_t>(ranks),
                                        static_cast<std::uint32_t>(rank), ResizePolicy::error);
    std::vector<double> delivered(n, 0.0), inputs(n, 0.0);
    for (int call = 0; call < kCalls; ++call) {
      const auto step = static_cast<std::uint32_t>(call);
      const std::uint64_t seed = 200 + 10 * n + step;
      std::vector<float> data = integers(n, rank, seed);
      // sum over ranks of g + e, what this call must deliver at its indices.
      std::vector<double> corrected(data.begin(), data.end());
      if (store.contains("grad"))
        for (std::size_t i = 0; i < n; ++i) corrected[i] += store.residual("grad")[i];
      MPI_Allreduce(MPI_IN_PLACE, corrected.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);

      run_randk(transport, *codec, data, &store, step);
      const std::vector<float> expected = expected_result(codec->spec(), corrected, step);
      EXPECT_TRUE(same_bits(data, expected));
      EXPECT_TRUE(testing::identical_on_all_ranks(data));
      const std::vector<double> exact = testing::exact_sum(n, ranks, seed, integers);
      for (std::size_t i = 0; i < n; ++i) {
        delivered[i] += data[i];
        inputs[i] += exact[i];
      }
    }
    const std::span<const float> residual = store.residual("grad");
    std::vector<double> residual_sum(residual.begin(), residual.end());
    MPI_Allreduce(MPI_IN_PLACE, residual_sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) mismatches += delivered[i] + residual_sum[i] != inputs[i];
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST(RandkAllreduce, RefusesOtherCodecs) {
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("topk:ratio=0.1");
  std::vector<float> data(16, 1.0f);
  // Every rank refuses before communicating, so no rank waits for another.
  EXPECT_EQ(testing::error_code_of([&] { run_randk(transport, *codec, data, nullptr, 0); }),
            ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace gradzip
