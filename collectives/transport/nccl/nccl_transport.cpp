#include "collectives/transport/nccl/nccl_transport.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>

#include "collectives/transport/nccl/nccl_layout.h"
#include "kernels/fnv1a.h"
#include "collectives/transport/nccl/nccl_library.h"
#include "gradzip/error.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/runtime_support.h"

namespace gradzip::collectives {
namespace {

std::string cuda_error_text(cudaError_t status) {
  return detail::concat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

std::size_t total(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// The first failing call of an NCCL group (the group must still be closed after it).
struct GroupErrors {
  ncclResult_t result = ncclSuccess;
  const char* call = "";
  void note(ncclResult_t status, const char* name) {
    if (status != ncclSuccess && result == ncclSuccess) {
      result = status;
      call = name;
    }
  }
};

}  // namespace

NcclTransport::NcclTransport(ncclComm_t comm, bool owns_comm)
    : comm_(comm), owns_comm_(owns_comm), policy_(resolve_deadline_policy({})) {
  GZ_REQUIRE(comm != nullptr, ErrorCode::invalid_argument,
             "NcclTransport: the NCCL communicator is null");
  try {
    check_nccl(nccl_api().ncclCommUserRank(comm_, &rank_), "NcclTransport", "ncclCommUserRank");
    check_nccl(nccl_api().ncclCommCount(comm_, &size_), "NcclTransport", "ncclCommCount");
    check_nccl(nccl_api().ncclCommCuDevice(comm_, &device_), "NcclTransport", "ncclCommCuDevice");
    const CurrentCudaDevice scope(device_);
    check_cuda(scope.status(), "NcclTransport", "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "NcclTransport",
               "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&sync_event_, cudaEventDisableTiming), "NcclTransport",
               "cudaEventCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming), "NcclTransport",
               "cudaEventCreateWithFlags");
    ensure_scratch(kInitialScratchBytes, "NcclTransport");
  } catch (...) {
    // The destructor does not run for a constructor that throws.
    release_cuda_resources();
    if (owns_comm_ && !comm_aborted_) nccl_api().ncclCommAbort(comm_);
    throw;
  }
}

NcclTransport::~NcclTransport() {
  const CurrentCudaDevice scope(device_);
  if (owns_comm_ && !comm_aborted_) {
    // Operations launched but never completed (a request nobody waited for, a peer that never
    // posted its side) would make ncclCommDestroy wait for them forever: abort instead.
    bool in_flight = false;
    for (const auto& [id, batch] : batches_) {
      if (cudaEventQuery(batch.event) != cudaSuccess) in_flight = true;
    }
    if (broken_ || in_flight) {
      nccl_api().ncclCommAbort(comm_);
    } else {
      nccl_api().ncclCommDestroy(comm_);
    }
  }
  release_cuda_resources();
}

void NcclTransport::release_cuda_resources() noexcept {
  for (auto& [id, batch] : batches_) cudaEventDestroy(batch.event);
  batches_.clear();
  for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
  spare_events_.clear();
  if (sync_event_ != nullptr) cudaEventDestroy(sync_event_);
  sync_event_ = nullptr;
  if (order_event_ != nullptr) cudaEventDestroy(order_event_);
  order_event_ = nullptr;
  kernels::cuda::device_release(scratch_, scratch_bytes_, device_, stream_);
  scratch_ = nullptr;
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  stream_ = nullptr;
  scratch_bytes_ = 0;
}

std::string NcclTransport::describe() const {
  return detail::concat("nccl rank ", rank_, " of ", size_, " on cuda:", device_);
}

// ---- errors and checks ------------------------------------------------------------------------

void NcclTransport::fail(std::string_view op, const std::string& what) {
  const std::string message = detail::concat(op, " (", describe(), "): ", what);
  if (owns_comm_ && !comm_aborted_) {
    nccl_api().ncclCommAbort(comm_);
    comm_aborted_ = true;
  }
  broken_ = true;
  GZ_THROW(ErrorCode::unsupported, message);
}

void NcclTransport::check_cuda(cudaError_t status, std::string_view op, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears the error unless it is sticky
  fail(op, detail::concat(call, " failed: ", cuda_error_text(status)));
}

void NcclTransport::check_nccl(ncclResult_t status, std::string_view op, const char* call) {
  if (status == ncclSuccess) return;
  const char* last = nccl_api().ncclGetLastError(comm_);
  fail(op, detail::concat(call, " failed: ", nccl_api().ncclGetErrorString(status),
                          last != nullptr && *last != '\0' ? " (" : "",
                          last != nullptr ? last : "", last != nullptr && *last != '\0' ? ")" : ""));
}

void NcclTransport::require_usable(std::string_view op) const {
  GZ_REQUIRE(failure_.empty(), ErrorCode::timeout, op, " (", describe(),
             "): this communicator timed out earlier (", failure_, "); end the job");
  GZ_REQUIRE(!broken_, ErrorCode::unsupported, op, " (", describe(),
             "): the transport failed earlier; its NCCL communicator can no longer be used");
}

void NcclTransport::time_out(std::string_view op, double waited_seconds) {
  char waited[32], limit[32];
  std::snprintf(waited, sizeof waited, "%.3f", waited_seconds);
  std::snprintf(limit, sizeof limit, "%.3f", policy_.seconds);
  std::string report = detail::concat("gradzip: timeout on ", describe(), ": ", op,
                                      " did not complete within ", limit, " s (waited ", waited,
                                      " s)\n  during: ", describe_current_operation(), "\n");
  for (const Pending& pending : pending_) {
    if (!pending.active || pending.batch == kImmediate) continue;
    report += pending.receive ? detail::concat("  still pending: receive of ", pending.bytes,
                                               " bytes from rank ", pending.peer, "\n")
                              : detail::concat("  still pending: send of ", pending.bytes,
                                               " bytes to rank ", pending.peer, "\n");
  }
  report += "  missing ranks: unknown (NCCL has no side channel to ask the others)\n";
  report += owns_comm_ ? "  the NCCL communicator is aborted (ncclCommAbort)\n"
                       : "  the NCCL communicator belongs to the application: abort it\n";
  report += policy_.action == TimeoutAction::abort
                ? "  action: ending this process (CommunicatorOptions::on_timeout = abort)\n"
                : "  action: throwing ErrorCode::timeout; this communicator is dead, end the job\n";
  note_timeout();
  write_timeout_report(report);
  if (owns_comm_ && !comm_aborted_) {
    nccl_api().ncclCommAbort(comm_);
    comm_aborted_ = true;
  }
  broken_ = true;
  if (policy_.action == TimeoutAction::abort) abort_job();
  failure_ = report.substr(0, report.find('\n'));
  throw Error(ErrorCode::timeout, report);
}

void NcclTransport::require_device_memory(const void* pointer, std::size_t bytes,
                                          std::string_view op, const char* what) const {
  if (bytes == 0) return;
  // The first and the last byte: a span that runs past its allocation is caught too when
  // nothing CUDA knows follows it.
  const std::string where = detail::concat(op, " (", describe(), ")");
  kernels::cuda::require_device_pointer(pointer, device_, where, what);
  kernels::cuda::require_device_pointer(static_cast<const std::byte*>(pointer) + (bytes - 1), device_,
                                        where, what);
}

// ---- streams, events, scratch -----------------------------------------------------------------

cudaEvent_t NcclTransport::take_event(std::string_view op) {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), op,
             "cudaEventCreateWithFlags");
  return event;
}

void NcclTransport::wait_for(cudaEvent_t event, std::string_view op, std::string_view site) {
  // Under idle waits: a few immediate polls (work already finishing completes in
  // microseconds), then sleeps doubling from 2 us to 100 us, as in the MPI transport.
  constexpr int kSpinPolls = 64;
  constexpr auto kLongestSleep = std::chrono::microseconds(100);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const auto limit = std::chrono::duration<double>(policy_.seconds);
  auto sleep = std::chrono::microseconds(2);
  for (int polls = 0;; ++polls) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) {
      kernels::cuda::count_polled_wait(site);
      return;
    }
    if (status != cudaErrorNotReady) check_cuda(status, op, "cudaEventQuery");
    ncclResult_t async_error = ncclSuccess;
    check_nccl(nccl_api().ncclCommGetAsyncError(comm_, &async_error), op, "ncclCommGetAsyncError");
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
      check_nccl(async_error, op, "an NCCL operation (asynchronous error)");
    }
    // A cudaEventQuery costs microseconds: reading the clock at every poll is cheap beside it.
    if (const auto waited = Clock::now() - start; waited >= limit)
      time_out(op, std::chrono::duration<double>(waited).count());
    if (!idle_waits_) {
      std::this_thread::yield();
    } else if (polls >= kSpinPolls) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    }
  }
}

