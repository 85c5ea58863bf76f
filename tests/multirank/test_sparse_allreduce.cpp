// The sparse all-reduce: every rank ends with sum_r D(m_r), the decoded messages of
// all ranks (error feedback included), byte-identical everywhere; it switches to a dense ring
// exactly when its byte estimate says so; bad sizes and bad messages throw on every rank.
//
// The expected results are computed without the algorithm: every rank recomputes every rank's
// contribution (deterministic in (seed, rank)) and message (the codec with the encode context
// of that rank, through its own error-feedback store), and sums the decoded messages in f64.
// Contributions are small integers, so every decoded top-k value is an integer of magnitude
// <= 2 * 1000 (g + e with e < |g| the dropped part; exact in f32 and in f16 up to 2048) and
// every sum over <= 5 ranks is exact in f32: the result must equal the f64 sum exactly.
#include <gtest/gtest.h>

#include <mpi.h>

#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/message_tags.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "compressors/wire_format.h"
#include "error_feedback/error_feedback_codec.h"
#include "gradzip/error.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::ReduceJob;
using collectives::Transport;

constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;
constexpr std::size_t kSmallCounts[] = {0, 1, 7, 4097};
constexpr std::uint32_t kTensorId = 7;
constexpr int kSteps = 2;  // the second step sends what error feedback kept from the first

// Reports a rank and a size and nothing else: lets encode_context() build the context that
// rank r's encode uses, so any rank can recompute rank r's message.
class RankOnlyTransport final : public Transport {
 public:
  RankOnlyTransport(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string describe() const override { return "rank-only transport"; }
  Request isend(int, int, std::span<const std::byte>) override { refuse(); }
  Request irecv(int, int, std::span<std::byte>) override { refuse(); }
  std::size_t wait(Request) override { refuse(); }
  void allgatherv(std::span<const std::byte>, std::span<std::byte>,
                  std::span<const std::size_t>) override { refuse(); }
  void alltoallv(std::span<const std::byte>, std::span<const std::size_t>, std::span<std::byte>,
                 std::span<const std::size_t>) override { refuse(); }
  void allgather_u64(std::span<const std::uint64_t>, std::span<std::uint64_t>) override {
    refuse();
  }
  void allreduce_f32_sum(std::span<float>) override { refuse(); }
  void barrier() override { refuse(); }
  std::unique_ptr<Transport> split(int, int) override { refuse(); }
  std::unique_ptr<Transport> split_by_node() override { refuse(); }

 private:
  [[noreturn]] static void refuse() {
    GZ_THROW(ErrorCode::internal, "RankOnlyTransport moves no bytes");
  }
  int rank_, size_;
};

EncodeContext call_context(const CompressionSpec& spec, int step) {
  EncodeContext ctx;
  ctx.seed = spec.seed;
  ctx.step = static_cast<std::uint32_t>(step);
  ctx.tensor_id = kTensorId;
  return ctx;
}

std::vector<float> contribution(std::size_t count, int rank, int step) {
  return testing::integer_contribution(count, rank, 1000u + static_cast<std::uint64_t>(step));
}

// What the algorithm must produce, recomputed locally for all ranks.
struct Reference {
  std::vector<std::vector<double>> sum;            // [step][i]: sum_r D(m_r)
  std::vector<std::vector<std::size_t>> sizes;     // [step][r]: |m_r|
  std::vector<float> my_residual;                  // this rank's residual after the last step
};

Reference reference_for(const Codec& codec, std::size_t count, int ranks, int me) {
  Reference reference;
  reference.sum.assign(kSteps, std::vector<double>(count, 0.0));
  reference.sizes.assign(kSteps, std::vector<std::size_t>(static_cast<std::size_t>(ranks)));
  const std::shared_ptr<const Codec> unowned(std::shared_ptr<const Codec>(), &codec);
  for (int r = 0; r < ranks; ++r) {
    error_feedback::ResidualStore store(static_cast<std::uint32_t>(ranks),
                                        static_cast<std::uint32_t>(r), ResizePolicy::error);
    error_feedback::ErrorFeedbackCodec ef(unowned, store);
    RankOnlyTransport rank_r(r, ranks);
    CollectiveStats unused;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> data = contribution(count, r, step);
      const ReduceJob job{rank_r, codec, data, "grad", nullptr, call_context(codec.spec(), step),
                          unused};
      const EncodeContext ctx = collectives::encode_context(job, 0);
      std::vector<std::byte> message(codec.max_encoded_bytes(count));
      const std::size_t bytes =
          codec.spec().error_feedback
              ? ef.encode_chunk("grad", count, host_view(data.data(), count), message, ctx)
              : codec.encode(host_view(data.data(), count), message, ctx);
      message.resize(bytes);
      reference.sizes[static_cast<std::size_t>(step)][static_cast<std::size_t>(r)] = bytes;
      const std::vector<float> decoded = testing::decode_to_f32(codec, message, count);
      for (std::size_t i = 0; i < count; ++i)
        reference.sum[static_cast<std::size_t>(step)][i] += decoded[i];
    }
    if (r == me && codec.spec().error_feedback) {
      const auto residual = store.residual("grad");
      reference.my_residual.assign(residual.begin(), residual.end());
    }
  }
  return reference;
}

