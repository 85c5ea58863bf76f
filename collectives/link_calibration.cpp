#include "collectives/link_calibration.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/message_tags.h"
#include "gradzip/error.h"
#include "kernels/tunables.h"

namespace gradzip::collectives {
namespace {

constexpr int kCalibrationTag = tag_of(MessageTag::link_calibration);

// Median seconds of `rounds` runs of `body` (after one unmeasured run that sets up the
// connections).
template <class Body>
double median_seconds(std::size_t rounds, Body&& body) {
  std::vector<double> seconds;
  for (std::size_t round = 0; round <= rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    body(round);
    if (round > 0)
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

// Median seconds of `rounds` rounds of `bytes`, each sending to `to` and receiving from `from`.
double median_round_seconds(Transport& transport, int to, int from, std::size_t bytes,
                            std::size_t rounds) {
  std::vector<std::byte> out(bytes, std::byte{0x5A}), in(bytes);
  return median_seconds(rounds, [&](std::size_t) {
    PendingRequests pending(transport);
    const std::size_t receive = pending.add(transport.irecv(from, kCalibrationTag, in));
    const std::size_t send = pending.add(transport.isend(to, kCalibrationTag, out));
    const std::size_t received = pending.wait(receive);
    pending.wait(send);
    GZ_REQUIRE(received == bytes, ErrorCode::internal, "measure_link: received ", received,
               " bytes from rank ", from, ", expected ", bytes);
  });
}

// The rate of `bytes` moved in `seconds` of which `latency` is start-up. A large round faster
// than a small one (noise) would give a negative time: at least a tenth of the round counts as
// transfer.
double rate_of(std::size_t bytes, double seconds, double latency) {
  return static_cast<double>(bytes) / std::max(seconds - latency, 0.1 * seconds);
}

// Every rank's `values` (the same count on each), gathered: all[r * values.size() + i].
std::vector<double> gather_doubles(Transport& transport, const std::vector<double>& values) {
  std::vector<std::uint64_t> mine(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) mine[i] = std::bit_cast<std::uint64_t>(values[i]);
  std::vector<std::uint64_t> all(values.size() * static_cast<std::size_t>(transport.size()));
  transport.allgather_u64(mine, all);
  std::vector<double> out(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) out[i] = std::bit_cast<double>(all[i]);
  return out;
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
  constexpr double kInfinite = std::numeric_limits<double>::infinity();
  if (transport.size() == 1) return LinkModel{0.0, kInfinite, 0.0, 0.0};
  const int ranks = transport.size(), rank = transport.rank();
  const int next = (rank + 1) % ranks, previous = (rank + ranks - 1) % ranks;
  const double latency = median_round_seconds(transport, next, previous, 8, calibration.small_rounds);
  const double ring_rate = rate_of(
      calibration.large_bytes,
      median_round_seconds(transport, next, previous, calibration.large_bytes, calibration.large_rounds),
      latency);
  // A small collective's start-up: all-gathers of one u64.
  std::vector<std::uint64_t> all(static_cast<std::size_t>(ranks));
  const double collective = median_seconds(calibration.small_rounds, [&](std::size_t round) {
    const std::uint64_t mine = round;
    transport.allgather_u64(std::span<const std::uint64_t>(&mine, 1), all);
  });

  return agreed_link(transport, LinkModel{latency, ring_rate, 0.0, collective});
}

std::optional<LinkModel> given_link(double latency_us, double gbps, double exchange_gbps,
                                    std::string_view source) {
  const auto require = [&](double value, std::string_view field) {
    GZ_REQUIRE(std::isfinite(value) && value >= 0, ErrorCode::invalid_argument, "Communicator: ",
               source, field, " = ", value, " (expected a finite number >= 0)");
  };
  require(latency_us, "latency_us");
  require(gbps, "gbps");
  require(exchange_gbps, "exchange_gbps");
  if (gbps == 0) {
    GZ_REQUIRE(latency_us == 0 && exchange_gbps == 0, ErrorCode::invalid_argument, "Communicator: ",
               source, "latency_us = ", latency_us, " and ", source, "exchange_gbps = ",
               exchange_gbps, " without ", source, "gbps (give gbps > 0 with them, or leave all "
               "three 0 to measure the link)");
    return std::nullopt;
  }
  return LinkModel{latency_us * 1e-6, gbps * 1e9 / 8, exchange_gbps * 1e9 / 8, 0.0};
}

LinkModel parse_link_variable(std::string_view text) {
  std::vector<double> fields;
  bool parsed = true;
  for (std::string_view rest = text; parsed && fields.size() < 4;) {
    const std::size_t comma = rest.find(',');
    const std::optional<double> value = kernels::parse_finite_number(rest.substr(0, comma));
    parsed = value.has_value();
    fields.push_back(value.value_or(0));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  GZ_REQUIRE(parsed && (fields.size() == 2 || fields.size() == 3) && fields[1] > 0,
             ErrorCode::invalid_argument, "Communicator: GRADZIP_LINK='", text,
             "' (expected LATENCY_US,GBPS or LATENCY_US,GBPS,EXCHANGE_GBPS with GBPS > 0, e.g. 20,10)");
  return *given_link(fields[0], fields[1], fields.size() == 3 ? fields[2] : 0, "GRADZIP_LINK's ");
}

LinkModel agreed_link(Transport& transport, const LinkModel& mine) {
  const std::vector<double> all = gather_doubles(
      transport, {mine.latency_s, mine.bytes_per_s, mine.exchange_bytes_per_s, mine.collective_latency_s});
  LinkModel agreed = mine;
  for (std::size_t r = 0; r < all.size(); r += 4) {
    agreed.latency_s = std::max(agreed.latency_s, all[r]);
    agreed.bytes_per_s = std::min(agreed.bytes_per_s, all[r + 1]);
    agreed.exchange_bytes_per_s = std::min(agreed.exchange_bytes_per_s, all[r + 2]);
    agreed.collective_latency_s = std::max(agreed.collective_latency_s, all[r + 3]);
  }
  return agreed;
}

CodecCost local_codec_cost(const Codec& codec, std::size_t sample) {
  static std::mutex mutex;
  static std::map<std::string, CodecCost, std::less<>> measured;
  const std::string key = codec.spec().to_string() + "@" + std::to_string(sample);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = measured.find(key); found != measured.end()) return found->second;
  return measured.emplace(key, measure_codec_cost(codec, sample)).first->second;
}

CodecCost agreed_codec_cost(Transport& transport, const Codec& codec, std::size_t sample) {
  const CodecCost mine = local_codec_cost(codec, sample);
  if (transport.size() == 1) return mine;
  const std::vector<double> all =
      gather_doubles(transport, {mine.encode_s, mine.decode_add_s, mine.add_s});
  CodecCost agreed;
  for (std::size_t r = 0; r < all.size(); r += 3) {
    agreed.encode_s = std::max(agreed.encode_s, all[r]);
    agreed.decode_add_s = std::max(agreed.decode_add_s, all[r + 1]);
    agreed.add_s = std::max(agreed.add_s, all[r + 2]);
  }
  return agreed;
}

}  // namespace gradzip::collectives