void NcclTransport::synchronize(std::string_view op) {
  check_cuda(cudaEventRecord(sync_event_, stream_), op, "cudaEventRecord");
  wait_for(sync_event_, op);
}

// ---- stream order -----------------------------------------------------------------------------

void NcclTransport::begin_stream_order(void* work_stream) {
  require_usable("begin_stream_order");
  GZ_REQUIRE(!stream_ordered_, ErrorCode::internal, "begin_stream_order (", describe(),
             "): a stream-ordered call is already running on this transport");
  work_stream_ = static_cast<cudaStream_t>(work_stream);
  stream_ordered_ = true;
}

void NcclTransport::end_stream_order() noexcept {
  stream_ordered_ = false;
  work_stream_ = nullptr;
}

void NcclTransport::follow_work_stream(std::string_view op) {
  if (!stream_ordered_) return;
  check_cuda(cudaEventRecord(order_event_, work_stream_), op, "cudaEventRecord (the work stream)");
  check_cuda(cudaStreamWaitEvent(stream_, order_event_, 0), op, "cudaStreamWaitEvent");
}

void NcclTransport::join_work_stream(std::string_view op) {
  check_cuda(cudaEventRecord(order_event_, stream_), op, "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(work_stream_, order_event_, 0), op,
             "cudaStreamWaitEvent (the work stream)");
}

