#include "collectives/link_calibration.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

constexpr int kCalibrationTag = 130;

// Median seconds of `rounds` ring exchanges of `bytes` (after one unmeasured round that sets up
// the connections).
double median_round_seconds(Transport& transport, std::size_t bytes, std::size_t rounds) {
  const int ranks = transport.size(), rank = transport.rank();
  const int next = (rank + 1) % ranks, previous = (rank + ranks - 1) % ranks;
  std::vector<std::byte> out(bytes, std::byte{0x5A}), in(bytes);
  std::vector<double> seconds;
  for (std::size_t round = 0; round <= rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    PendingRequests pending(transport);
    const std::size_t receive = pending.add(transport.irecv(previous, kCalibrationTag, in));
    const std::size_t send = pending.add(transport.isend(next, kCalibrationTag, out));
    const std::size_t received = pending.wait(receive);
    pending.wait(send);
    GZ_REQUIRE(received == bytes, ErrorCode::internal, "measure_link: received ", received,
               " bytes from rank ", previous, ", expected ", bytes);
    if (round > 0)
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

LinkModel measure_link(Transport& transport, const LinkCalibration& calibration) {
  GZ_REQUIRE(calibration.small_rounds >= 1 && calibration.large_rounds >= 1 &&
                 calibration.large_bytes >= 1,
             ErrorCode::invalid_argument, "measure_link: ", calibration.small_rounds,
             " small and ", calibration.large_rounds, " large rounds of ", calibration.large_bytes,
             " bytes (each must be at least 1)");
  GZ_REQUIRE(transport.device_only() < 0, ErrorCode::invalid_argument,
             "measure_link: ", transport.describe(), " moves device memory only");
  if (transport.size() == 1) return LinkModel{0.0, std::numeric_limits<double>::infinity()};
  const double latency = median_round_seconds(transport, 8, calibration.small_rounds);
  const double large = median_round_seconds(transport, calibration.large_bytes, calibration.large_rounds);
  // A large round faster than a small one (noise) would give a negative time: take at least
  // a tenth of the large round for the transfer.
  const double transfer = std::max(large - latency, 0.1 * large);
  const double bandwidth = static_cast<double>(calibration.large_bytes) / transfer;

  const std::uint64_t mine[2] = {std::bit_cast<std::uint64_t>(latency),
                                 std::bit_cast<std::uint64_t>(bandwidth)};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(transport.size()));
  transport.allgather_u64(mine, all);
  LinkModel agreed{0.0, std::numeric_limits<double>::infinity()};
  for (std::size_t r = 0; r < all.size(); r += 2) {
    agreed.latency_s = std::max(agreed.latency_s, std::bit_cast<double>(all[r]));
    agreed.bytes_per_s = std::min(agreed.bytes_per_s, std::bit_cast<double>(all[r + 1]));
  }
  return agreed;
}

}  // namespace gradzip::collectives
