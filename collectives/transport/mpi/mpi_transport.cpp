#include "collectives/transport/mpi/mpi_transport.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_CUDA_AWARE_SUPPORT
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <numeric>

#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

std::string mpi_error_text(int status) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

int as_count(std::size_t bytes, const char* op, const std::string& who) {
  GZ_REQUIRE(bytes <= kMaxMessageBytes, ErrorCode::unsupported, op, " (", who, "): ", bytes,
             " bytes in one message or block; the MPI transport carries at most ", kMaxMessageBytes,
             " (split the tensor into smaller chunks)");
  return static_cast<int>(bytes);
}

// Counts and displacements of a v-collective as MPI ints; throws when a block or an offset
// does not fit.
void to_counts_and_displacements(std::span<const std::size_t> counts, std::vector<int>& out_counts,
                                 std::vector<int>& out_displacements, const char* op,
                                 const std::string& who) {
  out_counts.resize(counts.size());
  out_displacements.resize(counts.size());
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    out_counts[r] = as_count(counts[r], op, who);
    out_displacements[r] = as_count(offset, op, who);
    offset += counts[r];
  }
}

std::size_t total(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

}  // namespace

void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    const int status = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    GZ_REQUIRE(status == MPI_SUCCESS, ErrorCode::unsupported, "MPI_Init_thread failed: ",
               mpi_error_text(status));
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  });
}

namespace {

// Whether this MPI library moves CUDA device memory: Open MPI's extension says at compile
// time whether it was built so and at run time whether the loaded library supports it.
bool mpi_is_cuda_aware() noexcept {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm) {
  ensure_mpi_initialized();
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Errors come back as return codes so they become gradzip::Error with context.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  cuda_aware_ = mpi_is_cuda_aware();
}

MpiTransport::MpiTransport(MPI_Comm comm, Adopt) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  cuda_aware_ = mpi_is_cuda_aware();
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || comm_ == MPI_COMM_NULL) return;
  for (Pending& pending : pending_) {
    if (pending.active && pending.request != MPI_REQUEST_NULL) {
      MPI_Cancel(&pending.request);
      MPI_Request_free(&pending.request);
    }
  }
  MPI_Comm_free(&comm_);
}

std::string MpiTransport::describe() const {
  return detail::concat("mpi rank ", rank_, " of ", size_);
}

void MpiTransport::check(int status, const char* op) const {
  GZ_REQUIRE(status == MPI_SUCCESS, ErrorCode::internal, op, " failed on ", describe(), ": ",
             mpi_error_text(status));
}

std::size_t MpiTransport::slot_for_new_request() {
  for (std::size_t i = 0; i < pending_.size(); ++i)
    if (!pending_[i].active) return i;
  pending_.emplace_back();
  return pending_.size() - 1;
}

Transport::Request MpiTransport::isend(int peer, int tag, std::span<const std::byte> data) {
  GZ_REQUIRE(peer >= 0 && peer < size_, ErrorCode::invalid_argument, "isend (", describe(),
             "): peer ", peer, " is not a rank of ", size_);
  const int count = as_count(data.size(), "isend", describe());
  const std::size_t slot = slot_for_new_request();
  Pending& pending = pending_[slot];
  pending = Pending{MPI_REQUEST_NULL, peer, tag, data.size(), false, true};
  const int status = MPI_Isend(data.data(), count, MPI_BYTE, peer, tag, comm_, &pending.request);
  if (status != MPI_SUCCESS) pending.active = false;
  check(status, "MPI_Isend");
  return Request{slot};
}

Transport::Request MpiTransport::irecv(int peer, int tag, std::span<std::byte> buffer) {
  GZ_REQUIRE(peer >= 0 && peer < size_, ErrorCode::invalid_argument, "irecv (", describe(),
             "): peer ", peer, " is not a rank of ", size_);
  const int count = as_count(buffer.size(), "irecv", describe());
  const std::size_t slot = slot_for_new_request();
  Pending& pending = pending_[slot];
  pending = Pending{MPI_REQUEST_NULL, peer, tag, buffer.size(), true, true};
  const int status = MPI_Irecv(buffer.data(), count, MPI_BYTE, peer, tag, comm_, &pending.request);
  if (status != MPI_SUCCESS) pending.active = false;
  check(status, "MPI_Irecv");
  return Request{slot};
}

