// gradzip's "torch" transport: a collectives::Transport that moves its bytes over
// torch.distributed (gloo), for processes started by torchrun or any launcher that is not MPI's.
//
// The bytes travel through a Python object, gradzip._process_group.ProcessGroupEngine (see its
// docstring for the wire protocol: a length message, then the bytes). Every method here takes
// the GIL, calls the engine, and turns its exceptions into gradzip errors:
//   - _process_group.WaitTimeout  -> the timeout report, then the policy's action (abort the
//     process, or throw ErrorCode::timeout);
//   - _process_group.MessageTooLong -> ErrorCode::malformed_message;
//   - anything else (gloo's own errors: a peer gone, its timeout) -> ErrorCode::unsupported
//     naming the operation, this rank and the Python error.
// Collective calls of the Communicator release the GIL before they run, so the engine's calls
// can take it from whichever thread runs the collective (the DDP hook's communication thread,
// a Reducer lane).
//
// Why an engine in Python: it uses the application's torch.distributed, whatever torch version
// and build the user has, without linking libtorch (whose C++ ABI changes with every release).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "collectives/transport/transport.h"

namespace gradzip::python {

class ProcessGroupTransport final : public collectives::Transport {
 public:
  // `engine`: a gradzip._process_group.ProcessGroupEngine. Holds a reference to it.
  explicit ProcessGroupTransport(pybind11::object engine);
  ~ProcessGroupTransport() override;
  ProcessGroupTransport(const ProcessGroupTransport&) = delete;
  ProcessGroupTransport& operator=(const ProcessGroupTransport&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string describe() const override;

  Request isend(int peer, int tag, std::span<const std::byte> data) override;
  // Each message is two gloo operations started from Python: the pipelined SRA's 64 KiB
  // segments cost more than they hide.
  bool messages_are_expensive() const noexcept override { return true; }
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

  void set_deadline_policy(const collectives::DeadlinePolicy& policy) override { policy_ = policy; }
  collectives::DeadlinePolicy deadline_policy() const override { return policy_; }
  // Ends this process with exit code 124 (what the MPI transport's MPI_Abort gives the job);
  // torchrun then ends the other ranks.
  [[noreturn]] void abort_job() noexcept override;

 private:
  // Runs `call` under the GIL; translates the engine's exceptions (see the file comment).
  template <typename Call>
  auto run(const char* op, Call&& call);
  [[noreturn]] void time_out(const char* op, const std::string& pending);
  void require_peer(const char* op, int peer) const;

  pybind11::object engine_;
  int rank_ = 0;
  int size_ = 1;
  collectives::DeadlinePolicy policy_;
  bool dead_ = false;  // a wait timed out under throw_error: every later call refuses
};

}  // namespace gradzip::python