void NcclTransport::complete_collective(std::string_view op) {
  if (stream_ordered_) join_work_stream(op);
  else synchronize(op);
}

void NcclTransport::check_async_error(std::string_view op) {
  ncclResult_t async_error = ncclSuccess;
  check_nccl(nccl_api().ncclCommGetAsyncError(comm_, &async_error), op, "ncclCommGetAsyncError");
  if (async_error != ncclSuccess && async_error != ncclInProgress)
    check_nccl(async_error, op, "an NCCL operation (asynchronous error)");
}

void NcclTransport::wait_for_stream(std::string_view op) {
  require_usable(op);
  GZ_REQUIRE(stream_ordered_, ErrorCode::internal, op, " (", describe(),
             "): wait_for_stream outside a stream-ordered call");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), op, "cudaSetDevice");
  flush(op);  // nothing may stay unlaunched: the work stream may wait on it
  check_cuda(cudaEventRecord(sync_event_, work_stream_), op, "cudaEventRecord (the work stream)");
  wait_for(sync_event_, op, "stream-ordered call: completion");
}

void NcclTransport::ensure_scratch(std::size_t bytes, std::string_view op) {
  if (bytes <= scratch_bytes_) return;
  // Only the collectives use the scratch. They complete before returning, or in stream order
  // the work stream has been made to wait for them: the old block goes to the thread's cache,
  // whose later users on the work stream are ordered after that use, and a release to CUDA is
  // ordered on this transport's stream.
  const std::size_t grown = std::max(bytes, 2 * scratch_bytes_);
  kernels::cuda::device_release(scratch_, scratch_bytes_, device_, stream_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  try {
    scratch_ = kernels::cuda::device_allocate(grown, device_, stream_, op, "allocating the scratch buffer");
  } catch (const Error& error) {
    fail(op, error.what());
  }
  scratch_bytes_ = grown;
}

void NcclTransport::end_group(std::string_view op, ncclResult_t first_error,
                              const char* first_call) {
  const ncclResult_t end = nccl_api().ncclGroupEnd();
  check_nccl(first_error, op, first_call);
  check_nccl(end, op, "ncclGroupEnd");
}

// ---- point-to-point ---------------------------------------------------------------------------

Transport::Request NcclTransport::post(std::string_view op, int peer, int tag, const void* data,
                                       std::size_t bytes, bool receive) {
  require_usable(op);
  GZ_REQUIRE(peer >= 0 && peer < size_, ErrorCode::invalid_argument, op, " (", describe(),
             "): peer ", peer, " is not a rank of ", size_);
  require_device_memory(data, bytes, op, receive ? "the receive buffer" : "the send buffer");
  std::size_t slot = 0;
  while (slot < pending_.size() && pending_[slot].active) ++slot;
  if (slot == pending_.size()) pending_.emplace_back();
  pending_[slot] = Pending{peer, tag, data, bytes, receive, true, bytes == 0 ? kImmediate : kNotLaunched};
  if (bytes != 0) unlaunched_.push_back(slot);
  return Request{slot};
}

Transport::Request NcclTransport::isend(int peer, int tag, std::span<const std::byte> data) {
  return post("isend", peer, tag, data.data(), data.size(), false);
}

Transport::Request NcclTransport::irecv(int peer, int tag, std::span<std::byte> buffer) {
  return post("irecv", peer, tag, buffer.data(), buffer.size(), true);
}

void NcclTransport::flush(std::string_view op) {
  if (unlaunched_.empty()) return;
  const std::size_t id = next_batch_++;
  // In the map before anything can fail, so that the destructor releases the event.
  Batch& batch = batches_[id];
  batch.event = take_event(op);
  batch.outstanding = unlaunched_.size();
  follow_work_stream(op);  // the sends read what the work stream wrote
  check_nccl(nccl_api().ncclGroupStart(), op, "ncclGroupStart");
  GroupErrors errors;
  for (const std::size_t slot : unlaunched_) {
    Pending& pending = pending_[slot];
    pending.batch = id;
    if (pending.receive) {
      errors.note(nccl_api().ncclRecv(const_cast<void*>(pending.data), pending.bytes, ncclUint8, pending.peer,
                           comm_, stream_),
                  "ncclRecv");
    } else {
      errors.note(nccl_api().ncclSend(pending.data, pending.bytes, ncclUint8, pending.peer, comm_, stream_),
                  "ncclSend");
    }
  }
  unlaunched_.clear();
  end_group(op, errors.result, errors.call);
  check_cuda(cudaEventRecord(batch.event, stream_), op, "cudaEventRecord");
}

void NcclTransport::start_posted() {
  require_usable("start_posted");
  if (unlaunched_.empty()) return;
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "start_posted", "cudaSetDevice");
  flush("start_posted");
}

