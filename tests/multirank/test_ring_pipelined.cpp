// Pipelined ring (collectives/ring_pipelined.cpp) at any world size: bit for bit the result and
// worker residual of the unsegmented ring over several error-feedback steps, for every codec
// that may be cut; exactly 32 more bytes per extra segment message; the spec's `segment` key
// through the Communicator with algo=ring; malformed traffic in either phase making every rank
// throw, none waiting.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/segment_plan.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "compressors/wire_format.h"
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

constexpr std::uint64_t kHeader = compressors::kWireHeaderBytes;

// One ring call on a job over `transport` with the given segment size (0: unsegmented).
struct Call {
  collectives::Transport& transport;
  const Codec& codec;
  ResidualStore* residuals = nullptr;
  std::size_t segment_bytes = 0;
  CollectiveStats stats{};

  collectives::ReduceJob job(std::span<float> data, std::uint32_t step) {
    collectives::ReduceJob job{transport, codec, data, "grad", residuals,
                               EncodeContext{13, step, 2, 0}, stats};
    job.segment_bytes = segment_bytes;
    return job;
  }
  std::size_t segments(std::span<float> data) {
    return collectives::pipeline_segments(job(data, 0), collectives::kMaxRingSegmentsPerChunk);
  }
  void allreduce(std::span<float> data, std::uint32_t step) {
    collectives::ReduceJob j = job(data, step);
    collectives::ring_allreduce(j);
  }
  void reduce_scatter(std::span<float> data, std::uint32_t step) {
    collectives::ReduceJob j = job(data, step);
    collectives::ring_reduce_scatter(j);
  }
};

ResidualStore make_store() {
  return ResidualStore(static_cast<std::uint32_t>(testing::world_size()),
                       static_cast<std::uint32_t>(testing::world_rank()), ResizePolicy::error);
}

// Every codec that may be cut, error feedback on where the codec allows it, at counts whose
// chunks end mid-bucket and mid-byte, and segment sizes from a few granules to many. Each hop
// re-encodes a partial sum, so a segment cut in the wrong place (a bucket's scale over other
// elements, a code byte split) or a wrong element offset (stochastic rounding, the residual
// slice) changes bits.
TEST(RingPipelined, EqualsTheUnsegmentedRingBitForBitOverErrorFeedbackSteps) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  for (const char* spec : {"sign", "sign:bucket=100", "qsgd:bits=4,bucket=64,ef=on",
                           "qsgd:bits=3,bucket=77,ef=on", "terngrad:bucket=7,ef=on",
                           "fp16:ef=on", "bf16", "none"}) {
    const auto codec = make_codec(spec);
    for (const std::size_t n : {std::size_t{100003}, std::size_t{65536 * 3 + 5}}) {
      for (const std::size_t segment_bytes : {std::size_t{300}, std::size_t{4096}}) {
        SCOPED_TRACE(std::string(spec) + ", count " + std::to_string(n) + ", segment " +
                     std::to_string(segment_bytes));
        ResidualStore pipelined_store = make_store(), reference_store = make_store();
        const bool feedback = codec->spec().error_feedback;
        Call pipelined{transport, *codec, feedback ? &pipelined_store : nullptr, segment_bytes};
        Call reference{transport, *codec, feedback ? &reference_store : nullptr, 0};
        std::vector<float> probe(n);
        const std::size_t segments = pipelined.segments(probe);
        if (ranks == 1) {
          EXPECT_EQ(segments, 1u);  // one rank exchanges nothing and is never cut
        } else if (segment_bytes == 300) {
          EXPECT_GT(segments, 2u);
        }
        for (std::uint32_t step = 0; step < 3; ++step) {
          std::vector<float> a = testing::gaussian_contribution(n, rank, 400 + step);
          std::vector<float> b = a;
          pipelined.allreduce(a, step);
          reference.allreduce(b, step);
          ASSERT_TRUE(testing::same_bits(a, b)) << "step " << step;
          ASSERT_TRUE(testing::identical_on_all_ranks(std::span<const float>(a)));
          if (feedback) {
            ASSERT_TRUE(testing::same_bits(pipelined_store.residual("grad"),
                                           reference_store.residual("grad")));
          }
        }
        // The residual holds real mass (the comparison above is not of zeros).
        if (feedback && codec->spec().codec != CodecKind::none) {
          const auto worker = pipelined_store.residual("grad");
          EXPECT_TRUE(std::any_of(worker.begin(), worker.end(), [](float e) { return e != 0.0f; }));
        }
      }
    }
  }
}

