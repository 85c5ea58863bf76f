// What the two ring all-reduces (collectives/ring_allreduce.cpp and its pipelined form,
// collectives/ring_pipelined.cpp) share: a rank's place in the ring and the per-thread host
// message memory.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "collectives/transport/transport.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

// c mod ranks in [0, ranks), for negative c too: the ring position c steps from rank 0.
inline int ring_position(int c, int ranks) { return ((c % ranks) + ranks) % ranks; }

// A rank's place in the ring over `transport`: it sends to `right` (rank + 1) and receives
// from `left` (rank - 1), mod the rank count.
struct RingNeighbours {
  explicit RingNeighbours(const Transport& transport)
      : rank(transport.rank()),
        ranks(transport.size()),
        right(ring_position(rank + 1, ranks)),
        left(ring_position(rank - 1, ranks)) {}

  int rank;
  int ranks;
  int right;
  int left;
};

// The message memory of a ring call, kept per thread from call to call. Memory fresh from the
// allocator costs a page fault per 4 KiB on first touch, which for dense codecs (a `none` or
// fp16 encode is a copy) costs more than the copy itself; reusing it makes the encodes and
// receives of later calls run at memory speed (16M floats, `none`, 2 ranks: 3.5x faster).
// The price: each thread that runs rings keeps the largest workspace it has needed (about the
// encoded size of its largest tensor, plus two chunks) until it exits. One ring at a time per
// thread: no algorithm runs a ring inside a ring, and a second workspace on the same thread
// is refused as a bug (ErrorCode::internal) rather than shared.
class RingWorkspace {
 public:
  explicit RingWorkspace(std::size_t bytes) : cache_(thread_cache()) {
    GZ_REQUIRE(!cache_.busy, ErrorCode::internal,
               "ring workspace: a ring is already running on this thread");
    if (cache_.bytes < bytes) {
      cache_.memory.reset();  // free the old block before taking the larger one
      cache_.memory = std::make_unique_for_overwrite<std::byte[]>(bytes);
      cache_.bytes = bytes;
    }
    cache_.busy = true;
    memory_ = {cache_.memory.get(), bytes};
  }
  ~RingWorkspace() { cache_.busy = false; }
  RingWorkspace(const RingWorkspace&) = delete;
  RingWorkspace& operator=(const RingWorkspace&) = delete;

  // Uninitialised bytes: every byte read is first written by an encode or a receive.
  std::span<std::byte> memory() const noexcept { return memory_; }

 private:
  struct Cache {
    std::unique_ptr<std::byte[]> memory;
    std::size_t bytes = 0;
    bool busy = false;
  };
  static Cache& thread_cache() {
    thread_local Cache cache;
    return cache;
  }

  Cache& cache_;
  std::span<std::byte> memory_;
};

}  // namespace gradzip::collectives
