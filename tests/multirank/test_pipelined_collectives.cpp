// The pipelined ring and SRA (collectives/ring_pipelined.cpp, collectives/sra_pipelined.cpp) at
// any world size, each case for both algorithms: bit for bit the result and residuals of the
// unsegmented algorithm over several error-feedback steps, for every codec that may be cut;
// exact sums with `none`; exactly 32 more bytes per extra segment message; the spec's `segment`
// key through the Communicator (and refused when ranks disagree on it); malformed traffic in
// either phase making every rank throw, none waiting.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
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

using collectives::MessageTag;
using collectives::MpiTransport;
using collectives::shard_begin;
using collectives::tag_of;
using error_feedback::ResidualStore;
using testing::TagDamagingTransport;

constexpr std::uint64_t kHeader = compressors::kWireHeaderBytes;

// The two pipelined algorithms, what distinguishes them in these tests.
struct Pipelined {
  const char* name;  // the stats name, and the algo= value
  void (*allreduce)(collectives::ReduceJob&);
  void (*reduce_scatter)(collectives::ReduceJob&);
  std::size_t (*segments)(const collectives::ReduceJob&);  // its segments per chunk for a job
  std::size_t max_segments;  // its cap on segments per chunk
  int min_ranks;             // the fewest ranks it pipelines with
  std::vector<int> first_phase_tags, second_phase_tags;  // its tags (collectives/message_tags.h)
  bool server_residual;                        // SRA's owner keeps a residual too
};

const std::vector<Pipelined>& algorithms() {
  static const std::vector<Pipelined> all{
      {"ring", &collectives::ring_allreduce, &collectives::ring_reduce_scatter,
       &collectives::ring_pipeline_segments, collectives::kMaxRingSegmentsPerChunk,
       collectives::kMinRanksForPipelinedRing,
       {tag_of(MessageTag::ring_segment_reduce_scatter)},
       {tag_of(MessageTag::ring_segment_allgather_even), tag_of(MessageTag::ring_segment_allgather_odd)},
       false},
      {"sra", &collectives::sra_allreduce, &collectives::sra_reduce_scatter,
       [](const collectives::ReduceJob& job) { return collectives::pipeline_segments(job); },
       collectives::kMaxSegmentsPerChunk, 2, {tag_of(MessageTag::sra_contribution)},
       {tag_of(MessageTag::sra_owner)}, true}};
  return all;
}

// One call of `algo` on a job over `transport` with the given segment size (0: unsegmented).
struct Call {
  const Pipelined& algo;
  collectives::Transport& transport;
  const Codec& codec;
  ResidualStore* residuals = nullptr;
  std::size_t segment_bytes = 0;
  CollectiveStats stats{};

  collectives::ReduceJob job(std::span<float> data, std::uint32_t step) {
    collectives::ReduceJob job{transport, codec, data, "grad", residuals,
                               EncodeContext{11, step, 4, 0}, stats};
    job.segment_bytes = segment_bytes;
    return job;
  }
  std::size_t segments(std::span<float> data) {
    return algo.segments(job(data, 0));
  }
  void allreduce(std::span<float> data, std::uint32_t step) {
    collectives::ReduceJob j = job(data, step);
    algo.allreduce(j);
  }
  void reduce_scatter(std::span<float> data, std::uint32_t step) {
    collectives::ReduceJob j = job(data, step);
    algo.reduce_scatter(j);
  }
};

ResidualStore make_store() {
  return ResidualStore(static_cast<std::uint32_t>(testing::world_size()),
                       static_cast<std::uint32_t>(testing::world_rank()), ResizePolicy::error);
}

