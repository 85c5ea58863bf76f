// The ring all-reduce and reduce-scatter (collectives/ring_allreduce.cpp) at every world size
// ctest runs (1..5): exact sums for `none` (equal to MPI_Allreduce's), derived error bounds
// for every lossy codec, byte-identical results, exact per-rank byte counts, uneven shards,
// error feedback that keeps exactly what was not delivered, and malformed messages that throw
// on every rank without leaving the ring stuck.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "compressors/codec_descriptor.h"
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

constexpr std::size_t kSmallCounts[] = {0, 1, 7, 4097};
constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;
constexpr std::uint32_t kTensorId = 7;

using testing::same_bits;

// The small counts, plus 2^20 + 3 when `large` (kept to a few cases: 2 cores run 5 ranks).
std::vector<std::size_t> test_counts(bool large) {
  std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
  if (large) counts.push_back(kLargeCount);
  return counts;
}

std::vector<float> integers(std::size_t count, int rank, std::uint64_t seed) {
  return testing::integer_contribution(count, rank, seed);
}

// Runs `algorithm` over `data` (this rank's contribution; the result on return) and returns
// what the call recorded.
CollectiveStats run(void (*algorithm)(ReduceJob&), collectives::Transport& transport,
                    const Codec& codec, std::vector<float>& data,
                    error_feedback::ResidualStore* residuals = nullptr, std::uint32_t step = 0) {
  CollectiveStats stats;
  ReduceJob job{transport, codec, data, "grad", residuals,
                EncodeContext{codec.spec().seed, step, kTensorId, 0}, stats};
  algorithm(job);
  return stats;
}

// actual[i] == (float)expected[i] for every i in [begin, end); names the first that is not.
::testing::AssertionResult equal_in(std::span<const float> actual, std::span<const double> expected,
                                    std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i)
    if (actual[i] != static_cast<float>(expected[i]))
      return ::testing::AssertionFailure() << "element " << i << " of " << actual.size() << ": "
                                           << actual[i] << ", expected " << expected[i];
  return ::testing::AssertionSuccess();
}

