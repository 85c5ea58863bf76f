// The transport: how ranks move raw bytes. Algorithms in collectives/ talk only to this
// interface, so the same ring / SRA / sparse all-reduce code runs over Open MPI (host memory),
// later NCCL, and test transports that corrupt or drop messages.
//
// Contract for every implementation:
// - Ranks are 0 .. size()-1. Calls that every rank must make (allgatherv, alltoallv,
//   allgather_u64, allreduce_f32_sum, barrier, split) must be made by all ranks in the same
//   order with consistent sizes, like MPI collectives.
// - Point-to-point: post with isend / irecv, complete with wait. A receive matches the send of
//   the same (peer, tag) pair in posting order. A message is at most kMaxMessageBytes.
// - Failures throw gradzip::Error naming the operation, this rank, the peer and the sizes.
// - Deadlines (collectives/transport/deadline.h): every wait that can block (wait and the
//   collectives) ends within the policy's seconds (plus the report's grace window); on expiry
//   the transport reports and aborts the job or throws ErrorCode::timeout, per the policy.
//   split / split_by_node (setup) may block without a deadline; their results inherit the
//   policy.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "collectives/transport/deadline.h"

namespace gradzip::collectives {

// One message (and one rank's block in a collective) may not exceed this: MPI counts are int.
inline constexpr std::size_t kMaxMessageBytes = INT_MAX;

class Transport {
 public:
  struct Request {
    std::size_t id = SIZE_MAX;  // opaque to callers
  };

  virtual ~Transport() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // e.g. "mpi rank 2 of 4": used in error messages.
  virtual std::string describe() const = 0;

  // Starts sending `data` (which must stay valid and unchanged until wait) to `peer`.
  virtual Request isend(int peer, int tag, std::span<const std::byte> data) = 0;
  // Starts receiving one message from `peer` into `buffer` (at most buffer.size() bytes).
  virtual Request irecv(int peer, int tag, std::span<std::byte> buffer) = 0;
  // Completes a request; returns the bytes sent or received. A message longer than the
  // receive buffer is an error (ErrorCode::malformed_message).
  virtual std::size_t wait(Request request) = 0;

  // all = the blocks of every rank in rank order; block r has counts[r] bytes; `mine` has
  // counts[rank()] bytes.
  virtual void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                          std::span<const std::size_t> counts) = 0;
  // `send` holds one block per destination rank in rank order (send_counts[d] bytes each);
  // `recv` receives one block per source rank in rank order (recv_counts[s] bytes each).
  virtual void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                         std::span<std::byte> recv, std::span<const std::size_t> recv_counts) = 0;
  // Small fixed-size metadata (sizes, fingerprints): all[r * mine.size() + i] = rank r's mine[i].
  virtual void allgather_u64(std::span<const std::uint64_t> mine,
                             std::span<std::uint64_t> all) = 0;
  // In-place f32 sum with the library's own all-reduce (MPI_Allreduce): the uncompressed
  // baseline and the small-tensor path.
  virtual void allreduce_f32_sum(std::span<float> data) = 0;
  virtual void barrier() = 0;

  // New transports over subsets of the ranks (MPI_Comm_split semantics: ranks with the same
  // color form a group, ordered by key then by old rank).
  virtual std::unique_ptr<Transport> split(int color, int key) = 0;
  // The ranks that share this rank's node (shared memory), ordered by old rank.
  virtual std::unique_ptr<Transport> split_by_node() = 0;

  // Waiting policy. false (the default): waits may spin (lowest latency). true: waits poll
  // with short sleeps between polls, so a thread waiting for the wire leaves the CPU to other
  // threads (the Reducer's lanes, which wait while backward computes). Either way the results
  // are the same bits (MPI: the collectives always run as their non-blocking forms, polled
  // against the deadline, whatever the policy).
  virtual void set_idle_waits(bool idle_waits) { (void)idle_waits; }
  // The deadline of this transport's waits and what a timeout does (what CommunicatorState
  // applies from CommunicatorOptions). Transports that never block ignore it.
  virtual void set_deadline_policy(const DeadlinePolicy& policy) { (void)policy; }
  virtual DeadlinePolicy deadline_policy() const { return {}; }
  // Ends the whole job at once after a timeout that the caller (Reducer::wait) detected itself
  // under TimeoutAction::abort: MPI_Abort over MPI; std::abort elsewhere (the launcher ends the
  // other processes).
  [[noreturn]] virtual void abort_job() noexcept;
  // Whether different Transport objects (duplicates, splits) may be used from different
  // threads at the same time. MPI: only under MPI_THREAD_MULTIPLE.
  virtual bool concurrent_use_supported() const { return true; }
  // True when posted isend / irecv operations start only at the next wait(), all together, and
  // a wait returns only once that whole batch has completed (NCCL). An algorithm must then not
  // have a receive outstanding whose matching send the peer posts only after one of its own
  // later waits (the batch would never complete): it posts each ring step's receive at that
  // step instead of all of them up front. MPI: false.
  virtual bool waits_complete_whole_batches() const noexcept { return false; }
  // True when every message costs far more than its bytes, so that cutting a message into many
  // small ones is slower however much they overlap (torch.distributed driven through Python:
  // the pipelined SRA ran qsgd-4 at 64 MiB 2x slower than one message per chunk there,
  // docs/results.md). The ring and SRA then send one message per chunk (transport_pipelines in
