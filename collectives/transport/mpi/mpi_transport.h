// The Open MPI transport over host memory. gradzip always works on its own duplicate of the
// application's communicator (MPI_Comm_dup), so its messages never match the application's.
//
// Deadlines: every wait (point-to-point and the collectives, which always run as their
// non-blocking forms) polls MPI_Test against the deadline policy (collectives/transport/
// deadline.h; the default comes from GRADZIP_TIMEOUT_S, else 600 s, abort). On expiry the rank
// sends a small notice {call sequence number} to every other rank over a second duplicate of
// the communicator (the diagnostic communicator, never used otherwise), collects the notices of
// the others for the grace window, and reports: ranks whose notice came timed out too, the
// others never reached the operation or are dead. Then MPI_Abort(MPI_COMM_WORLD, 124), or it
// throws ErrorCode::timeout and the transport is dead (later calls throw without calling MPI;
// the destructor leaks its communicators and requests rather than risk waiting on them).
//
// Threading: MPI is initialised with MPI_THREAD_MULTIPLE requested when gradzip initialises it;
// a transport object itself must be used by one thread at a time, and different transport
// objects from different threads at once only under MPI_THREAD_MULTIPLE.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/transport/transport.h"

namespace gradzip::collectives {

class MpiTransport final : public Transport {
 public:
  // Duplicates `comm`. MPI must be initialised (ensure_mpi_initialized()).
  explicit MpiTransport(MPI_Comm comm);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string describe() const override;

  Request isend(int peer, int tag, std::span<const std::byte> data) override;
  Request irecv(int peer, int tag, std::span<std::byte> buffer) override;
  std::size_t wait(Request request) override;

  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override;
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override;
  void allgather_u64(std::span<const std::uint64_t> mine, std::span<std::uint64_t> all) override;
  void allreduce_f32_sum(std::span<float> data) override;
  void barrier() override;

  std::unique_ptr<Transport> split(int color, int key) override;
  std::unique_ptr<Transport> split_by_node() override;

  void set_idle_waits(bool idle_waits) override { idle_waits_ = idle_waits; }
  void set_deadline_policy(const DeadlinePolicy& policy) override { policy_ = policy; }
  DeadlinePolicy deadline_policy() const override { return policy_; }
  // MPI_Abort(MPI_COMM_WORLD, 124).
  [[noreturn]] void abort_job() noexcept override;
  bool concurrent_use_supported() const override;
  // Open MPI built CUDA-aware (MPIX_CUDA_AWARE_SUPPORT) and reporting it at run time
  // (MPIX_Query_cuda_support); false for other MPI libraries.
  bool moves_device_memory() const noexcept override { return cuda_aware_; }

  MPI_Comm comm() const noexcept { return comm_; }

 private:
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    int peer = -1;
    int tag = 0;
    std::size_t bytes = 0;  // posted size
    bool receive = false;
    bool active = false;
  };
  // Adopts an already-duplicated communicator (split results).
  struct Adopt {};
  MpiTransport(MPI_Comm comm, Adopt);

  // What a wait is for, as a timeout report names it: a point-to-point request (pending_[slot])
  // or a collective `op` with this rank's `bytes`.
  struct WaitSubject {
    const char* op = "";
    std::size_t slot = SIZE_MAX;
    std::size_t bytes = 0;
  };

  std::size_t slot_for_new_request();
  void check(int status, const char* op) const;
  // Throws ErrorCode::timeout when this transport timed out earlier (no MPI call after that).
  void require_alive(const char* op) const;
  // Completes `request` by polling MPI_Test (with sleeps under idle waits) until the deadline;
  // past it, time_out(subject).
  int complete(MPI_Request& request, MPI_Status& status, const WaitSubject& subject);
  // Completes a non-blocking collective started by `start` (which posts it into the request it
  // is given) within the deadline.
  template <typename Start>
  void run_collective(const char* op, std::size_t bytes, Start&& start);
  // The timeout report (see above), then MPI_Abort or the exception.
  [[noreturn]] void time_out(const WaitSubject& subject, double waited_seconds);
  std::string describe_subject(const WaitSubject& subject) const;
  // "rank R" or "rank R (world rank W)" when this communicator is not MPI_COMM_WORLD's order.
  std::string describe_rank(int rank) const;
  // MPI_COMM_WORLD ranks of this communicator's ranks (filled at the first timeout).
  void translate_to_world_ranks();
  void make_diagnostic_comm();

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm diagnostic_comm_ = MPI_COMM_NULL;  // timeout notices only
  DeadlinePolicy policy_;
  std::string failure_;  // the report of this transport's timeout; empty while it works
  std::vector<int> world_ranks_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<Pending> pending_;
  bool idle_waits_ = false;
  bool cuda_aware_ = false;
};

// Calls MPI_Init_thread (MPI_THREAD_MULTIPLE requested) unless MPI is already initialised,
// and registers MPI_Finalize at exit in that case only. Safe to call repeatedly.
void ensure_mpi_initialized();

}  // namespace gradzip::collectives
