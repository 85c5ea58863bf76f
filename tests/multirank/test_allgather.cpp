// The compressed all-gather (collectives/allgather.cpp) at every world size ctest runs (1..5):
// every shard ends as its owner's D(C(shard)), byte-identical on every rank, exact for `none`;
// byte counts; error feedback keeps exactly what the owner's shard lost.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::ReduceJob;
using collectives::shard_begin;

constexpr std::size_t kSmallCounts[] = {0, 1, 7, 4097};
constexpr std::size_t kLargeCount = (std::size_t{1} << 20) + 3;
constexpr float kNotWritten = std::numeric_limits<float>::quiet_NaN();

using testing::same_bits;

// This rank's input: its shard of `full`, NaN elsewhere (so a shard left unwritten shows).
std::vector<float> own_shard_of(const std::vector<float>& full, int rank, int ranks) {
  std::vector<float> data(full.size(), kNotWritten);
  const std::size_t begin = shard_begin(full.size(), ranks, rank);
  const std::size_t end = shard_begin(full.size(), ranks, rank + 1);
  std::copy(full.begin() + begin, full.begin() + end, data.begin() + begin);
  return data;
}

TEST(CompressedAllgather, NoneDeliversEveryShardExactly) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  const auto codec = make_codec("none");
  std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
  counts.push_back(kLargeCount);
  for (std::size_t n : counts) {
    SCOPED_TRACE(::testing::Message() << "count " << n << ", " << ranks << " ranks");
    const std::uint64_t seed = 100 + n;
    std::vector<float> data =
        own_shard_of(testing::integer_contribution(n, rank, seed), rank, ranks);
    CollectiveStats stats;
    ReduceJob job{transport, *codec, data, "grad", nullptr, EncodeContext{}, stats};
    collectives::compressed_allgather(job);

    // Shard s is rank s's data, bit for bit.
    std::vector<float> expected(n);
    for (int s = 0; s < ranks; ++s) {
      const std::vector<float> owner = testing::integer_contribution(n, s, seed);
      const std::size_t begin = shard_begin(n, ranks, s), end = shard_begin(n, ranks, s + 1);
      std::copy(owner.begin() + begin, owner.begin() + end, expected.begin() + begin);
    }
    EXPECT_TRUE(same_bits(data, expected));
    EXPECT_TRUE(testing::identical_on_all_ranks(data));

    // This rank's message (32 + 4 bytes per element) goes to P - 1 ranks, the others' come
    // back; each message's 8-byte size travels the same way first.
    const auto shard = [&](int s) {
      return shard_begin(n, ranks, s + 1) - shard_begin(n, ranks, s);
    };
    const std::uint64_t others = static_cast<std::uint64_t>(ranks - 1);
    EXPECT_EQ(stats.sent_header_bytes, others * (32 + 8));
    EXPECT_EQ(stats.sent_payload_bytes, others * 4 * shard(rank));
    EXPECT_EQ(stats.received_bytes, others * (32 + 8) + 4 * (n - shard(rank)));
    EXPECT_EQ(stats.encoded_input_bytes, 4 * shard(rank));
  }
}

const char* const kLossySpecs[] = {
    "fp16", "bf16", "qsgd:bits=4", "qsgd:bits=8", "sign", "topk:ratio=0.01", "randk:ratio=0.1"};

// The owner's shard equals D(C(shard)) computed here with the codec and the context the
// algorithm encodes with (encode_context at the shard's first element), and the whole result
// is identical on every rank: so every rank holds every owner's D(C(shard)).
TEST(CompressedAllgather, EveryShardIsItsOwnersDecodedMessage) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  for (const char* spec_text : kLossySpecs) {
    const auto codec = make_codec(spec_text);
    std::vector<std::size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
    if (codec->spec().codec == CodecKind::qsgd && codec->spec().bits == 4)
      counts.push_back(kLargeCount);
    for (std::size_t n : counts) {
      SCOPED_TRACE(::testing::Message()
                   << spec_text << ", count " << n << ", " << ranks << " ranks");
      const std::vector<float> full = testing::gaussian_contribution(n, rank, 200 + n);
      std::vector<float> data = own_shard_of(full, rank, ranks);
      CollectiveStats stats;
      ReduceJob job{transport, *codec, data, "grad", nullptr, EncodeContext{9, 4, 2, 0}, stats};
      const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
      const std::vector<float> expected = testing::decode_to_f32(
          *codec,
          testing::encode_message(*codec,
                                  ConstTensorView(full.data() + begin, end - begin, DType::f32),
                                  collectives::encode_context(job, begin)),
          end - begin);
      collectives::compressed_allgather(job);
      EXPECT_TRUE(same_bits(std::span<const float>(data).subspan(begin, end - begin), expected));
      EXPECT_TRUE(testing::identical_on_all_ranks(data));
    }
  }
}

// With error feedback the owner encodes g' = fl(g + e) and keeps e' = fl(g' - D(C(g'))) for
// its shard. Top-k decodes every element to g'[i] or 0, so that subtraction is exact and
//   result[i] + e'[i] == fl(g[i] + e[i])   bit for bit,
// while the residual outside this rank's shard is never touched (stays 0).
TEST(CompressedAllgather, ErrorFeedbackKeepsExactlyWhatTheShardLost) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), ranks = transport.size();
  const auto codec = make_codec("topk:ratio=0.01");
  constexpr std::size_t n = 4097;
  error_feedback::ResidualStore store(static_cast<std::uint32_t>(ranks),
                                      static_cast<std::uint32_t>(rank), ResizePolicy::error);
  const std::size_t begin = shard_begin(n, ranks, rank), end = shard_begin(n, ranks, rank + 1);
  for (std::uint32_t call = 0; call < 3; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call << ", " << ranks << " ranks");
    const std::vector<float> full = testing::gaussian_contribution(n, rank, 300 + call);
    std::vector<float> corrected(n, 0.0f);
    for (std::size_t i = begin; i < end; ++i)
      corrected[i] = full[i] + (store.contains("grad") ? store.residual("grad")[i] : 0.0f);
    std::vector<float> data = own_shard_of(full, rank, ranks);
    CollectiveStats stats;
    ReduceJob job{transport, *codec, data, "grad", &store, EncodeContext{0, call, 2, 0}, stats};
    collectives::compressed_allgather(job);
    EXPECT_TRUE(testing::identical_on_all_ranks(data));

    const std::span<const float> residual = store.residual("grad");
    if (residual.size() != n) {  // not ASSERT: every rank must reach the next collective
      ADD_FAILURE() << "residual of " << residual.size() << " elements";
      continue;
    }
    std::size_t mismatches = 0, kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i >= begin && i < end) {
        mismatches += data[i] + residual[i] != corrected[i];
        kept += data[i] != 0.0f;
      } else {
        mismatches += residual[i] != 0.0f;
      }
    }
    EXPECT_EQ(mismatches, 0u);
    // k = ceil(0.01 * shard) elements of the shard were delivered.
    EXPECT_EQ(kept, codec->spec().k_for(end - begin));
  }
}

}  // namespace
}  // namespace gradzip