void NcclTransport::connect_eagerly() {
  constexpr const char* kOp = "connect_eagerly";
  require_usable(kOp);
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), kOp, "cudaSetDevice");
  flush(kOp);
  if (size_ == 1) return;
  // All-reduces of three sizes, so that the protocols NCCL picks for small, middle and large
  // messages (LL, LL128, Simple on current versions) are all connected; then one byte each
  // way with every peer, and one all-gather.
  constexpr std::size_t kLargestFloats = std::size_t{1} << 20;  // 4 MiB
  const std::size_t ranks = static_cast<std::size_t>(size_);
  ensure_scratch(std::max(kLargestFloats * sizeof(float), 2 * ranks), kOp);
  check_cuda(cudaMemsetAsync(scratch_, 0, kLargestFloats * sizeof(float), stream_), kOp,
             "cudaMemsetAsync");
  auto* const floats = static_cast<float*>(scratch_);
  for (const std::size_t count : {std::size_t{1}, std::size_t{16} * 1024, kLargestFloats}) {
    check_nccl(nccl_api().ncclAllReduce(floats, floats, count, ncclFloat32, ncclSum, comm_, stream_), kOp,
               "ncclAllReduce");
  }
  synchronize(kOp);
  auto* const bytes = static_cast<std::byte*>(scratch_);
  check_nccl(nccl_api().ncclGroupStart(), kOp, "ncclGroupStart");
  GroupErrors errors;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const std::size_t p = static_cast<std::size_t>(peer);
    errors.note(nccl_api().ncclSend(bytes + p, 1, ncclUint8, peer, comm_, stream_), "ncclSend");
    errors.note(nccl_api().ncclRecv(bytes + ranks + p, 1, ncclUint8, peer, comm_, stream_), "ncclRecv");
  }
  end_group(kOp, errors.result, errors.call);
  check_nccl(nccl_api().ncclAllGather(bytes + static_cast<std::size_t>(rank_), bytes, 1, ncclUint8, comm_, stream_),
             kOp, "ncclAllGather");
  synchronize(kOp);
}