// |actual[i] - exact[i]| <= bound[i] for every i in [begin, end); names the first that is not.
::testing::AssertionResult within(std::span<const float> actual, std::span<const double> exact,
                                  std::span<const double> bound, std::size_t begin,
                                  std::size_t end) {
  for (std::size_t i = begin; i < end; ++i)
    if (!(std::fabs(static_cast<double>(actual[i]) - exact[i]) <= bound[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << actual.size() << ": " << actual[i] << ", exact "
             << exact[i] << ", error " << std::fabs(actual[i] - exact[i]) << " > bound "
             << bound[i];
  return ::testing::AssertionSuccess();
}

// ---- the error bound of a lossy ring -----------------------------------------------------
//
// Chunk c travels the chain of ranks c+1, c+2, ..., c (mod P). Hop i (i = 1..P) encodes x_i:
// x_1 = g_1, x_{i+1} = fl(g_{i+1} + D(C(x_i))) (the receiver's f32 decode_add), and the
// all-reduce's result is D(C(x_P)) (the owner's final encode; the reduce-scatter stops at x_P,
// so it has P - 1 encodes). Let A_e = sum over ranks of |g_r[e]|, which bounds every exact
// partial sum, and err_i a bound on |x_i - exact partial sum_i|. Then |x_i| <= A + err_i and
//   err_{i+1} = err_i + E(A + err_i) + 2^-24 (A + err_{i+1}')
// where E(S) bounds the codec's error on values of magnitude <= S, and the last term is the
// f32 rounding of the next hop's add (|fl(a) - a| <= 2^-24 |a|). The result's error is err
// after the last encode. Per codec:
//   fp16: round to nearest even: |f16(x) - x| <= 2^-11 |x| in the normal range, <= 2^-25
//         (half the smallest subnormal spacing 2^-24) below it; element-wise.
//   bf16: |bf16(x) - x| <= 2^-8 |x| (same exponent range as f32); element-wise.
//   qsgd: per bucket of its chunk (buckets start at the chunk's first element), with s the
//         top level 2^(bits-1) - 1 and scale the bucket's max |x| <= S: the level q is
//         floor(y) or floor(y) + 1 of y = |x| s / scale, so |q scale/s - |x|| <= scale / s;
//         the f32 roundings of y, the step and the product add less than 2^-12 of that
//         (|y - computed y| < s 2^-23 + 2^-22 <= 2^-15 for s <= 127), so E(S) = S/s (1 + 2^-12).
//   sign: element -> +-mean |x| of its bucket; ||x| - mean| <= max(|x|, mean) <= S, and the
//         f32 sum of at most 512 terms rounds the mean up by less than 2^-14 of S:
//         E(S) = S (1 + 2^-14).
//   topk, randk: each hop keeps x_i[e] exactly or drops it to 0, so the result at e is the f32
//         sum of a suffix of the chain's contributions and |result - exact| <= A_e plus the
//         rounding of at most P - 1 f32 adds of magnitude <= A_e: A_e (1 + P 2^-23).
struct RingBoundModel {
  CompressionSpec spec;
  int ranks;
  int encodes;  // P for the all-reduce, P - 1 for the reduce-scatter

  // Bound on the error of values whose magnitudes are bounded by `magnitude` (A for one element,
  // the max of A over a bucket for bucket codecs).
  double bound(double magnitude) const {
    if (spec.codec == CodecKind::topk || spec.codec == CodecKind::randk)
      return encodes == 0 ? 0.0 : magnitude * (1.0 + ranks * 0x1p-23);
    double err = 0;
    for (int hop = 1; hop <= encodes; ++hop) {
      err += codec_error(magnitude + err);
      if (hop < ranks) err += 0x1p-24 * (magnitude + err);  // the next hop's f32 add
    }
    return err;
  }

  double codec_error(double scale) const {
    switch (spec.codec) {
      case CodecKind::fp16: return 0x1p-11 * scale + 0x1p-25;
      case CodecKind::bf16: return 0x1p-8 * scale;
      case CodecKind::qsgd:
        return scale / static_cast<double>((1 << (spec.bits - 1)) - 1) * (1.0 + 0x1p-12);
      case CodecKind::sign: return scale * (1.0 + 0x1p-14);
      default: return 0.0;  // none: exact
    }
  }

  bool bucketed() const { return spec.codec == CodecKind::qsgd || spec.codec == CodecKind::sign; }
};

// Per-element bound of a ring over P ranks for element-wise magnitude sums `a` (A_e above).
std::vector<double> ring_error_bound(const RingBoundModel& model, std::span<const double> a) {
  const std::size_t n = a.size();
  std::vector<double> bound(n);
  if (!model.bucketed()) {
    for (std::size_t e = 0; e < n; ++e) bound[e] = model.bound(a[e]);
    return bound;
  }
  for (int c = 0; c < model.ranks; ++c) {
    const std::size_t chunk_end = shard_begin(n, model.ranks, c + 1);
    for (std::size_t b = shard_begin(n, model.ranks, c); b < chunk_end; b += model.spec.bucket) {
      const std::size_t bucket_end = std::min(chunk_end, b + model.spec.bucket);
      const double magnitude = *std::max_element(a.begin() + b, a.begin() + bucket_end);
      std::fill(bound.begin() + b, bound.begin() + bucket_end, model.bound(magnitude));
    }
  }
  return bound;
}

// Sum over ranks of |contribution|, element by element.
std::vector<double> magnitude_sum(std::size_t count, int ranks, std::uint64_t seed,
                                  std::vector<float> (*contribution)(std::size_t, int,
                                                                     std::uint64_t)) {
  std::vector<double> sum(count, 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> values = contribution(count, r, seed);
    for (std::size_t i = 0; i < count; ++i) sum[i] += std::fabs(values[i]);
  }
  return sum;
}

// ---- none: exact --------------------------------------------------------------------------

TEST(RingAllreduce, NoneIsTheExactSumAndEqualsMpiAllreduce) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  const auto codec = make_codec("none");
  for (std::size_t n : test_counts(true)) {
    SCOPED_TRACE(::testing::Message() << "count " << n << ", " << ranks << " ranks");
    const std::uint64_t seed = 100 + n;
    std::vector<float> data = integers(n, rank, seed);
    std::vector<float> mpi_sum = data;
    MPI_Allreduce(MPI_IN_PLACE, mpi_sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    const CollectiveStats stats = run(collectives::ring_allreduce, transport, *codec, data);

    // Integers of magnitude <= 1000 summed over <= 5 ranks: every f32 partial sum is exact.
    const std::vector<double> exact = testing::exact_sum(n, ranks, seed, integers);
    EXPECT_TRUE(equal_in(data, exact, 0, n));
    EXPECT_TRUE(same_bits(data, mpi_sum));
    EXPECT_TRUE(testing::identical_on_all_ranks(data));

    // Rank r sends every chunk but its own in the reduce-scatter and every chunk but r+1's in
    // the all-gather: 2 (P - 1) messages of a 32-byte header and 4 bytes per element.
    const auto chunk = [&](int c) {
      c = (c + ranks) % ranks;
      return shard_begin(n, ranks, c + 1) - shard_begin(n, ranks, c);
    };
    const std::uint64_t messages = 2 * static_cast<std::uint64_t>(ranks - 1);
    EXPECT_EQ(stats.sent_header_bytes, 32 * messages);
    EXPECT_EQ(stats.sent_index_bytes, 0u);
    EXPECT_EQ(stats.sent_payload_bytes,
              ranks == 1 ? 0 : 4 * ((n - chunk(rank)) + (n - chunk(rank + 1))));
    EXPECT_EQ(stats.received_bytes,
              ranks == 1 ? 0 : 32 * messages + 4 * ((n - chunk(rank)) + (n - chunk(rank - 1))));
    // Every chunk encoded once: n elements in P messages.
    EXPECT_EQ(stats.encoded_input_bytes, 4 * n);
    EXPECT_EQ(stats.encoded_message_bytes, 4 * n + 32 * static_cast<std::uint64_t>(ranks));
  }
}

TEST(RingReduceScatter, EachShardIsTheExactSumOfItsSlice) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  const auto codec = make_codec("none");
  // 7 and 4097 leave a remainder over 2, 3, 4 and 5 ranks: the shards are uneven.
  for (std::size_t n : test_counts(true)) {
    SCOPED_TRACE(::testing::Message() << "count " << n << ", " << ranks << " ranks");
    const std::uint64_t seed = 200 + n;
    std::vector<float> data = integers(n, rank, seed);
    const CollectiveStats stats = run(collectives::ring_reduce_scatter, transport, *codec, data);
    const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
    EXPECT_TRUE(equal_in(data, testing::exact_sum(n, ranks, seed, integers), begin, end));
    // One message per step, P - 1 steps: every chunk but this rank's own.
    EXPECT_EQ(stats.sent_header_bytes, 32 * static_cast<std::uint64_t>(ranks - 1));
    EXPECT_EQ(stats.sent_payload_bytes, ranks == 1 ? 0 : 4 * (n - (end - begin)));
  }
}

// ---- lossy codecs: derived bounds -----------------------------------------------------------

const char* const kLossySpecs[] = {
    "fp16", "bf16", "qsgd:bits=4", "qsgd:bits=8", "sign", "topk:ratio=0.01", "randk:ratio=0.1"};

TEST(RingAllreduce, LossyCodecsStayWithinTheirDerivedBounds) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  for (const char* spec_text : kLossySpecs) {
    const auto codec = make_codec(spec_text);
    const bool large = codec->spec().codec == CodecKind::qsgd && codec->spec().bits == 8;
    for (std::size_t n : test_counts(large)) {
      SCOPED_TRACE(::testing::Message()
                   << spec_text << ", count " << n << ", " << ranks << " ranks");
      const std::uint64_t seed = 300 + n;
      std::vector<float> data = testing::gaussian_contribution(n, rank, seed);
      run(collectives::ring_allreduce, transport, *codec, data);
      const std::vector<double> exact =
          testing::exact_sum(n, ranks, seed, testing::gaussian_contribution);
      const std::vector<double> bound = ring_error_bound(
          RingBoundModel{codec->spec(), ranks, ranks},
          magnitude_sum(n, ranks, seed, testing::gaussian_contribution));
      EXPECT_TRUE(within(data, exact, bound, 0, n));
      EXPECT_TRUE(testing::identical_on_all_ranks(data));
      // The bound above is at least A for sign, top-k and random-k: an all-zero result would
      // meet it. The cosine floor (P encodes on every element's path) rejects zeros and -exact.
      if (n / ranks >= compressors::kCosineMinElementsPerRank) {
        const double floor = compressors::allreduce_cosine_floor(
            testing::smallest_cosine_estimate(codec->spec(), n, ranks, seed,
                                              testing::gaussian_contribution, 0, n),
            ranks);
        EXPECT_GE(compressors::cosine_similarity(data, exact), floor);
        EXPECT_GT(floor, 0.0);
      }
    }
  }
}

TEST(RingReduceScatter, LossyShardsStayWithinTheirDerivedBounds) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  for (const char* spec_text : {"fp16", "qsgd:bits=4", "topk:ratio=0.01"}) {
    const auto codec = make_codec(spec_text);
    for (std::size_t n : kSmallCounts) {
      SCOPED_TRACE(::testing::Message()
                   << spec_text << ", count " << n << ", " << ranks << " ranks");
      const std::uint64_t seed = 400 + n;
      std::vector<float> data = testing::gaussian_contribution(n, rank, seed);
      run(collectives::ring_reduce_scatter, transport, *codec, data);
      // P - 1 encodes: the owner adds the last message to its own, unencoded, data.
      const std::vector<double> bound = ring_error_bound(
          RingBoundModel{codec->spec(), ranks, ranks - 1},
          magnitude_sum(n, ranks, seed, testing::gaussian_contribution));
      const std::vector<double> exact =
          testing::exact_sum(n, ranks, seed, testing::gaussian_contribution);
      const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
      EXPECT_TRUE(within(data, exact, bound, begin, end));
      // And the shard's cosine with its exact sum, over P - 1 encodes (see the all-reduce's).
      if (end - begin >= compressors::kCosineMinElementsPerRank) {
        const double floor = compressors::allreduce_cosine_floor(
            testing::smallest_cosine_estimate(codec->spec(), n, ranks, seed,
                                              testing::gaussian_contribution, begin, end),
            ranks - 1);
        const std::span<const float> shard(data.data() + begin, end - begin);
        const std::span<const double> exact_shard(exact.data() + begin, end - begin);
        EXPECT_GE(compressors::cosine_similarity(shard, exact_shard), floor);
      }
    }
  }
}

