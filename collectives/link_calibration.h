// Measuring the link the cost model (collectives/cost_model.h) assumes, with the ranks
// themselves: the input `algo=auto` will need to choose by the model (issue 9, item 3; not
// wired into the choice yet).
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

// A collective over every rank of `transport`. Each round, every rank sends one message to
// rank + 1 and receives one from rank − 1 (a ring, all links busy at once, as in the ring
// all-reduce). α is the median time of a small round; the bandwidth is large_bytes over the
// median large round less α. Every rank then takes the largest α and the smallest bandwidth
// of all ranks (one all-gather), so that every rank returns the same LinkModel, bit for bit:
// what a choice made from it on every rank needs. One rank has no link: latency 0, infinite
// bandwidth. Rounds and sizes must be >= 1 (invalid_argument); host memory only.
LinkModel measure_link(Transport& transport, const LinkCalibration& calibration = {});

}  // namespace gradzip::collectives