std::size_t NcclTransport::wait(Request request) {
  GZ_REQUIRE(request.id < pending_.size() && pending_[request.id].active,
             ErrorCode::invalid_argument, "wait (", describe(), "): request ", request.id,
             " is not pending");
  require_usable("wait");
  Pending& pending = pending_[request.id];
  if (pending.batch == kImmediate) {
    pending.active = false;
    return 0;
  }
  const std::string op =
      pending.receive
          ? detail::concat("wait (receive of ", pending.bytes, " bytes from rank ", pending.peer,
                           ", tag ", pending.tag, ")")
          : detail::concat("wait (send of ", pending.bytes, " bytes to rank ", pending.peer,
                           ", tag ", pending.tag, ")");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), op, "cudaSetDevice");
  if (pending.batch == kNotLaunched) flush(op);
  const auto found = batches_.find(pending.batch);
  GZ_REQUIRE(found != batches_.end(), ErrorCode::internal, op, " (", describe(),
             "): the request's batch ", pending.batch, " is unknown");
  if (stream_ordered_) {
    // The work stream's later work (the decode of a receive, the next encode into a sent
    // buffer) waits for the batch; the host does not.
    check_cuda(cudaStreamWaitEvent(work_stream_, found->second.event, 0), op,
               "cudaStreamWaitEvent (the work stream)");
    check_async_error(op);
  } else {
    wait_for(found->second.event, op);
  }
  pending.active = false;
  if (--found->second.outstanding == 0) {
    spare_events_.push_back(found->second.event);
    batches_.erase(found);
  }
  return pending.bytes;
}

// ---- collectives ------------------------------------------------------------------------------

void NcclTransport::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                               std::span<const std::size_t> counts) {
  require_usable("allgatherv");
  GZ_REQUIRE(counts.size() == static_cast<std::size_t>(size_), ErrorCode::invalid_argument,
             "allgatherv (", describe(), "): ", counts.size(), " counts for ", size_, " ranks");
  const NcclAllgatherLayout layout = nccl_allgather_layout(counts);
  GZ_REQUIRE(mine.size() == counts[static_cast<std::size_t>(rank_)] && all.size() >= layout.total,
             ErrorCode::invalid_argument, "allgatherv (", describe(), "): ", mine.size(),
             " bytes of mine for a count of ", counts[static_cast<std::size_t>(rank_)],
             ", output of ", all.size(), " bytes for ", layout.total);
  require_device_memory(mine.data(), mine.size(), "allgatherv", "mine");
  require_device_memory(all.data(), layout.total, "allgatherv", "the output");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "allgatherv", "cudaSetDevice");
  flush("allgatherv");
  if (layout.padded_block == 0) return;  // every block is empty, on every rank alike
  follow_work_stream("allgatherv");
  ensure_scratch(layout.padded_total, "allgatherv");
  std::byte* const scratch = static_cast<std::byte*>(scratch_);
  std::byte* const my_slot = scratch + static_cast<std::size_t>(rank_) * layout.padded_block;
  if (!mine.empty()) {
    check_cuda(cudaMemcpyAsync(my_slot, mine.data(), mine.size(), cudaMemcpyDeviceToDevice, stream_),
               "allgatherv", "cudaMemcpyAsync (mine into its padded block)");
  }
  // In place: this rank's block already sits at its slot of the padded buffer.
  check_nccl(nccl_api().ncclAllGather(my_slot, scratch, layout.padded_block, ncclUint8, comm_, stream_),
             "allgatherv", "ncclAllGather");
  for (const NcclAllgatherLayout::Copy& copy : layout.copies) {
    check_cuda(cudaMemcpyAsync(all.data() + copy.destination, scratch + copy.source, copy.bytes,
                               cudaMemcpyDeviceToDevice, stream_),
               "allgatherv", "cudaMemcpyAsync (stripping the padding)");
  }
  complete_collective("allgatherv");
}

