// The NCCL transport: the Transport interface over an ncclComm_t, moving DEVICE memory.
// Callers without NCCL headers use collectives/transport/nccl_transport_factory.h.
//
// Semantics (where they differ from, or sharpen, collectives/transport/transport.h):
// - Memory: every span given to isend, irecv, allgatherv, alltoallv and allreduce_f32_sum is
//   device (or managed) memory of the transport's CUDA device; anything else (pageable or
//   pinned host memory, another device's memory) throws ErrorCode::invalid_argument naming the
//   operation and the kind of pointer. Empty spans are not checked. allgather_u64 alone takes
//   host spans (metadata) and stages them through the transport's device scratch.
// - Device and stream: every call runs on the transport's device (it switches the calling
//   thread's current device for the call and restores it before returning) and on one
//   non-blocking CUDA stream of the transport's own. The collectives return when their results
//   are in the caller's memory (they synchronise with the caller's work only through that
//   return: a caller that produced the input on another stream must synchronise it first).
// - Point-to-point: isend / irecv only record the operation. The next wait() or collective
//   launches every recorded, not yet launched operation in one ncclGroupStart/ncclGroupEnd on
//   the stream (so "post receive, post send, wait" cannot deadlock), and records one CUDA event
//   for that batch; wait(request) waits for its batch's event and returns the byte count.
//   Tags: NCCL has none. They are ignored: messages between two ranks match in posting order,
//   so the ranks must post them in the same order (the tags must match in posting order).
//   Sizes: NCCL needs both sides to name the same size, so a receive takes EXACTLY
//   buffer.size() bytes and the matching send must send exactly that many (the contract's
//   "at most" becomes "exactly"; a mismatch is not detectable locally and corrupts or hangs).
//   Zero-byte messages complete at once without calling NCCL (both sides skip them, which is
//   consistent because the sizes are equal). Messages are not limited to kMaxMessageBytes.
//   Buffers must stay valid and unchanged until wait returns for them.
// - Waiting: waits poll the CUDA event; between polls they read ncclCommGetAsyncError. On an
//   NCCL or CUDA failure the transport aborts a communicator it owns (ncclCommAbort; an adopted
//   one is left to the application, which should abort it), throws ErrorCode::unsupported
//   naming the operation, the rank and NCCL's or CUDA's error text, and every later call on
//   the transport throws. set_idle_waits(true): sleeps of 2 us growing to 100 us between polls;
//   false (the default): std::this_thread::yield between polls.
// - Deadlines: every wait (the polls above) ends within the deadline policy (set by the
//   Communicator; inherited by splits; default GRADZIP_TIMEOUT_S, else 600 s, abort). On expiry
//   it writes a "gradzip: timeout" report to stderr (the operation, the Communicator call, the
//   point-to-point requests still pending; NCCL has no side channel, so it cannot tell which
//   peer is missing), aborts an owned communicator (ncclCommAbort; an adopted one is left to
//   the application), and then ends this process (std::abort; abort mode) or throws
//   ErrorCode::timeout (throw mode), after which every call on the transport throws.
// - Device memory: the scratch buffer below comes from kernels/cuda/device_runtime.h (stream-
//   ordered, cached; kInitialScratchBytes reserved at construction, grown by doubling), so no
//   call synchronises the device (no cudaMalloc / cudaFree).
// - allgatherv: padded to the largest block (nccl_layout.h) through a device scratch buffer the
//   transport owns and grows; all.size() must be at least sum(counts) (bytes past it are left
//   alone). alltoallv: one group of ncclSend/ncclRecv per peer with a non-zero count (self
//   included). allreduce_f32_sum: in-place ncclAllReduce (NCCL chooses the summation order;
//   it is the same on every rank). barrier: an ncclAllReduce of one int.
// - split(color, key): ncclCommSplit (color must be >= 0). split_by_node: ranks whose
//   gethostname() hashes (FNV-1a 64) agree, ordered by old rank. Splits own their
//   communicators and run on the same device.
// - Stream order (Transport::begin_stream_order): the operations of a stream-ordered call go
//   on the transport's stream after a cudaStreamWaitEvent on an event recorded on the caller's
//   work stream, and the work stream waits (cudaStreamWaitEvent) on the event that ends them:
//   for point-to-point requests, at wait(request) (the batch's event; the host does not wait,
//   and NCCL's asynchronous error is read without blocking); for the collectives, before they
//   return. Nothing in between waits on the host, so the encode, transfer and decode of a call
//   are queued back to back and the call's one wait is wait_for_stream (counted at site
//   "stream-ordered call: completion"). The scratch buffer is used on the transport's stream
//   only after such a wait for the work stream, so blocks that the work stream released to the
//   thread's cache are safe to reuse there.
// - Threads: one thread per transport object at a time; different objects (splits, other
//   communicators) may be used from different threads at once.
#pragma once

#include "kernels/device_api.h"
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "collectives/transport/transport.h"
#include "kernels/cuda/runtime_support.h"

