// The Open MPI transport over host memory. gradzip always works on its own duplicate of the
// application's communicator (MPI_Comm_dup), so its messages never match the application's.
//
// Threading: MPI is initialised with MPI_THREAD_MULTIPLE requested when gradzip initialises it;
// a transport object itself must be used by one thread at a time, and different transport
// objects from different threads at once only under MPI_THREAD_MULTIPLE.
#pragma once

#include <mpi.h>

#include <memory>
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

  std::size_t slot_for_new_request();
  void check(int status, const char* op) const;
  // Completes `request` (MPI_Wait, or MPI_Test polls with sleeps under idle waits).
  int complete(MPI_Request& request, MPI_Status& status) const;
  // Completes a non-blocking collective started by `start` (which posts it into the request it
  // is given), or runs `blocking` when idle waits are off.
  template <typename Start, typename Blocking>
  void run_collective(const char* op, Start&& start, Blocking&& blocking);

  MPI_Comm comm_ = MPI_COMM_NULL;
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