// Every codec that may be cut, with error feedback on where the spec says so (so every residual
// role is compared), at counts whose chunks end mid-bucket and mid-byte, and segment sizes from a
// few granules to many. The ring re-encodes a partial sum at every hop, so a cut in the wrong
// place (a bucket's scale over other elements, a code byte split) or a wrong element offset
// (stochastic rounding, the residual slice) changes bits.
TEST(PipelinedCollectives, EqualTheUnsegmentedAlgorithmBitForBitOverErrorFeedbackSteps) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::string server_key =
      collectives::residual_key(collectives::ResidualRole::sra_server, "grad");
  for (const Pipelined& algo : algorithms()) {
    for (const char* spec : {"sign", "sign:bucket=100", "qsgd:bits=4,bucket=64,ef=on",
                             "qsgd:bits=3,bucket=77,ef=on", "terngrad:bucket=7,ef=on",
                             "fp16:ef=on", "bf16", "none"}) {
      const auto codec = make_codec(spec);
      const bool feedback = codec->spec().error_feedback;
      for (const std::size_t n : {std::size_t{100003}, std::size_t{65536 * 3 + 5}}) {
        for (const std::size_t segment_bytes : {std::size_t{300}, std::size_t{4096}}) {
          SCOPED_TRACE(std::string(algo.name) + ", " + spec + ", count " + std::to_string(n) +
                       ", segment " + std::to_string(segment_bytes));
          ResidualStore pipelined_store = make_store(), reference_store = make_store();
          Call pipelined{algo, transport, *codec, feedback ? &pipelined_store : nullptr, segment_bytes};
          Call reference{algo, transport, *codec, feedback ? &reference_store : nullptr, 0};
          std::vector<float> probe(n);
          const std::size_t segments = pipelined.segments(probe);
          // SRA pipelines from 2 ranks on, the ring from 3 (one rank exchanges nothing and is
          // never cut); 300-byte messages cut every chunk of these counts (4096 may leave
          // sign's whole).
          if (ranks < algo.min_ranks) {
            EXPECT_EQ(segments, 1u);
          } else if (segment_bytes == 300) {
            EXPECT_GT(segments, 2u);
          }
          for (std::uint32_t step = 0; step < 3; ++step) {
            std::vector<float> a = testing::gaussian_contribution(n, rank, 300 + step);
            std::vector<float> b = a;
            pipelined.allreduce(a, step);
            reference.allreduce(b, step);
            ASSERT_TRUE(testing::same_bits(a, b)) << "step " << step;
            ASSERT_TRUE(testing::identical_on_all_ranks(std::span<const float>(a)));
            if (!feedback) continue;
            ASSERT_TRUE(testing::same_bits(pipelined_store.residual("grad"),
                                           reference_store.residual("grad")));
            if (algo.server_residual) {
              ASSERT_TRUE(testing::same_bits(pipelined_store.residual(server_key),
                                             reference_store.residual(server_key)));
            }
          }
          // The residuals hold real mass (the comparison above is not of zeros).
          if (feedback && codec->spec().codec != CodecKind::none) {
            const auto worker = pipelined_store.residual("grad");
            EXPECT_TRUE(std::any_of(worker.begin(), worker.end(), [](float e) { return e != 0.0f; }));
          }
        }
      }
    }
  }
}

// The sum is the sum: `none` adds exact small integers (every partial sum exact in f32), so the
// result is the exact total whatever the order of the adds.
TEST(PipelinedCollectives, SumExactlyWithTheUncompressedCodec) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const auto codec = make_codec("none");
  const std::size_t n = 50001;
  for (const Pipelined& algo : algorithms()) {
    SCOPED_TRACE(algo.name);
    Call call{algo, transport, *codec, nullptr, 1000};
    std::vector<float> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((i % 97) + 1000 * rank);
    if (ranks >= algo.min_ranks) {
      std::vector<float> probe(n);
      // Chunks of at least 50001 / 5 f32 elements (40,000 bytes) in 968-byte segments: >= 42,
      // the ring capped at 8.
      const std::size_t segments = call.segments(probe);
      if (algo.server_residual) {
        ASSERT_GE(segments, 42u);
      } else {
        ASSERT_EQ(segments, collectives::kMaxRingSegmentsPerChunk);
      }
    }
    call.allreduce(data, 0);
    const float rank_sum = 1000.0f * static_cast<float>(ranks * (ranks - 1) / 2);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(data[i], static_cast<float>(ranks) * static_cast<float>(i % 97) + rank_sum) << i;
  }
}

