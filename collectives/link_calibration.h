// Measuring what the cost model (collectives/cost_model.h) assumes, with the ranks themselves:
// the link (α, the ring rate, the pairwise-exchange rate) and the codecs' γ, each agreed by
// every rank bit for bit, so that algo=auto (collectives/algorithm_choice.h) makes the same
// choice on every rank.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "collectives/cost_model.h"
#include "collectives/transport/transport.h"

namespace gradzip::collectives {

struct LinkCalibration {
  std::size_t small_rounds = 16;               // exchanges of an 8-byte message
  std::size_t large_rounds = 4;                // exchanges of `large_bytes`
  // Large enough that a token bucket's burst (tc tbf, 512 KiB in benchmarks/emulated_cluster.sh)
  // is a small part of it: 256 KiB rounds measured 208 MB/s on a 1 Gbit/s link there.
  std::size_t large_bytes = std::size_t{4} << 20;
};

// A collective over every rank of `transport`. Each round, every rank sends one message to
// rank + 1 and receives one from rank − 1 (a ring, all links busy at once, as in the ring
// all-reduce). α is the median time of a small round; the bandwidth is large_bytes over the
// median large round less α. Every rank then takes the largest α and the smallest bandwidth
// of all ranks (one all-gather), so that every rank returns the same LinkModel, bit for bit.
// collective_latency_s is the median of small_rounds all-gathers of 8 bytes per rank (the
// largest over ranks). exchange_bytes_per_s is left 0 (the ring's rate): a pairwise exchange of 4 MiB messages
// measured well below the ring on the emulated cluster at 100 Mbit/s (4.6 against 11 MB/s)
// while halving/doubling's own exchanges ran at the ring's speed there, so one such figure
// would mislead the model more than help it (docs/cost-model.md). One rank has no link:
// latency 0, infinite bandwidth. Rounds and sizes must be >= 1 (invalid_argument); host memory
// only. About 0.2 s at 1 Gbit/s with the defaults.
LinkModel measure_link(Transport& transport, const LinkCalibration& calibration = {});

// The link CommunicatorOptions::link_* give (latency in µs, rates in Gbit/s; `source` names
// them in errors): nullopt when gbps is 0 (measure it; latency and exchange must be 0 too),
// else the LinkModel. Negative, non-finite or latency-without-rate values throw
// invalid_argument naming `source`'s field.
std::optional<LinkModel> given_link(double latency_us, double gbps, double exchange_gbps,
                                    std::string_view source = "CommunicatorOptions::link_");

// GRADZIP_LINK's text, "LATENCY_US,GBPS[,EXCHANGE_GBPS]" (GBPS > 0), as a LinkModel; anything
// else throws invalid_argument naming GRADZIP_LINK and the text.
LinkModel parse_link_variable(std::string_view text);

// `mine` as every rank of `transport` agrees on it: the largest latencies and the smallest
// rates over the ranks (one all-gather). For links measured on sub-transports (the nodes of
// the hierarchical all-reduce), each rank passing what its own group measured.
LinkModel agreed_link(Transport& transport, const LinkModel& mine);

// γ of `codec` on this process: measure_codec_cost(codec, sample) the first time a codec spec
// (canonical text) and sample are asked for, the same figures after that (thread-safe). Every
// communicator of the process thus sees the same γ, so two communicators over the same ranks
// with the same link make the same algo=auto choices.
CodecCost local_codec_cost(const Codec& codec, std::size_t sample);

// γ of `codec` as every rank agrees on it: local_codec_cost(codec, sample) on each rank, then
// the largest of each term over all ranks (one all-gather; the slowest rank sets the pace of a
// collective). A collective over every rank of `transport`; a few milliseconds the first time.
CodecCost agreed_codec_cost(Transport& transport, const Codec& codec,
                            std::size_t sample = std::size_t{1} << 16);

}  // namespace gradzip::collectives