using testing::same_bits;

// First index where `result` differs from `expected` (count when none).
std::size_t first_mismatch(std::span<const float> result, const std::vector<double>& expected) {
  for (std::size_t i = 0; i < result.size(); ++i)
    if (static_cast<double>(result[i]) != expected[i]) return i;
  return result.size();
}

struct RunResult {
  std::vector<std::vector<float>> data;  // [step]
  std::vector<CollectiveStats> stats;    // [step]
  std::vector<float> residual;           // after the last step (empty with ef=off)
};

// kSteps calls of the algorithm on this rank's contributions, one residual store throughout.
// segment_bytes > 0 runs the pipelined all-gather (host memory over MPI), 0 the allgatherv.
RunResult run_steps(MpiTransport& world, const Codec& codec, std::size_t count,
                    Transport* transport_override = nullptr, std::size_t segment_bytes = 0) {
  Transport& transport = transport_override ? *transport_override : world;
  error_feedback::ResidualStore store(static_cast<std::uint32_t>(world.size()),
                                      static_cast<std::uint32_t>(world.rank()),
                                      ResizePolicy::error);
  RunResult run;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> data = contribution(count, world.rank(), step);
    CollectiveStats stats;
    stats.algorithm = "sparse";  // as run_flat_allreduce sets it before the call
    ReduceJob job{transport, codec, data, "grad",
                  codec.spec().error_feedback ? &store : nullptr,
                  call_context(codec.spec(), step), stats};
    job.segment_bytes = segment_bytes;
    collectives::sparse_allreduce(job);
    run.data.push_back(std::move(data));
    run.stats.push_back(stats);
  }
  if (codec.spec().error_feedback) {
    const auto residual = store.residual("grad");
    run.residual.assign(residual.begin(), residual.end());
  }
  return run;
}

// Result == f64 sum of every rank's decoded messages (exact), identical on every rank, and
// this rank's residual is the one its own encodes leave.
void expect_sum_of_decoded_messages(const std::string& spec_text, std::size_t count,
                                    const RunResult& run, const Reference& reference) {
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(spec_text + " count " + std::to_string(count) + " step " + std::to_string(step));
    const auto& result = run.data[static_cast<std::size_t>(step)];
    const auto& expected = reference.sum[static_cast<std::size_t>(step)];
    const std::size_t bad = first_mismatch(result, expected);
    EXPECT_EQ(bad, count) << "element " << bad << ": " << (bad < count ? result[bad] : 0.0f)
                          << " != " << (bad < count ? expected[bad] : 0.0);
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(result)));
  }
  EXPECT_EQ(run.residual, reference.my_residual) << spec_text << " count " << count;
}