// collectives/collective_job.h, which algo=auto's model follows too). MPI, NCCL: false.
  virtual bool messages_are_expensive() const noexcept { return false; }
  // True when the spans given to isend, irecv, allgatherv, alltoallv and allreduce_f32_sum may
  // be CUDA device memory (NCCL; MPI when the library is CUDA-aware). allgather_u64 always
  // takes host memory.
  virtual bool moves_device_memory() const noexcept { return false; }
  // The CUDA device whose memory this transport moves exclusively (NCCL), or -1 when it moves
  // host memory (MPI, CUDA-aware or not).
  virtual int device_only() const noexcept { return -1; }
  // Starts the operations posted so far without waiting for them, so that work done before the
  // next wait overlaps their transfer (NCCL: launches them as one group). A no-op where
  // posting starts them (MPI).
  virtual void start_posted() {}
  // Sets up now, collectively, every connection and buffer the transport would otherwise
  // create on first use (NCCL connects peers lazily, inside the first operation that needs them,
  // allocating device memory as it goes). Every rank calls it together, on the communicators
  // it has, in the same order. Callers that run several transports of one device from several
  // threads (the Reducer's lanes) call it for each before any thread starts: set-up inside one
  // lane's operation while another lane's kernel waits for a peer can deadlock the device.
  // A no-op where nothing is lazy (MPI).
  virtual void connect_eagerly() {}

  // Stream order, for transports that move device memory on a stream of their own (NCCL).
  // Between begin_stream_order(work_stream) and end_stream_order(), the transport orders every
  // operation after the work queued so far on `work_stream` (a cudaStream_t; nullptr: the
  // legacy default stream) and that stream's later work after the operation, instead of
  // waiting on the host: wait(request) returns the request's posted byte count at once, and
  // allgatherv, alltoallv, allreduce_f32_sum and barrier return with their work queued
  // (allgather_u64, whose spans are host memory, still completes before it returns). Buffers
  // must then stay valid until the work stream has passed the operation. wait_for_stream is the
  // one host wait: it returns when everything queued on the work stream so far has completed,
  // within the deadline policy and watching for the transport's errors like any wait. Where
  // orders_with_streams() is false, begin_stream_order and wait_for_stream throw unsupported.
  virtual bool orders_with_streams() const noexcept { return false; }
  virtual void begin_stream_order(void* work_stream);
  virtual void end_stream_order() noexcept {}
  virtual void wait_for_stream(std::string_view op);
};

}  // namespace gradzip::collectives