TEST(PipelinedCollectives, ReduceScatterShardEqualsTheUnsegmentedOne) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::size_t n = 90001;
  const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
  for (const Pipelined& algo : algorithms()) {
    for (const char* spec : {"sign:bucket=64,ef=off", "qsgd:bits=2,bucket=32", "fp16"}) {
      SCOPED_TRACE(std::string(algo.name) + ", " + spec);
      const auto codec = make_codec(spec);
      Call pipelined{algo, transport, *codec, nullptr, 512};
      Call reference{algo, transport, *codec, nullptr, 0};
      std::vector<float> a = testing::gaussian_contribution(n, rank, 77);
      std::vector<float> b = a;
      pipelined.reduce_scatter(a, 0);
      reference.reduce_scatter(b, 0);
      EXPECT_TRUE(testing::same_bits(std::span<const float>(a).subspan(begin, end - begin),
                                     std::span<const float>(b).subspan(begin, end - begin)));
    }
  }
}

// What pipelining adds to the wire: one header per extra segment message, nothing else. Both
// all-reduces send 2 (P - 1) chunk messages per rank (SRA: P - 1 contributions and the owner
// message to P - 1 ranks), each now S messages: 2 (P - 1)(S - 1) more headers sent, as many
// received. Reduce-scatter: half.
TEST(PipelinedCollectives, AddExactlyOneHeaderPerExtraSegmentMessage) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const std::uint64_t others = static_cast<std::uint64_t>(ranks - 1);
  const std::size_t n = 200000;
  for (const Pipelined& algo : algorithms()) {
    for (const char* spec : {"sign:ef=off", "qsgd:bits=4", "fp16"}) {
      SCOPED_TRACE(std::string(algo.name) + ", " + spec);
      const auto codec = make_codec(spec);
      Call pipelined{algo, transport, *codec, nullptr, 2048};
      Call reference{algo, transport, *codec, nullptr, 0};
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
      // The reference's own count: 2 (P - 1) messages, one header each.
      EXPECT_EQ(reference.stats.sent_header_bytes, 2 * others * kHeader);

      Call pipelined_rs{algo, transport, *codec, nullptr, 2048};
      Call reference_rs{algo, transport, *codec, nullptr, 0};
      a = testing::gaussian_contribution(n, rank, 6);
      b = a;
      pipelined_rs.reduce_scatter(a, 0);
      reference_rs.reduce_scatter(b, 0);
      EXPECT_EQ(pipelined_rs.stats.sent_header_bytes,
                reference_rs.stats.sent_header_bytes + others * (segments - 1) * kHeader);
      EXPECT_EQ(pipelined_rs.stats.sent_payload_bytes, reference_rs.stats.sent_payload_bytes);
    }
  }
}

// The spec key reaches both algorithms through the Communicator: the default (64 KiB) and an
// explicit size cut a large tensor into the planned number of segments, segment=0 does not, and
// all give the same bits (no error feedback: every call encodes the same input).
TEST(PipelinedCollectives, SpecKeyDrivesTheCommunicator) {
  Communicator comm = Communicator::world();
  const int ranks = comm.size(), rank = comm.rank();
  const std::size_t n = std::size_t{1} << 20;
  const std::vector<float> input = testing::gaussian_contribution(n, rank, 21);
  std::vector<std::size_t> chunks;
  for (int c = 0; c < ranks; ++c) chunks.push_back(shard_begin(n, ranks, c + 1) - shard_begin(n, ranks, c));
  for (const Pipelined& algo : algorithms()) {
    // sign through SRA (chunks of 2^20 / P elements: >= 27,856 bytes), fp16 through the ring
    // (>= 419,430 bytes).
    const std::string base =
        std::string(algo.server_residual ? "sign:ef=off," : "fp16:") + "algo=" + algo.name;
    std::vector<float> reference;
    for (const std::size_t segment_bytes : {std::size_t{0}, std::size_t{65536}, std::size_t{8192}}) {
      const std::string spec =
          segment_bytes == 65536 ? base : base + ",segment=" + std::to_string(segment_bytes);
      SCOPED_TRACE(spec);
      std::vector<float> data = input;
      const CollectiveStats stats = comm.allreduce(host_view(data.data(), n), spec, spec);
      EXPECT_EQ(stats.algorithm, algo.name);
      if (reference.empty()) reference = data;
      EXPECT_TRUE(testing::same_bits(data, reference));
      const auto codec = make_codec(spec);
      const std::uint64_t segments =
          ranks < algo.min_ranks
              ? 1
              : collectives::segments_per_chunk(*codec, chunks, segment_bytes, algo.max_segments);
      if (segment_bytes == 0) {
        EXPECT_EQ(segments, 1u);
      } else if (ranks >= algo.min_ranks && segment_bytes == 8192) {
        EXPECT_GT(segments, 2u);
        EXPECT_LE(segments, algo.max_segments);
      }
      // One rank sends nothing; otherwise 2 (P - 1) messages of S segments each.
      EXPECT_EQ(stats.sent_header_bytes,
                ranks == 1 ? 0 : 2 * static_cast<std::uint64_t>(ranks - 1) * segments * kHeader);
    }
  }
}