void NcclTransport::alltoallv(std::span<const std::byte> send,
                              std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                              std::span<const std::size_t> recv_counts) {
  require_usable("alltoallv");
  const std::size_t ranks = static_cast<std::size_t>(size_);
  GZ_REQUIRE(send_counts.size() == ranks && recv_counts.size() == ranks,
             ErrorCode::invalid_argument, "alltoallv (", describe(), "): ", send_counts.size(),
             " send counts and ", recv_counts.size(), " receive counts for ", size_, " ranks");
  const std::size_t send_total = total(send_counts);
  const std::size_t recv_total = total(recv_counts);
  GZ_REQUIRE(send.size() >= send_total && recv.size() >= recv_total, ErrorCode::invalid_argument,
             "alltoallv (", describe(), "): send buffer of ", send.size(), " bytes for ",
             send_total, ", receive buffer of ", recv.size(), " bytes for ", recv_total);
  require_device_memory(send.data(), send_total, "alltoallv", "the send buffer");
  require_device_memory(recv.data(), recv_total, "alltoallv", "the receive buffer");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "alltoallv", "cudaSetDevice");
  flush("alltoallv");
  if (send_total == 0 && recv_total == 0) return;
  follow_work_stream("alltoallv");
  check_nccl(nccl_api().ncclGroupStart(), "alltoallv", "ncclGroupStart");
  GroupErrors errors;
  std::size_t send_offset = 0;
  std::size_t recv_offset = 0;
  for (std::size_t peer = 0; peer < ranks; ++peer) {
    const int peer_rank = static_cast<int>(peer);
    if (send_counts[peer] != 0) {
      errors.note(nccl_api().ncclSend(send.data() + send_offset, send_counts[peer], ncclUint8, peer_rank,
                           comm_, stream_),
                  "ncclSend");
    }
    if (recv_counts[peer] != 0) {
      errors.note(nccl_api().ncclRecv(recv.data() + recv_offset, recv_counts[peer], ncclUint8, peer_rank,
                           comm_, stream_),
                  "ncclRecv");
    }
    send_offset += send_counts[peer];
    recv_offset += recv_counts[peer];
  }
  end_group("alltoallv", errors.result, errors.call);
  complete_collective("alltoallv");
}

