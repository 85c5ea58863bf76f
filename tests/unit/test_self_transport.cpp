// The one-rank SelfTransport: messages to self arrive in posting order per tag, bigger messages
// than the receive buffer and receives with nothing sent are refused, and a Communicator over it
// reduces like a one-rank MPI run (D(C(x)) for lossy codecs, x itself for `none`).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "collectives/transport/self_transport.h"
#include "gradzip/error.h"

namespace gradzip {
namespace {

using collectives::SelfTransport;

std::span<const std::byte> bytes_of(const std::vector<int>& values) {
  return std::as_bytes(std::span<const int>(values));
}

TEST(SelfTransport, MessagesArriveInPostingOrderPerTag) {
  SelfTransport transport;
  const std::vector<int> first = {1, 2, 3};
  const std::vector<int> second = {4, 5};
  const std::vector<int> other_tag = {9};
  std::vector<int> got_a(3, 0), got_b(3, 0), got_c(1, 0);
  const auto ra = transport.irecv(0, 7, std::as_writable_bytes(std::span<int>(got_a)));
  const auto rc = transport.irecv(0, 8, std::as_writable_bytes(std::span<int>(got_c)));
  const auto rb = transport.irecv(0, 7, std::as_writable_bytes(std::span<int>(got_b)));
  const auto s1 = transport.isend(0, 7, bytes_of(first));
  const auto s3 = transport.isend(0, 8, bytes_of(other_tag));
  const auto s2 = transport.isend(0, 7, bytes_of(second));
  EXPECT_EQ(transport.wait(s1), 12u);
  EXPECT_EQ(transport.wait(ra), 12u);
  EXPECT_EQ(transport.wait(rb), 8u);
  EXPECT_EQ(transport.wait(rc), 4u);
  EXPECT_EQ(transport.wait(s2), 8u);
  EXPECT_EQ(transport.wait(s3), 4u);
  EXPECT_EQ(got_a, first);
  EXPECT_EQ(got_b, (std::vector<int>{4, 5, 0}));
  EXPECT_EQ(got_c, other_tag);
}

TEST(SelfTransport, RefusesWhatCouldNeverComplete) {
  SelfTransport transport;
  std::vector<int> small(1, 0);
  const std::vector<int> big = {1, 2};
  const auto receive = transport.irecv(0, 1, std::as_writable_bytes(std::span<int>(small)));
  transport.isend(0, 1, bytes_of(big));
  try {
    transport.wait(receive);
    FAIL() << "an 8-byte message fitted a 4-byte buffer";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::malformed_message);
  }
  SelfTransport lonely;
  const auto unmatched = lonely.irecv(0, 3, std::as_writable_bytes(std::span<int>(small)));
  try {
    lonely.wait(unmatched);
    FAIL() << "a receive with no send completed";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::internal);
  }
  EXPECT_THROW(lonely.isend(1, 0, bytes_of(big)), Error);
}

TEST(SelfTransport, ACommunicatorOverItGivesTheOneRankResult) {
  Communicator communicator = collectives::make_communicator(std::make_unique<SelfTransport>());
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i) - 0.3f;
  std::vector<float> dense = values;
  communicator.allreduce(host_view(dense.data(), dense.size()), "dense", "none");
  EXPECT_EQ(dense, values);

  // A lossy codec at one rank: the result is D(C(x)), within one quantisation step of x:
  // |D(C(x)) - x| <= scale / (2^(bits-1) - 1), scale = the bucket's max |x| <= 0.699.
  std::vector<float> quantised = values;
  const CollectiveStats stats = communicator.allreduce(
      host_view(quantised.data(), quantised.size()), "q", "qsgd:bits=4,bucket=128,algo=ring");
  EXPECT_EQ(stats.algorithm, "ring");
  EXPECT_NE(quantised, values);
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_LE(std::abs(quantised[i] - values[i]), 0.7f / 7.0f) << i;
  }
}

}  // namespace
}  // namespace gradzip

namespace gradzip {
namespace {

TEST(CommunicatorFromNccl, RefusesANullCommunicatorOrABuildWithoutNccl) {
  try {
    Communicator::from_nccl(nullptr);
    FAIL() << "a null ncclComm_t was accepted";
  } catch (const Error& error) {
    // With NCCL in the build: the null handle; without: the build.
    const bool built = collectives::nccl_transport_built();
    EXPECT_EQ(error.code(), built ? ErrorCode::invalid_argument : ErrorCode::unsupported);
    EXPECT_NE(std::string(error.what()).find(built ? "is null" : "without NCCL"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace gradzip