// The pipelined ring's sum is the sum: `none` adds exact small integers (every partial sum
// exact in f32), so the result is the exact total whatever the order of the adds.
TEST(RingPipelined, SumsExactlyWithTheUncompressedCodec) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const auto codec = make_codec("none");
  const std::size_t n = 50001;
  Call call{transport, *codec, nullptr, 1000};
  std::vector<float> data(n);
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((i % 97) + 1000 * rank);
  if (ranks > 1) {
    std::vector<float> probe(n);
    ASSERT_EQ(call.segments(probe), collectives::kMaxRingSegmentsPerChunk);
  }
  call.allreduce(data, 0);
  const float rank_sum = 1000.0f * static_cast<float>(ranks * (ranks - 1) / 2);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(data[i], static_cast<float>(ranks) * static_cast<float>(i % 97) + rank_sum) << i;
}

TEST(RingPipelined, ReduceScatterShardEqualsTheUnsegmentedOne) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::size_t n = 90001;
  const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
  for (const char* spec : {"sign:bucket=64,ef=off", "qsgd:bits=2,bucket=32", "fp16"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec);
    Call pipelined{transport, *codec, nullptr, 512};
    Call reference{transport, *codec, nullptr, 0};
    std::vector<float> a = testing::gaussian_contribution(n, rank, 78);
    std::vector<float> b = a;
    pipelined.reduce_scatter(a, 0);
    reference.reduce_scatter(b, 0);
    EXPECT_TRUE(testing::same_bits(std::span<const float>(a).subspan(begin, end - begin),
                                   std::span<const float>(b).subspan(begin, end - begin)));
  }
}

// What pipelining adds to the wire: one header per extra segment message, nothing else. The
// all-reduce sends 2 (P - 1) chunk messages per rank, each now S messages: 2 (P - 1)(S - 1)
// more headers sent, as many received; the reduce-scatter half of that.
TEST(RingPipelined, AddsExactlyOneHeaderPerExtraSegmentMessage) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::uint64_t others = static_cast<std::uint64_t>(ranks - 1);
  const std::size_t n = 200000;
  for (const char* spec : {"sign:ef=off", "qsgd:bits=4", "fp16"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec);
    Call pipelined{transport, *codec, nullptr, 2048};
    Call reference{transport, *codec, nullptr, 0};
    std::vector<float> probe(n);
    const std::uint64_t segments = pipelined.segments(probe);
    std::vector<float> a = testing::gaussian_contribution(n, rank, 5);
    std::vector<float> b = a;
    pipelined.allreduce(a, 0);
    reference.allreduce(b, 0);
    const std::uint64_t extra = 2 * others * (segments - 1) * kHeader;
    EXPECT_EQ(pipelined.stats.sent_header_bytes, reference.stats.sent_header_bytes + extra);
    EXPECT_EQ(pipelined.stats.sent_payload_bytes, reference.stats.sent_payload_bytes);
    EXPECT_EQ(pipelined.stats.received_bytes, reference.stats.received_bytes + extra);
    EXPECT_EQ(reference.stats.sent_header_bytes, 2 * others * kHeader);

    Call pipelined_rs{transport, *codec, nullptr, 2048};
    Call reference_rs{transport, *codec, nullptr, 0};
    a = testing::gaussian_contribution(n, rank, 6);
    b = a;
    pipelined_rs.reduce_scatter(a, 0);
    reference_rs.reduce_scatter(b, 0);
    EXPECT_EQ(pipelined_rs.stats.sent_header_bytes,
              reference_rs.stats.sent_header_bytes + others * (segments - 1) * kHeader);
    EXPECT_EQ(pipelined_rs.stats.sent_payload_bytes, reference_rs.stats.sent_payload_bytes);
  }
}