bool MpiTransport::concurrent_use_supported() const {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

int MpiTransport::complete(MPI_Request& request, MPI_Status& status) const {
  if (!idle_waits_) return MPI_Wait(&request, &status);
  // Poll: a few immediate retries (a message already on its way completes in microseconds),
  // then sleeps that double from 2 us up to 100 us. 100 us is under 1% of a 4 MiB chunk's time
  // on a 10 Gbit/s link, and the CPU stays free for backward meanwhile.
  constexpr int kSpinPolls = 64;
  constexpr auto kLongestSleep = std::chrono::microseconds(100);
  auto sleep = std::chrono::microseconds(2);
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int result = MPI_Test(&request, &done, &status);
    if (result != MPI_SUCCESS || done) return result;
    if (polls < kSpinPolls) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
}

template <typename Start, typename Blocking>
void MpiTransport::run_collective(const char* op, Start&& start, Blocking&& blocking) {
  if (!idle_waits_) {
    check(blocking(), op);
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(start(&request), op);
  MPI_Status status;
  check(complete(request, status), op);
}

std::size_t MpiTransport::wait(Request request) {
  GZ_REQUIRE(request.id < pending_.size() && pending_[request.id].active,
             ErrorCode::invalid_argument, "wait (", describe(), "): request ", request.id,
             " is not pending");
  Pending& pending = pending_[request.id];
  MPI_Status status;
  const int result = complete(pending.request, status);
  pending.active = false;
  if (result == MPI_ERR_TRUNCATE || (result == MPI_ERR_IN_STATUS && status.MPI_ERROR == MPI_ERR_TRUNCATE)) {
    GZ_THROW(ErrorCode::malformed_message, "receive from rank ", pending.peer, " (tag ",
             pending.tag, ") on ", describe(), ": the message is longer than the ",
             pending.bytes, "-byte buffer");
  }
  check(result, pending.receive ? "MPI_Wait (receive)" : "MPI_Wait (send)");
  if (!pending.receive) return pending.bytes;
  int received = 0;
  MPI_Get_count(&status, MPI_BYTE, &received);
  return static_cast<std::size_t>(received);
}

void MpiTransport::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                              std::span<const std::size_t> counts) {
  GZ_REQUIRE(counts.size() == static_cast<std::size_t>(size_) &&
                 mine.size() == counts[static_cast<std::size_t>(rank_)] &&
                 all.size() >= total(counts),
             ErrorCode::invalid_argument, "allgatherv (", describe(), "): ", counts.size(),
             " counts for ", size_, " ranks, ", mine.size(), " bytes of mine, output of ",
             all.size(), " bytes for ", total(counts));
  std::vector<int> int_counts, displacements;
  to_counts_and_displacements(counts, int_counts, displacements, "allgatherv", describe());
  const int my_count = int_counts[static_cast<std::size_t>(rank_)];
  run_collective(
      "MPI_Allgatherv",
      [&](MPI_Request* request) {
        return MPI_Iallgatherv(mine.data(), my_count, MPI_BYTE, all.data(), int_counts.data(),
                               displacements.data(), MPI_BYTE, comm_, request);
      },
      [&] {
        return MPI_Allgatherv(mine.data(), my_count, MPI_BYTE, all.data(), int_counts.data(),
                              displacements.data(), MPI_BYTE, comm_);
      });
}

void MpiTransport::alltoallv(std::span<const std::byte> send,
                             std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                             std::span<const std::size_t> recv_counts) {
  GZ_REQUIRE(send_counts.size() == static_cast<std::size_t>(size_) &&
                 recv_counts.size() == static_cast<std::size_t>(size_) &&
                 send.size() >= total(send_counts) && recv.size() >= total(recv_counts),
             ErrorCode::invalid_argument, "alltoallv (", describe(),
             "): counts or buffers do not match ", size_, " ranks");
  std::vector<int> sc, sd, rc, rd;
  to_counts_and_displacements(send_counts, sc, sd, "alltoallv", describe());
  to_counts_and_displacements(recv_counts, rc, rd, "alltoallv", describe());
  run_collective(
      "MPI_Alltoallv",
      [&](MPI_Request* request) {
        return MPI_Ialltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(),
                              rc.data(), rd.data(), MPI_BYTE, comm_, request);
      },
      [&] {
        return MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(),
                             rd.data(), MPI_BYTE, comm_);
      });
}

void MpiTransport::allgather_u64(std::span<const std::uint64_t> mine,
                                 std::span<std::uint64_t> all) {
  GZ_REQUIRE(all.size() == mine.size() * static_cast<std::size_t>(size_),
             ErrorCode::invalid_argument, "allgather_u64 (", describe(), "): output holds ",
             all.size(), " values for ", mine.size(), " per rank x ", size_, " ranks");
  const int count = as_count(mine.size(), "allgather_u64", describe());
  run_collective(
      "MPI_Allgather",
      [&](MPI_Request* request) {
        return MPI_Iallgather(mine.data(), count, MPI_UINT64_T, all.data(), count, MPI_UINT64_T,
                              comm_, request);
      },
      [&] {
        return MPI_Allgather(mine.data(), count, MPI_UINT64_T, all.data(), count, MPI_UINT64_T,
                             comm_);
      });
}

void MpiTransport::allreduce_f32_sum(std::span<float> data) {
  if (data.empty()) return;
  const int count = as_count(data.size(), "allreduce_f32_sum", describe());
  // Always the blocking form: MPI_Iallreduce may add in another order than MPI_Allreduce
  // (Open MPI does at 5 ranks), and the result must not depend on the wait policy. Only small
  // tensors (under min_bytes) take this path, so spinning here is brief.
  check(MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
}

void MpiTransport::barrier() {
  run_collective(
      "MPI_Barrier", [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); },
      [&] { return MPI_Barrier(comm_); });
}

std::unique_ptr<Transport> MpiTransport::split(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  return std::unique_ptr<Transport>(new MpiTransport(sub, Adopt{}));
}

std::unique_ptr<Transport> MpiTransport::split_by_node() {
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub),
        "MPI_Comm_split_type");
  return std::unique_ptr<Transport>(new MpiTransport(sub, Adopt{}));
}

}  // namespace gradzip::collectives