std::uint64_t sum_of_others(const std::vector<std::size_t>& sizes, int me) {
  std::uint64_t total = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r)
    if (static_cast<int>(r) != me) total += sizes[r];
  return total;
}

class SparseAllgather : public ::testing::TestWithParam<const char*> {};

// The all-gather path itself: never switches at ratio 0.01 or k = 1 (P k / n <= 0.05).
TEST_P(SparseAllgather, EveryRankGetsTheSumOfAllDecodedMessagesInRankOrder) {
  MpiTransport world(MPI_COMM_WORLD);
  const int me = world.rank(), ranks = world.size();
  const std::unique_ptr<Codec> codec = make_codec(GetParam());
  ASSERT_TRUE(codec->spec().error_feedback) << "top-k runs with error feedback by default";
  std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
  // The large count for the exact and the approximate selection only (run time at np 5).
  if (codec->spec().values == DType::f32 && codec->spec().k == 0) counts.push_back(kLargeCount);
  // Both exchanges: the allgatherv (segment=0) and the pipelined one (the default segment
  // size), which must give the same bits and the same byte counts.
  for (const std::size_t segment_bytes : {std::size_t{0}, kDefaultSegmentBytes})
  for (std::size_t count : counts) {
    SCOPED_TRACE(segment_bytes == 0 ? "allgatherv" : "pipelined");
    const Reference reference = reference_for(*codec, count, ranks, me);
    const RunResult run = run_steps(world, *codec, count, nullptr, segment_bytes);
    expect_sum_of_decoded_messages(GetParam(), count, run, reference);
    for (int step = 0; step < kSteps; ++step) {
      const CollectiveStats& stats = run.stats[static_cast<std::size_t>(step)];
      const auto& sizes = reference.sizes[static_cast<std::size_t>(step)];
      EXPECT_EQ(stats.algorithm, "sparse");
      EXPECT_EQ(stats.note, "");
      // Own message delivered to P - 1 ranks; every other rank's message received once.
      EXPECT_EQ(stats.sent_bytes(),
                static_cast<std::uint64_t>(ranks - 1) * sizes[static_cast<std::size_t>(me)]);
      EXPECT_EQ(stats.received_bytes, sum_of_others(sizes, me));
      EXPECT_EQ(stats.encoded_input_bytes, count * sizeof(float));
      EXPECT_EQ(stats.encoded_message_bytes, sizes[static_cast<std::size_t>(me)]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TopK, SparseAllgather,
                         ::testing::Values("topk:ratio=0.01", "topk:ratio=0.01,approx=on",
                                           "topk:k=1", "topk:ratio=0.01,values=fp16"));

// At ratio 0.5 the union of P selections covers about P/2 of the tensor. Estimated bytes
// received per rank (f32 values, u32 indices, k = ceil(n / 2)):
//   all-gather (P - 1)(32 + 8k), dense ring 2(P - 1) 32 + 8 (P - 1) n / P.
//   P = 2, n = 4097: 16424 vs 16452 -> all-gather; n = 2^20+3: 4194352 vs 4194380 -> all-gather
//   (the ring's second header per step outweighs the half-entry k - n/2).
//   P = 3, n = 4097: 32848 vs 21973 -> ring (and more so for larger P and n).
//   n <= 7 at any P <= 5: headers dominate (n = 7, P = 5: 256 vs 300) -> all-gather.
// Either way the result is the exact sum of the decoded messages.
TEST(SparseAllgatherDenseSwitch, HalfDensityTopKSwitchesToTheRingFromThreeRanks) {
  MpiTransport world(MPI_COMM_WORLD);
  const int me = world.rank(), ranks = world.size();
  const std::unique_ptr<Codec> codec = make_codec("topk:ratio=0.5");
  ASSERT_TRUE(codec->spec().error_feedback);
  std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
  counts.push_back(kLargeCount);
  for (std::size_t count : counts) {
    SCOPED_TRACE("count " + std::to_string(count));
    const bool switches = count >= 4097 && ranks >= 3;
    const Reference reference = reference_for(*codec, count, ranks, me);
    const RunResult run = run_steps(world, *codec, count);
    expect_sum_of_decoded_messages("topk:ratio=0.5", count, run, reference);
    for (int step = 0; step < kSteps; ++step) {
      const CollectiveStats& stats = run.stats[static_cast<std::size_t>(step)];
      if (switches) {
        EXPECT_EQ(stats.algorithm, "sparse->ring");
        EXPECT_EQ(stats.note.rfind("sparse union too dense (P*k/n = ", 0), 0u) << stats.note;
        // The switch pays off: fewer bytes arrive than the all-gather would have delivered.
        EXPECT_LT(stats.received_bytes,
                  sum_of_others(reference.sizes[static_cast<std::size_t>(step)], me));
      } else {
        EXPECT_EQ(stats.algorithm, "sparse");
        EXPECT_EQ(stats.note, "");
      }
    }
  }
}

// At ratio 0.75 the ring wins from two ranks: n = 4097, k = 3073, P = 2: all-gather 24616
// bytes vs ring 16452.
TEST(SparseAllgatherDenseSwitch, ThreeQuarterDensityTopKSwitchesFromTwoRanks) {
  MpiTransport world(MPI_COMM_WORLD);
  const int me = world.rank(), ranks = world.size();
  const std::unique_ptr<Codec> codec = make_codec("topk:ratio=0.75");
  const std::size_t count = 4097;
  const Reference reference = reference_for(*codec, count, ranks, me);
  const RunResult run = run_steps(world, *codec, count);
  expect_sum_of_decoded_messages("topk:ratio=0.75", count, run, reference);
  for (const CollectiveStats& stats : run.stats) {
    if (ranks >= 2) {
      EXPECT_EQ(stats.algorithm, "sparse->ring");
      // P * 3073 / 4097 to 3 significant digits.
      const char* const density[] = {"", "", "1.5", "2.25", "3", "3.75"};
      EXPECT_NE(stats.note.find(std::string("(P*k/n = ") + density[ranks] + ")"),
                std::string::npos) << stats.note;
    } else {
      EXPECT_EQ(stats.algorithm, "sparse") << "one rank never communicates";
    }
  }
}

// Works for any codec: dense messages are all-gathered and summed in rank order too. qsgd's
// stochastic rounding draws per-rank numbers (encode_context), which the reference reproduces;
// Gaussian data makes the sums inexact, so the f32 sum in rank order (0 + D(m_0) + D(m_1) ...)
// is compared bit for bit. qsgd messages are about n bytes: never worth a ring at P <= 5
// (n = 4097, P = 5: 16660 vs 26476 bytes).
TEST(SparseAllgatherAnyCodec, QsgdMessagesAreSummedInRankOrderBitForBit) {
  MpiTransport world(MPI_COMM_WORLD);
  const int ranks = world.size();
  const std::unique_ptr<Codec> codec = make_codec("qsgd:bits=8,bucket=64");
  for (std::size_t count : kSmallCounts) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<float> expected(count, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> data = testing::gaussian_contribution(count, r, 5);
      RankOnlyTransport rank_r(r, ranks);
      CollectiveStats unused;
      const ReduceJob job{rank_r, *codec, {}, "grad", nullptr, call_context(codec->spec(), 0),
                          unused};
      const std::vector<std::byte> message = testing::encode_message(
          *codec, host_view(data.data(), count), collectives::encode_context(job, 0));
      const std::vector<float> decoded = testing::decode_to_f32(*codec, message, count);
      for (std::size_t i = 0; i < count; ++i) expected[i] += decoded[i];
    }
    // Both exchanges (allgatherv, pipelined) add in rank order, whatever the arrival order.
    for (const std::size_t segment_bytes : {std::size_t{0}, kDefaultSegmentBytes}) {
      std::vector<float> data = testing::gaussian_contribution(count, world.rank(), 5);
      CollectiveStats stats;
      ReduceJob job{world, *codec, data, "grad", nullptr, call_context(codec->spec(), 0), stats};
      job.segment_bytes = segment_bytes;
      collectives::sparse_allreduce(job);
      EXPECT_TRUE(same_bits(data, expected)) << "segment " << segment_bytes;
      EXPECT_EQ(stats.note, "");
      EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
    }
  }
}

// fp16 messages are 2n + 32 bytes: at n = 4097 the ring is cheaper from P = 5 on (all-gather
// 4 x 8226 = 32904 vs 2 x 4 x 32 + 8 x 4 x 4097 / 5 = 26476; at P = 4: 24678 vs 24774).
// Integer data: exact either way.
TEST(SparseAllgatherAnyCodec, Fp16MessagesGiveTheExactSumOnBothPaths) {
  MpiTransport world(MPI_COMM_WORLD);
  const int ranks = world.size();
  const std::unique_ptr<Codec> codec = make_codec("fp16");
  for (std::size_t count : kSmallCounts) {
    SCOPED_TRACE("count " + std::to_string(count));
    const std::vector<double> expected = testing::exact_sum(
        count, ranks, 11, [](std::size_t n, int r, std::uint64_t seed) {
          return testing::integer_contribution(n, r, seed);
        });
    std::vector<float> data = testing::integer_contribution(count, world.rank(), 11);
    CollectiveStats stats;
    ReduceJob job{world, *codec, data, "grad", nullptr, call_context(codec->spec(), 0), stats};
    collectives::sparse_allreduce(job);
    EXPECT_EQ(first_mismatch(data, expected), count);
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
    if (count == 4097 && ranks == 5) {
      EXPECT_EQ(stats.algorithm, "sparse->ring");
      EXPECT_EQ(stats.note.rfind("all-gathered dense messages cost more than a dense ring", 0),
                0u) << stats.note;
    } else {
      EXPECT_EQ(stats.note, "");
    }
  }
}

// Forwards everything to the MPI transport; tests override one call to damage what it returns
// on every rank alike (so every rank must fail alike, and none may hang).
class DamagingTransport : public testing::ForwardingTransport {
 public:
  explicit DamagingTransport(Transport& inner) : ForwardingTransport(inner) {}
};

// The last rank's message arrives with its first index set to 2^32 - 1 (>= n).
class BadIndexTransport final : public DamagingTransport {
 public:
  using DamagingTransport::DamagingTransport;
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override {
    inner().allgatherv(mine, all, counts);
    std::size_t last = 0;
    for (std::size_t r = 0; r + 1 < counts.size(); ++r) last += counts[r];
    const std::uint32_t bad_index = 0xFFFFFFFFu;
    std::memcpy(all.data() + last + compressors::kWireHeaderBytes, &bad_index, sizeof bad_index);
  }
};

// Rank 0 appears to announce one byte more than any message of the tensor can hold.
class OversizeAnnouncementTransport final : public DamagingTransport {
 public:
  OversizeAnnouncementTransport(Transport& inner, std::uint64_t size)
      : DamagingTransport(inner), size_(size) {}
  void allgather_u64(std::span<const std::uint64_t> mine,
                     std::span<std::uint64_t> all) override {
    inner().allgather_u64(mine, all);
    all[0] = size_;
  }

 private:
  std::uint64_t size_;
};

TEST(SparseAllgatherErrors, AnOutOfRangeIndexThrowsMalformedMessageOnEveryRank) {
  MpiTransport world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "one rank receives no message";
  BadIndexTransport damaged(world);
  const std::unique_ptr<Codec> codec = make_codec("topk:ratio=0.01,ef=off");
  std::vector<float> data = testing::integer_contribution(4097, world.rank(), 3);
  CollectiveStats stats;
  ReduceJob job{damaged, *codec, data, "grad", nullptr, call_context(codec->spec(), 0), stats};
  std::string text;
  EXPECT_EQ(testing::error_code_of([&] { collectives::sparse_allreduce(job); }, &text),
            ErrorCode::malformed_message);
  EXPECT_NE(text.find("topk"), std::string::npos) << text;
}

// The pipelined exchange: the last rank's messages (MessageTag::sparse_message) arrive with
// their first index set to 2^32 - 1, or 64 bytes longer than any message of the tensor. Every
// other rank holds the failure until the transfers are done, and the status all-gather makes
// the last rank (which received nothing bad) throw too, naming the others.
class PipelinedDamageTransport final : public DamagingTransport {
 public:
  PipelinedDamageTransport(Transport& inner, bool too_long) : DamagingTransport(inner), too_long_(too_long) {}
  Request isend(int peer, int tag, std::span<const std::byte> data) override {
    if (tag != collectives::tag_of(collectives::MessageTag::sparse_message) || rank() != size() - 1) return inner().isend(peer, tag, data);
    std::vector<std::byte>& copy = copies_.emplace_back(data.begin(), data.end());
    if (too_long_) {
      copy.resize(copy.size() + 64, std::byte{0});
    } else {
      const std::uint32_t bad_index = 0xFFFFFFFFu;
      std::memcpy(copy.data() + compressors::kWireHeaderBytes, &bad_index, sizeof bad_index);
    }
    return inner().isend(peer, tag, copy);
  }

 private:
  bool too_long_;
  std::deque<std::vector<std::byte>> copies_;  // live until the test ends (after every wait)
};

TEST(SparseAllgatherErrors, PipelinedExchangeThrowsMalformedMessageOnEveryRank) {
  MpiTransport world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "one rank receives no message";
  const std::unique_ptr<Codec> codec = make_codec("topk:ratio=0.01,ef=off");
  for (const bool too_long : {false, true}) {
    SCOPED_TRACE(too_long ? "too long" : "bad index");
    PipelinedDamageTransport damaged(world, too_long);
    std::vector<float> data = testing::integer_contribution(4097, world.rank(), 3);
    CollectiveStats stats;
    ReduceJob job{damaged, *codec, data, "grad", nullptr, call_context(codec->spec(), 0), stats};
    job.segment_bytes = kDefaultSegmentBytes;
    std::string text;
    EXPECT_EQ(testing::error_code_of([&] { collectives::sparse_allreduce(job); }, &text),
              ErrorCode::malformed_message);
    if (world.rank() == world.size() - 1) {
      EXPECT_NE(text.find("received malformed messages"), std::string::npos) << text;
    } else {
      EXPECT_EQ(text.find("received malformed messages"), std::string::npos) << text;
    }
    // No rank was left waiting: the world still runs collectives in step.
    EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const char>("ok", 2))));
  }
}

TEST(SparseAllgatherErrors, AnImpossibleMessageSizeThrowsBeforeTheAllgatherOnEveryRank) {
  MpiTransport world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "one rank exchanges no sizes";
  const std::unique_ptr<Codec> codec = make_codec("topk:ratio=0.01,ef=off");
  const std::size_t count = 4097;
  OversizeAnnouncementTransport damaged(world, codec->max_encoded_bytes(count) + 1);
  std::vector<float> data = testing::integer_contribution(count, world.rank(), 3);
  CollectiveStats stats;
  ReduceJob job{damaged, *codec, data, "grad", nullptr, call_context(codec->spec(), 0), stats};
  std::string text;
  EXPECT_EQ(testing::error_code_of([&] { collectives::sparse_allreduce(job); }, &text),
            ErrorCode::malformed_message);
  EXPECT_NE(text.find("rank 0 announces a message of " +
                      std::to_string(codec->max_encoded_bytes(count) + 1)),
            std::string::npos) << text;
}

}  // namespace
}  // namespace gradzip