// ---- error feedback -------------------------------------------------------------------------

// Over T calls with error feedback, sum_t result_t + sum_r e_r(T) = sum_t sum_r g_r(t): the
// residuals hold exactly what the ring did not deliver, up to f32 rounding.
//
// Derivation (one call, one element, the chain of hops i = 1..P of its chunk): hop i computes
// a_i = fl(g_i + D_{i-1}) (a_1 = g_1), x_i = fl(a_i + e_i) (the EF input), sends C(x_i), and
// sets e_i' = fl(x_i - D_i); the result is D_P. Writing each fl(.) as the exact value plus an
// error of at most 2^-24 of its magnitude, the D_i of hops 1..P-1 cancel and
//   D_P + sum_i e_i' - sum_i g_i - sum_i e_i = sum of those errors
//                                             <= 2^-24 sum_i (|a_i| + |x_i| + |e_i'|).
// Bound the magnitudes: let h_r = max over elements of |g_r| + |e_r| (before the call) and
// H = sum_r h_r. Both codecs decode to at most the largest |x| that they encoded (top-k: x or 0;
// sign: the bucket's mean |x| <= its max |x|, times 1 + 2^-14 for the rounding of the mean), so
// by induction over the hops |a_i|, |x_i|, |D_i| <= H (1 + 2^-8) for P <= 5 and
// |e_i'| <= 2 H (1 + 2^-8). Per call: 2^-24 P (1 + 1 + 2) H (1 + 2^-8). The test's own f64 sums
// add far less than the factor 1.01 covers.
TEST(RingAllreduce, ErrorFeedbackResidualsHoldWhatWasNotDelivered) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  constexpr int kCalls = 3;
  for (const char* spec_text : {"topk:ratio=0.01", "sign"}) {
    const auto codec = make_codec(spec_text);
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4097}}) {
      SCOPED_TRACE(::testing::Message()
                   << spec_text << ", count " << n << ", " << ranks << " ranks");
      error_feedback::ResidualStore store(static_cast<std::uint32_t>(ranks),
                                          static_cast<std::uint32_t>(rank), ResizePolicy::error);
      std::vector<double> delivered(n, 0.0), inputs(n, 0.0);
      double bound = 0;
      for (int call = 0; call < kCalls; ++call) {
        const std::uint64_t seed = 500 + 10 * n + static_cast<std::uint64_t>(call);
        std::vector<float> data = testing::gaussian_contribution(n, rank, seed);
        double h = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double residual = store.contains("grad") ? store.residual("grad")[i] : 0.0;
          h = std::max(h, std::fabs(data[i]) + std::fabs(residual));
        }
        double big_h = 0;
        MPI_Allreduce(&h, &big_h, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        bound += 0x1p-24 * ranks * 4 * big_h * 1.01;

        run(collectives::ring_allreduce, transport, *codec, data, &store,
            static_cast<std::uint32_t>(call));
        EXPECT_TRUE(testing::identical_on_all_ranks(data));
        const std::vector<double> exact =
            testing::exact_sum(n, ranks, seed, testing::gaussian_contribution);
        for (std::size_t i = 0; i < n; ++i) {
          delivered[i] += data[i];
          inputs[i] += exact[i];
        }
      }
      const std::span<const float> residual = store.residual("grad");
      std::vector<double> residual_sum(residual.begin(), residual.end());
      MPI_Allreduce(MPI_IN_PLACE, residual_sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
      double worst = 0;
      std::size_t worst_at = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double gap = std::fabs(delivered[i] + residual_sum[i] - inputs[i]);
        if (gap > worst) worst = gap, worst_at = i;
      }
      EXPECT_LE(worst, bound) << "at element " << worst_at;
      // The codecs are lossy: something is held back (the identity is not met by e == 0).
      double held = 0;
      for (double e : residual_sum) held = std::max(held, std::fabs(e));
      if (n > 1) {
        EXPECT_GT(held, 1e3 * bound);
      }
    }
  }
}