namespace gradzip::collectives {

// The no-throw scoped device switch the transport uses (kernels/cuda/runtime_support.h).
using kernels::cuda::CurrentCudaDevice;

class NcclTransport final : public Transport {
 public:
  // Wraps `comm` (its rank, size and device are read from it). With owns_comm the transport
  // destroys the communicator (or aborts it after an error); otherwise the caller keeps it and
  // it must outlive the transport. Throws ErrorCode::unsupported when NCCL or CUDA refuse
  // (an owned comm is then aborted).
  NcclTransport(ncclComm_t comm, bool owns_comm);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  // "nccl rank R of N on cuda:D"
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
  bool concurrent_use_supported() const override { return true; }
  // Posted operations start at the next wait, as one group, and a wait covers its whole group.
  bool waits_complete_whole_batches() const noexcept override { return true; }
  bool moves_device_memory() const noexcept override { return true; }
  int device_only() const noexcept override { return device_; }
  // Launches the recorded operations as one group now (what the next wait would do).
  void start_posted() override;
  // One 1-byte send and receive with every peer (one group), one all-gather and one all-reduce,
  // so that NCCL's point-to-point and collective connections exist before concurrent use; the
  // scratch buffer is reserved by the constructor.
  void connect_eagerly() override;
  bool orders_with_streams() const noexcept override { return true; }
  void begin_stream_order(void* work_stream) override;
  void end_stream_order() noexcept override;
  void wait_for_stream(std::string_view op) override;

  int device() const noexcept { return device_; }
  ncclComm_t comm() const noexcept { return comm_; }

 private:
  // Point-to-point requests: `batch` is kNotLaunched until the next flush, kImmediate for
  // zero-byte messages, else the id of the group they were launched in.
  static constexpr std::size_t kNotLaunched = SIZE_MAX;
  static constexpr std::size_t kImmediate = SIZE_MAX - 1;
  struct Pending {
    int peer = -1;
    int tag = 0;
    const void* data = nullptr;
    std::size_t bytes = 0;
    bool receive = false;
    bool active = false;
    std::size_t batch = kNotLaunched;
  };
  struct Batch {
    cudaEvent_t event = nullptr;
    std::size_t outstanding = 0;  // requests of the batch not yet waited for
  };

  Request post(std::string_view op, int peer, int tag, const void* data, std::size_t bytes,
               bool receive);
  // Launches every recorded point-to-point operation in one NCCL group.
  void flush(std::string_view op);
  // Closes a group whose first failed call (if any) was `first_call` with `first_error`.
  void end_group(std::string_view op, ncclResult_t first_error, const char* first_call);
  // Polls `event` until it completes, watching for NCCL errors; counts one wait at `site`.
  void wait_for(cudaEvent_t event, std::string_view op,
                std::string_view site = "nccl transport");
  // Stream order: the transport's stream waits for the work queued on the work stream so far
  // (follow_work_stream), and the work stream for the transport's (join_work_stream).
  void follow_work_stream(std::string_view op);
  void join_work_stream(std::string_view op);
  // The end of a collective: joined to the work stream in stream order, else waited for.
  void complete_collective(std::string_view op);
  // Throws (as check_nccl) when NCCL reports an asynchronous error; never blocks.
  void check_async_error(std::string_view op);
  // Records an event after everything on the stream and waits for it.
  void synchronize(std::string_view op);
  // Scratch of at least `bytes`; grows to max(bytes, 2 x the current size).
  void ensure_scratch(std::size_t bytes, std::string_view op);
  static constexpr std::size_t kInitialScratchBytes = 64 * 1024;
  cudaEvent_t take_event(std::string_view op);

  void require_usable(std::string_view op) const;
  void require_device_memory(const void* pointer, std::size_t bytes, std::string_view op,
                             const char* what) const;
  // Throw ErrorCode::unsupported (after aborting an owned communicator) unless successful.
  void check_cuda(cudaError_t status, std::string_view op, const char* call);
  void check_nccl(ncclResult_t status, std::string_view op, const char* call);
  [[noreturn]] void fail(std::string_view op, const std::string& what);
  // The timeout report, the abort of an owned communicator, then std::abort or the exception.
  [[noreturn]] void time_out(std::string_view op, double waited_seconds);
  void release_cuda_resources() noexcept;

  ncclComm_t comm_ = nullptr;
  bool owns_comm_ = false;
  bool comm_aborted_ = false;
  bool broken_ = false;  // after an NCCL or CUDA failure
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t sync_event_ = nullptr;
  // Stream order: on while a stream-ordered call runs; order_event_ carries each dependency.
  bool stream_ordered_ = false;
  cudaStream_t work_stream_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  bool idle_waits_ = false;
  DeadlinePolicy policy_;
  std::string failure_;  // why the transport is broken (a timeout's first line), if it says

  std::vector<Pending> pending_;
  std::vector<std::size_t> unlaunched_;  // indices into pending_, in posting order
  std::unordered_map<std::size_t, Batch> batches_;
  std::size_t next_batch_ = 0;
  std::vector<cudaEvent_t> spare_events_;
};

}  // namespace gradzip::collectives