// The spec key reaches the ring through the Communicator: the default (64 KiB) and an explicit
// size cut a large tensor into the planned number of segments, segment=0 does not, and all give
// the same bits.
TEST(RingPipelined, SpecKeyDrivesTheCommunicator) {
  Communicator comm = Communicator::world();
  const int ranks = comm.size(), rank = comm.rank();
  const std::size_t n = std::size_t{1} << 20;
  const std::vector<float> input = testing::gaussian_contribution(n, rank, 22);
  std::vector<std::size_t> chunks;
  for (int c = 0; c < ranks; ++c) chunks.push_back(shard_begin(n, ranks, c + 1) - shard_begin(n, ranks, c));
  std::vector<float> reference;
  for (const auto& [spec, segment_bytes] :
       std::vector<std::pair<std::string, std::size_t>>{{"fp16:algo=ring,segment=0", 0},
                                                        {"fp16:algo=ring", 65536},
                                                        {"fp16:algo=ring,segment=8192", 8192}}) {
    SCOPED_TRACE(spec);
    std::vector<float> data = input;
    const CollectiveStats stats = comm.allreduce(host_view(data.data(), n), spec, spec);
    EXPECT_EQ(stats.algorithm, "ring");
    if (reference.empty()) reference = data;
    EXPECT_TRUE(testing::same_bits(data, reference));
    const auto codec = make_codec(spec);
    const std::uint64_t segments = collectives::segments_per_chunk(
        *codec, chunks, segment_bytes, collectives::kMaxRingSegmentsPerChunk);
    if (segment_bytes == 0) {
      EXPECT_EQ(segments, 1u);
    } else if (ranks > 1) {
      // Chunks of 2^20 / P fp16 elements (>= 419,430 bytes, >= 7 messages of 64 KiB; 51 of
      // 8 KiB): the ring's cap or just under it.
      EXPECT_GE(segments, 7u);
      EXPECT_LE(segments, collectives::kMaxRingSegmentsPerChunk);
      if (segment_bytes == 8192) {
        EXPECT_EQ(segments, collectives::kMaxRingSegmentsPerChunk);
      }
    }
    EXPECT_EQ(stats.sent_header_bytes,
              ranks == 1 ? 0 : 2 * static_cast<std::uint64_t>(ranks - 1) * segments * kHeader);
  }
}

// ---- malformed traffic: every rank throws, none waits -------------------------------------------

// Forwards to MPI; the last rank damages the messages it sends with the tags of one phase
// (`tags`: the reduce-scatter's, or the all-gather's two): a flipped magic byte, or 64 bytes
// more than the message (longer than any receive buffer of its segment).
class DamagingTransport final : public testing::ForwardingTransport {
 public:
  enum class Damage { bad_magic, too_long };
  DamagingTransport(MpiTransport& inner, std::vector<int> tags, Damage damage)
      : ForwardingTransport(inner), tags_(std::move(tags)), damage_(damage) {}

  std::string describe() const override { return "damaging " + inner().describe(); }
  Request isend(int peer, int tag, std::span<const std::byte> data) override {
    if (std::find(tags_.begin(), tags_.end(), tag) == tags_.end() || rank() != size() - 1)
      return inner().isend(peer, tag, data);
    std::vector<std::byte>& copy = copies_.emplace_back(data.begin(), data.end());
    if (damage_ == Damage::bad_magic) copy[0] ^= std::byte{0xFF};
    else copy.resize(copy.size() + 64, std::byte{0});
    return inner().isend(peer, tag, copy);
  }

 private:
  std::vector<int> tags_;
  Damage damage_;
  std::deque<std::vector<std::byte>> copies_;  // live until the test ends (after every wait)
};

// The last rank sends to rank 0. Damaged reduce-scatter segments reach rank 0 only (it sends
// its own valid encodes on); damaged all-gather segments are forwarded as they came, so every
// rank but the last receives bad bytes. Either way the last rank receives nothing damaged and
// names the ranks that did.
TEST(RingPipelined, MalformedTrafficInEitherPhaseThrowsOnEveryRank) {
  if (testing::world_size() == 1) GTEST_SKIP() << "a single rank exchanges nothing to damage";
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("qsgd:bits=4,bucket=64");
  // ring_pipelined.cpp's tags: the reduce-scatter's, the all-gather's by step parity.
  const std::vector<int> reduce_scatter_tags{150}, allgather_tags{151, 152};
  for (const bool allgather : {false, true}) {
    for (const auto damage : {DamagingTransport::Damage::bad_magic, DamagingTransport::Damage::too_long}) {
      SCOPED_TRACE(std::string(allgather ? "all-gather" : "reduce-scatter") +
                   (damage == DamagingTransport::Damage::bad_magic ? ", bad magic" : ", too long"));
      DamagingTransport damaging(transport, allgather ? allgather_tags : reduce_scatter_tags, damage);
      Call call{damaging, *codec, nullptr, 1024};
      std::vector<float> data = testing::gaussian_contribution(40000, testing::world_rank(), 61);
      ASSERT_GT(call.segments(data), 1u);
      std::string message;
      EXPECT_EQ(testing::error_code_of([&] { call.allreduce(data, 0); }, &message),
                ErrorCode::malformed_message)
          << message;
      const int rank = testing::world_rank(), last = testing::world_size() - 1;
      const bool received_damage = allgather ? rank != last : rank == 0;
      if (received_damage) {
        EXPECT_EQ(message.find("received malformed messages"), std::string::npos) << message;
      } else {
        EXPECT_NE(message.find("received malformed messages"), std::string::npos) << message;
      }
      // Every rank left the call at the same point: the world still runs collectives in step.
      EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const char>("ok", 2))));
    }
  }
}

}  // namespace
}  // namespace gradzip