TEST(PipelinedCollectives, RanksDisagreeingOnTheSegmentSizeThrowOnEveryRank) {
  if (testing::world_size() == 1) GTEST_SKIP() << "a single rank cannot disagree with another";
  Communicator comm = Communicator::world();
  std::vector<float> data = testing::gaussian_contribution(300000, comm.rank(), 3);
  for (const char* codec : {"sign:algo=sra", "fp16:algo=ring"}) {
    SCOPED_TRACE(codec);
    const std::string spec = comm.rank() == 0 ? std::string(codec) + ",segment=4096" : codec;
    std::string message;
    const ErrorCode code = testing::error_code_of(
        [&] { comm.allreduce(host_view(data.data(), data.size()), codec, spec); }, &message);
    EXPECT_EQ(code, ErrorCode::size_mismatch) << message;
    EXPECT_NE(message.find("segment=4096"), std::string::npos) << message;
    EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const char>("ok", 2))));
  }
}

// ---- malformed traffic: every rank throws, none waits -------------------------------------------

// The last rank damages what it sends in one phase (testing::TagDamagingTransport). SRA: each
// rank's contributions reach their owners, and owner messages every rank, so every rank but the
// last receives damage in either phase. The ring: the last rank sends to rank 0 only; damaged
// reduce-scatter segments stop there (rank 0 sends its own valid encodes on), damaged all-gather
// segments are forwarded as they came, to every rank but the last. A rank that received nothing
// damaged names the ranks that did.
TEST(PipelinedCollectives, MalformedTrafficInEitherPhaseThrowsOnEveryRank) {
  if (testing::world_size() == 1) GTEST_SKIP() << "a single rank exchanges nothing to damage";
  MpiTransport transport(MPI_COMM_WORLD);
  const auto codec = make_codec("qsgd:bits=4,bucket=64");
  const int rank = testing::world_rank(), last = testing::world_size() - 1;
  for (const Pipelined& algo : algorithms()) {
    // Below its fewest ranks the algorithm runs unsegmented, whose malformed-message handling
    // its own tests cover.
    if (testing::world_size() < algo.min_ranks) continue;
    for (const bool second_phase : {false, true}) {
      for (const auto damage :
           {TagDamagingTransport::Damage::bad_magic, TagDamagingTransport::Damage::too_long}) {
        SCOPED_TRACE(std::string(algo.name) + (second_phase ? ", second phase" : ", first phase") +
                     (damage == TagDamagingTransport::Damage::bad_magic ? ", bad magic" : ", too long"));
        TagDamagingTransport damaging(
            transport, second_phase ? algo.second_phase_tags : algo.first_phase_tags, damage);
        Call call{algo, damaging, *codec, nullptr, 1024};
        std::vector<float> data = testing::gaussian_contribution(40000, rank, 59);
        ASSERT_GT(call.segments(data), 1u);
        std::string message;
        EXPECT_EQ(testing::error_code_of([&] { call.allreduce(data, 0); }, &message),
                  ErrorCode::malformed_message)
            << message;
        const bool ring_reduce_scatter = !algo.server_residual && !second_phase;
        const bool received_damage = ring_reduce_scatter ? rank == 0 : rank != last;
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
}

}  // namespace
}  // namespace gradzip
