// Measuring what the cost model (collectives/cost_model.h) assumes, with the ranks themselves:
// the link (α, the ring rate, the pairwise-exchange rate) and the codecs' γ, each agreed by
// every rank bit for bit, so that algo=auto (collectives/algorithm_choice.h) makes the same
// choice on every rank.
#pragma once

#include <cstddef>

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

// A collective over every rank of `transport`. Ring rounds: every rank sends one message to
// rank + 1 and receives one from rank − 1 (all links busy at once, as in the ring all-reduce).
// Exchange rounds: ranks 2i and 2i + 1 send to each other at once (halving/doubling's steps;
// with an odd rank count the last rank sits them out). α is the median time of a small ring
// round; bytes_per_s is large_bytes over the median large ring round less α, and
// exchange_bytes_per_s the same for exchange rounds (at 2 ranks the two patterns are the same
// and are measured once). Every rank then takes the largest α and the smallest rates of all
// ranks (one all-gather), so that every rank returns the same LinkModel, bit for bit. One rank
// has no link: latency 0, infinite rates. Rounds and sizes must be >= 1 (invalid_argument);
// host memory only. Costs 2 x (small_rounds + 1) small rounds and 2 x (large_rounds + 1) large
// ones: about 0.2 s at 1 Gbit/s with the defaults.
LinkModel measure_link(Transport& transport, const LinkCalibration& calibration = {});

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
