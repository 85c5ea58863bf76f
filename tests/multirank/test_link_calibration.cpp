// measure_link (collectives/link_calibration.h): every rank gets the same link, bit for bit,
// and the figures are those of a real link.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "collectives/link_calibration.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "gradzip/error.h"
#include "tests/multirank/multirank_support.h"

namespace gradzip {
namespace {

using collectives::LinkCalibration;
using collectives::LinkModel;
using collectives::MpiTransport;

TEST(LinkCalibration, EveryRankGetsTheSameLinkAndItIsPlausible) {
  MpiTransport transport(MPI_COMM_WORLD);
  const LinkModel link = collectives::measure_link(transport, LinkCalibration{8, 3, std::size_t{4} << 20});
  if (testing::world_size() == 1) {
    EXPECT_EQ(link.latency_s, 0.0);
    EXPECT_TRUE(std::isinf(link.bytes_per_s));
    return;
  }
  if (testing::world_rank() == 0)
    std::printf("measured link: latency %.2f us, bandwidth %.1f MB/s, collective %.2f us\n",
                link.latency_s * 1e6, link.bytes_per_s / 1e6, link.collective_latency_s * 1e6);
  // The same bits on every rank: a choice made from them is the same everywhere.
  const std::vector<std::uint64_t> bits = {std::bit_cast<std::uint64_t>(link.latency_s),
                                           std::bit_cast<std::uint64_t>(link.bytes_per_s),
                                           std::bit_cast<std::uint64_t>(link.collective_latency_s),
                                           std::bit_cast<std::uint64_t>(link.exchange_bytes_per_s)};
  EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const std::uint64_t>(bits))));
  // Shared memory or TCP on one host, oversubscribed or not: a message takes more than 10 ns
  // and less than a second; 4 MiB move at more than 1 MB/s and less than 10 TB/s.
  EXPECT_GT(link.latency_s, 1e-8);
  EXPECT_LT(link.latency_s, 1.0);
  EXPECT_GT(link.bytes_per_s, 1e6);
  EXPECT_LT(link.bytes_per_s, 1e13);
  // A collective's start-up: as bounded as a message's; the pairwise-exchange rate is not
  // measured (0: the ring's).
  EXPECT_GT(link.collective_latency_s, 1e-8);
  EXPECT_LT(link.collective_latency_s, 1.0);
  EXPECT_EQ(link.exchange_bytes_per_s, 0.0);
}

TEST(LinkCalibration, EmptyRoundsAreRefusedOnEveryRankBeforeAnyMessage) {
  MpiTransport transport(MPI_COMM_WORLD);
  for (const LinkCalibration bad : {LinkCalibration{0, 1, 8}, LinkCalibration{1, 0, 8},
                                    LinkCalibration{1, 1, 0}}) {
    try {
      collectives::measure_link(transport, bad);
      ADD_FAILURE() << "accepted " << bad.small_rounds << "/" << bad.large_rounds << "/"
                    << bad.large_bytes;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
    }
  }
  // The transport is still usable afterwards: nothing was posted.
  const LinkModel link = collectives::measure_link(transport, LinkCalibration{2, 1, 1024});
  EXPECT_GE(link.latency_s, 0.0);
}

}  // namespace
}  // namespace gradzip
