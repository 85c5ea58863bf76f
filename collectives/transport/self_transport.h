// A transport of one rank inside one process: what a Communicator over a single process uses
// without MPI (the GPU machine has no MPI; tests of one-rank behaviour). Messages to self are
// copied when sent and delivered in posting order per tag; collectives are copies.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "collectives/transport/transport.h"

namespace gradzip::collectives {

class SelfTransport final : public Transport {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string describe() const override { return "self (one rank, no MPI)"; }

  // peer must be 0. A send completes at once (its bytes are copied); a receive completes in
  // wait() with the oldest unreceived message of its tag, and throws internal when there is
  // none (one rank can never be sent one later while it waits).
  Request isend(int peer, int tag, std::span<const std::byte> data) override;
  Request irecv(int peer, int tag, std::span<std::byte> buffer) override;
  std::size_t wait(Request request) override;

  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override;
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override;
  void allgather_u64(std::span<const std::uint64_t> mine, std::span<std::uint64_t> all) override;
  void allreduce_f32_sum(std::span<float> data) override;
  void barrier() override {}

  std::unique_ptr<Transport> split(int color, int key) override;
  std::unique_ptr<Transport> split_by_node() override;

 private:
  struct Pending {
    bool receive = false;
    int tag = 0;
    std::span<std::byte> buffer;  // receives
    std::size_t bytes = 0;        // sends
    bool active = false;
  };
  void require_self(int peer, const char* op) const;
  std::map<int, std::deque<std::vector<std::byte>>> queued_;  // sent, not yet received, by tag
  std::vector<Pending> pending_;
};

}  // namespace gradzip::collectives