void NcclTransport::allgather_u64(std::span<const std::uint64_t> mine,
                                  std::span<std::uint64_t> all) {
  require_usable("allgather_u64");
  GZ_REQUIRE(all.size() == mine.size() * static_cast<std::size_t>(size_),
             ErrorCode::invalid_argument, "allgather_u64 (", describe(), "): output holds ",
             all.size(), " values for ", mine.size(), " per rank x ", size_, " ranks");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "allgather_u64", "cudaSetDevice");
  flush("allgather_u64");
  if (mine.empty()) return;
  follow_work_stream("allgather_u64");  // its scratch may be a block the work stream released
  const std::size_t block_bytes = mine.size_bytes();
  ensure_scratch(block_bytes * static_cast<std::size_t>(size_), "allgather_u64");
  std::byte* const scratch = static_cast<std::byte*>(scratch_);
  std::byte* const my_slot = scratch + static_cast<std::size_t>(rank_) * block_bytes;
  // cudaMemcpyDefault: the spans are host memory as documented, but any memory CUDA can
  // address works.
  check_cuda(cudaMemcpyAsync(my_slot, mine.data(), block_bytes, cudaMemcpyDefault, stream_),
             "allgather_u64", "cudaMemcpyAsync (to the device)");
  check_nccl(nccl_api().ncclAllGather(my_slot, scratch, mine.size(), ncclUint64, comm_, stream_),
             "allgather_u64", "ncclAllGather");
  // Complete the gather first: a copy into pageable memory blocks inside CUDA, where errors
  // of the gather could not be seen.
  synchronize("allgather_u64");
  check_cuda(cudaMemcpyAsync(all.data(), scratch, all.size_bytes(), cudaMemcpyDefault, stream_),
             "allgather_u64", "cudaMemcpyAsync (to the host)");
  synchronize("allgather_u64");
}

void NcclTransport::allreduce_f32_sum(std::span<float> data) {
  require_usable("allreduce_f32_sum");
  require_device_memory(data.data(), data.size_bytes(), "allreduce_f32_sum", "the data");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "allreduce_f32_sum", "cudaSetDevice");
  flush("allreduce_f32_sum");
  if (data.empty()) return;
  follow_work_stream("allreduce_f32_sum");
  check_nccl(nccl_api().ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum, comm_,
                           stream_),
             "allreduce_f32_sum", "ncclAllReduce");
  complete_collective("allreduce_f32_sum");
}

void NcclTransport::barrier() {
  require_usable("barrier");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "barrier", "cudaSetDevice");
  flush("barrier");
  follow_work_stream("barrier");
  ensure_scratch(sizeof(int), "barrier");
  check_cuda(cudaMemsetAsync(scratch_, 0, sizeof(int), stream_), "barrier", "cudaMemsetAsync");
  check_nccl(nccl_api().ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "barrier",
             "ncclAllReduce");
  complete_collective("barrier");
}

// ---- splits -----------------------------------------------------------------------------------

std::unique_ptr<Transport> NcclTransport::split(int color, int key) {
  require_usable("split");
  GZ_REQUIRE(color >= 0, ErrorCode::invalid_argument, "split (", describe(), "): color ", color,
             " is negative; every rank of the NCCL transport must join a group");
  const CurrentCudaDevice scope(device_);
  check_cuda(scope.status(), "split", "cudaSetDevice");
  flush("split");
  ncclComm_t sub = nullptr;
  check_nccl(nccl_api().ncclCommSplit(comm_, color, key, &sub, nullptr), "split", "ncclCommSplit");
  GZ_REQUIRE(sub != nullptr, ErrorCode::internal, "split (", describe(), "): ncclCommSplit with color ",
             color, " returned no communicator");
  auto result = std::make_unique<NcclTransport>(sub, true);
  result->set_deadline_policy(policy_);
  return result;
}

std::unique_ptr<Transport> NcclTransport::split_by_node() {
  require_usable("split_by_node");
  char host[256] = {};
  GZ_REQUIRE(gethostname(host, sizeof host - 1) == 0, ErrorCode::unsupported, "split_by_node (",
             describe(), "): gethostname failed");
  const std::uint64_t mine = fnv1a64(host);
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(size_));
  allgather_u64(std::span<const std::uint64_t>(&mine, 1), hashes);
  // The lowest rank on this node names the group; ordering by old rank keeps the node's ranks
  // in their world order.
  const int color = static_cast<int>(std::find(hashes.begin(), hashes.end(), mine) - hashes.begin());
  return split(color, rank_);
}

}  // namespace gradzip::collectives