TEST(RingAllreduce, SingleRankResultIsTheDecodedMessageOfItsOwnData) {
  // P == 1: no communication, but the same semantics: the result is D(C(g)) of the rank's data,
  // encoded with the context the algorithm uses (encode_context of element 0), bit for bit.
  MpiTransport transport(MPI_COMM_WORLD);
  if (transport.size() != 1) GTEST_SKIP() << "checks the P == 1 path";
  for (const char* spec_text : kLossySpecs) {
    SCOPED_TRACE(spec_text);
    const auto codec = make_codec(spec_text);
    std::vector<float> data = testing::gaussian_contribution(4097, 0, 600);
    CollectiveStats stats;
    ReduceJob job{transport, *codec, data, "grad", nullptr,
                  EncodeContext{codec->spec().seed, 3, kTensorId, 0}, stats};
    const std::vector<float> expected = testing::decode_to_f32(
        *codec,
        testing::encode_message(*codec, ConstTensorView(data.data(), data.size(), DType::f32),
                                collectives::encode_context(job, 0)),
        data.size());
    collectives::ring_allreduce(job);
    EXPECT_TRUE(same_bits(data, expected));
  }
}

// ---- malformed messages -----------------------------------------------------------------

// A transport that overwrites the first byte (the wire magic) of chosen received messages,
// counted in the order this rank completes its receives.
class CorruptingTransport final : public testing::ReceiveWatchingTransport {
 public:
  CorruptingTransport(collectives::Transport& inner, std::size_t first_corrupted)
      : ReceiveWatchingTransport(inner), first_corrupted_(first_corrupted) {}

  std::string describe() const override { return "corrupting " + inner().describe(); }

 protected:
  void received(std::span<std::byte> buffer, std::size_t bytes) override {
    if (receives_++ >= first_corrupted_ && bytes > 0) buffer[0] = std::byte{0};
  }

 private:
  std::size_t first_corrupted_;
  std::size_t receives_ = 0;
};

TEST(RingAllreduce, MalformedMessagesThrowOnEveryRankAndLeaveTheRingUsable) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  if (ranks == 1) GTEST_SKIP() << "a single rank receives nothing";
  const auto codec = make_codec("fp16");
  // Receive 0 is the reduce-scatter's first message: every rank throws at its first step.
  // Receives P-1 .. 2P-3 are the all-gather's: every rank forwards the broken bytes, finishes
  // the ring and then throws.
  for (std::size_t first_corrupted : {std::size_t{0}, static_cast<std::size_t>(ranks - 1)}) {
    SCOPED_TRACE(::testing::Message() << "corrupting from receive " << first_corrupted);
    CorruptingTransport corrupting(transport, first_corrupted);
    std::vector<float> data = integers(4097, rank, 700);
    CollectiveStats stats;
    ReduceJob job{corrupting, *codec, data, "grad", nullptr, EncodeContext{}, stats};
    try {
      collectives::ring_allreduce(job);
      ADD_FAILURE() << "a corrupted message was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::malformed_message) << error.what();
    }
    // No request is left behind: the next all-reduce over the same transport is exact.
    std::vector<float> next = integers(4097, rank, 701);
    run(collectives::ring_allreduce, transport, *make_codec("none"), next);
    EXPECT_TRUE(equal_in(next, testing::exact_sum(4097, ranks, 701, integers), 0, next.size()));
  }
}

}  // namespace
}  // namespace gradzip
