#include "collectives/transport/mpi/mpi_transport.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_CUDA_AWARE_SUPPORT
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <numeric>

#include "collectives/transport/deadline.h"
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
      // After a timeout MPI_Finalize could wait forever for the operation that never finished
      // (or for a dead rank): the job is ending anyway, so leave it unfinalised.
      if (timed_out_anywhere()) return;
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

MpiTransport::MpiTransport(MPI_Comm comm) : policy_(resolve_deadline_policy({})) {
  ensure_mpi_initialized();
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Errors come back as return codes so they become gradzip::Error with context.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  make_diagnostic_comm();
  cuda_aware_ = mpi_is_cuda_aware();
}

MpiTransport::MpiTransport(MPI_Comm comm, Adopt) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  make_diagnostic_comm();
  cuda_aware_ = mpi_is_cuda_aware();
}

void MpiTransport::make_diagnostic_comm() {
  const int status = MPI_Comm_dup(comm_, &diagnostic_comm_);
  if (status != MPI_SUCCESS) {
    MPI_Comm_free(&comm_);
    check(status, "MPI_Comm_dup (diagnostic communicator)");
  }
  MPI_Comm_set_errhandler(diagnostic_comm_, MPI_ERRORS_RETURN);
}

MpiTransport::~MpiTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || comm_ == MPI_COMM_NULL) return;
  // After a timeout (here or on another transport of the process) requests may never complete
  // and peers may be dead: freeing could wait on them. The job is ending; leak instead.
  if (!failure_.empty() || timed_out_anywhere()) return;
  for (Pending& pending : pending_) {
    if (pending.active && pending.request != MPI_REQUEST_NULL) {
      MPI_Cancel(&pending.request);
      MPI_Request_free(&pending.request);
    }
  }
  MPI_Comm_free(&diagnostic_comm_);
  MPI_Comm_free(&comm_);
}

void MpiTransport::abort_job() noexcept {
  MPI_Abort(MPI_COMM_WORLD, 124);
  std::abort();  // MPI_Abort does not return; this is for a library that does
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

void MpiTransport::require_alive(const char* op) const {
  if (failure_.empty()) return;
  const std::string first_line = failure_.substr(0, failure_.find('\n'));
  throw Error(ErrorCode::timeout,
              detail::concat("gradzip: ", op, " (", describe(),
                             "): this communicator timed out earlier (", first_line,
                             "); end the job, it cannot be used again"));
}

Transport::Request MpiTransport::isend(int peer, int tag, std::span<const std::byte> data) {
  require_alive("isend");
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
  require_alive("irecv");
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

int MpiTransport::complete(MPI_Request& request, MPI_Status& status, const WaitSubject& subject) {
  using Clock = std::chrono::steady_clock;
  // Idle waits: a few immediate retries (a message already on its way completes in
  // microseconds), then sleeps that double from 2 us up to 100 us. 100 us is under 1% of a
  // 4 MiB chunk's time on a 10 Gbit/s link, and the CPU stays free for backward meanwhile.
  // Spinning waits read the clock every kPollsPerClockRead polls only.
  constexpr int kSpinPolls = 64;
  constexpr std::uint64_t kPollsPerClockRead = 256;
  constexpr auto kLongestSleep = std::chrono::microseconds(100);
  const Clock::time_point start = Clock::now();
  const auto limit = std::chrono::duration<double>(policy_.seconds);
  auto sleep = std::chrono::microseconds(2);
  for (std::uint64_t polls = 0;; ++polls) {
    int done = 0;
    const int result = MPI_Test(&request, &done, &status);
    if (result != MPI_SUCCESS || done) return result;
    if (idle_waits_ && polls >= kSpinPolls) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    } else if (polls % kPollsPerClockRead != kPollsPerClockRead - 1) {
      continue;
    }
    const auto waited = Clock::now() - start;
    if (waited >= limit) time_out(subject, std::chrono::duration<double>(waited).count());
  }
}

template <typename Start>
void MpiTransport::run_collective(const char* op, std::size_t bytes, Start&& start) {
  require_alive(op);
  MPI_Request request = MPI_REQUEST_NULL;
  check(start(&request), op);
  MPI_Status status;
  check(complete(request, status, WaitSubject{op, SIZE_MAX, bytes}), op);
}

std::size_t MpiTransport::wait(Request request) {
  require_alive("wait");
  GZ_REQUIRE(request.id < pending_.size() && pending_[request.id].active,
             ErrorCode::invalid_argument, "wait (", describe(), "): request ", request.id,
             " is not pending");
  Pending& pending = pending_[request.id];
  MPI_Status status;
  const int result = complete(pending.request, status, WaitSubject{"wait", request.id, pending.bytes});
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

// ---- timeouts ---------------------------------------------------------------------------------

namespace {

// Tag of timeout notices on the diagnostic communicator (nothing else travels there).
constexpr int kTimeoutNoticeTag = 1;
constexpr int kNoticeWords = 2;  // {call sequence number, 1 = "timed out"}

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", seconds);
  return text;
}

}  // namespace

void MpiTransport::translate_to_world_ranks() {
  if (!world_ranks_.empty()) return;
  std::vector<int> mine(static_cast<std::size_t>(size_));
  std::iota(mine.begin(), mine.end(), 0);
  world_ranks_.assign(mine.size(), MPI_UNDEFINED);
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  // Local calls only (no communication): safe while peers are gone.
  if (MPI_Comm_group(comm_, &group) == MPI_SUCCESS &&
      MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS) {
    MPI_Group_translate_ranks(group, size_, mine.data(), world, world_ranks_.data());
  }
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
}

std::string MpiTransport::describe_rank(int rank) const {
  const int world = rank < static_cast<int>(world_ranks_.size())
                        ? world_ranks_[static_cast<std::size_t>(rank)]
                        : MPI_UNDEFINED;
  if (world == rank) return detail::concat("rank ", rank);
  if (world == MPI_UNDEFINED) return detail::concat("rank ", rank, " (world rank unknown)");
  return detail::concat("rank ", rank, " (world rank ", world, ")");
}

std::string MpiTransport::describe_subject(const WaitSubject& subject) const {
  if (subject.slot == SIZE_MAX) {
    return detail::concat(subject.op, " of ", subject.bytes, " bytes from this rank");
  }
  const Pending& pending = pending_[subject.slot];
  return pending.receive
             ? detail::concat("receive of up to ", pending.bytes, " bytes from ",
                              describe_rank(pending.peer), " tag ", pending.tag)
             : detail::concat("send of ", pending.bytes, " bytes to ", describe_rank(pending.peer),
                              " tag ", pending.tag);
}

void MpiTransport::time_out(const WaitSubject& subject, double waited_seconds) {
  translate_to_world_ranks();
  const CurrentOperation* operation = current_operation();
  const std::uint64_t sequence = operation != nullptr ? operation->sequence : 0;

  // Tell every other rank that this one timed out. The notice buffer is leaked on purpose:
  // a send to a dead rank may never complete, and the request is freed without waiting.
  auto* notice = new std::uint64_t[kNoticeWords]{sequence, 1};
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(notice, kNoticeWords, MPI_UINT64_T, peer, kTimeoutNoticeTag, diagnostic_comm_,
                  &request) == MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
  // Listen for theirs during the grace window (or until every other rank has sent one).
  std::vector<bool> noticed(static_cast<std::size_t>(size_), false);
  std::vector<std::uint64_t> their_sequence(static_cast<std::size_t>(size_), 0);
  int heard = 0;
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(timeout_grace_seconds(policy_));
  while (heard < size_ - 1 && std::chrono::steady_clock::now() < grace_end) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kTimeoutNoticeTag, diagnostic_comm_, &arrived, &status) !=
        MPI_SUCCESS) {
      break;
    }
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    std::uint64_t received[kNoticeWords] = {};
    if (MPI_Recv(received, kNoticeWords, MPI_UINT64_T, status.MPI_SOURCE, kTimeoutNoticeTag,
                 diagnostic_comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      break;
    }
    const auto source = static_cast<std::size_t>(status.MPI_SOURCE);
    if (!noticed[source]) ++heard;
    noticed[source] = true;
    their_sequence[source] = received[0];
  }

  std::string report = detail::concat(
      "gradzip: timeout on ", describe(), describe_rank(rank_).substr(detail::concat("rank ", rank_).size()), ": ",
      describe_subject(subject), " did not complete within ", format_seconds(policy_.seconds),
      " s (waited ", format_seconds(waited_seconds), " s)\n  during: ",
      describe_current_operation(), "\n");
  for (std::size_t slot = 0; slot < pending_.size(); ++slot) {
    if (!pending_[slot].active) continue;
    report += "  still pending: " + describe_subject(WaitSubject{"", slot, 0}) + "\n";
  }
  std::string missing, also;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const auto p = static_cast<std::size_t>(peer);
    if (!noticed[p]) {
      missing += (missing.empty() ? "" : ", ") + describe_rank(peer);
    } else {
      also += detail::concat(also.empty() ? "" : ", ", describe_rank(peer),
                             their_sequence[p] == sequence && sequence != 0
                                 ? " (same call)"
                                 : detail::concat(" (at call ", their_sequence[p], ")"));
    }
  }
  report += "  missing ranks: " + (missing.empty() ? std::string("none") : missing) +
            (missing.empty() ? "" : " (never reached this operation, or dead)") + "\n";
  if (!also.empty()) report += "  timed out too: " + also + "\n";
  report += policy_.action == TimeoutAction::abort
                ? "  action: MPI_Abort (CommunicatorOptions::on_timeout = abort)\n"
                : "  action: throwing ErrorCode::timeout; this communicator is dead, end the job\n";

  note_timeout();
  write_timeout_report(report);
  if (policy_.action == TimeoutAction::abort) abort_job();
  failure_ = report;
  throw Error(ErrorCode::timeout, report);
}

// ---- collectives --------------------------------------------------------------------------------

void MpiTransport::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                              std::span<const std::size_t> counts) {
  require_alive("allgatherv");
  GZ_REQUIRE(counts.size() == static_cast<std::size_t>(size_) &&
                 mine.size() == counts[static_cast<std::size_t>(rank_)] &&
                 all.size() >= total(counts),
             ErrorCode::invalid_argument, "allgatherv (", describe(), "): ", counts.size(),
             " counts for ", size_, " ranks, ", mine.size(), " bytes of mine, output of ",
             all.size(), " bytes for ", total(counts));
  std::vector<int> int_counts, displacements;
  to_counts_and_displacements(counts, int_counts, displacements, "allgatherv", describe());
  const int my_count = int_counts[static_cast<std::size_t>(rank_)];
  run_collective("MPI_Iallgatherv", mine.size(), [&](MPI_Request* request) {
    return MPI_Iallgatherv(mine.data(), my_count, MPI_BYTE, all.data(), int_counts.data(),
                           displacements.data(), MPI_BYTE, comm_, request);
  });
}

void MpiTransport::alltoallv(std::span<const std::byte> send,
                             std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                             std::span<const std::size_t> recv_counts) {
  require_alive("alltoallv");
  GZ_REQUIRE(send_counts.size() == static_cast<std::size_t>(size_) &&
                 recv_counts.size() == static_cast<std::size_t>(size_) &&
                 send.size() >= total(send_counts) && recv.size() >= total(recv_counts),
             ErrorCode::invalid_argument, "alltoallv (", describe(),
             "): counts or buffers do not match ", size_, " ranks");
  std::vector<int> sc, sd, rc, rd;
  to_counts_and_displacements(send_counts, sc, sd, "alltoallv", describe());
  to_counts_and_displacements(recv_counts, rc, rd, "alltoallv", describe());
  run_collective("MPI_Ialltoallv", total(send_counts), [&](MPI_Request* request) {
    return MPI_Ialltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(),
                          rd.data(), MPI_BYTE, comm_, request);
  });
}

void MpiTransport::allgather_u64(std::span<const std::uint64_t> mine,
                                 std::span<std::uint64_t> all) {
  require_alive("allgather_u64");
  GZ_REQUIRE(all.size() == mine.size() * static_cast<std::size_t>(size_),
             ErrorCode::invalid_argument, "allgather_u64 (", describe(), "): output holds ",
             all.size(), " values for ", mine.size(), " per rank x ", size_, " ranks");
  const int count = as_count(mine.size(), "allgather_u64", describe());
  run_collective("allgather_u64 (MPI_Iallgather)", mine.size_bytes(), [&](MPI_Request* request) {
    return MPI_Iallgather(mine.data(), count, MPI_UINT64_T, all.data(), count, MPI_UINT64_T,
                          comm_, request);
  });
}

void MpiTransport::allreduce_f32_sum(std::span<float> data) {
  require_alive("allreduce_f32_sum");
  if (data.empty()) return;
  const int count = as_count(data.size(), "allreduce_f32_sum", describe());
  // Always the non-blocking form, so that the wait has a deadline and the summation order does
  // not depend on the wait policy (MPI_Iallreduce may add in another order than MPI_Allreduce).
  run_collective("allreduce_f32_sum (MPI_Iallreduce)", data.size_bytes(),
                 [&](MPI_Request* request) {
                   return MPI_Iallreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM,
                                         comm_, request);
                 });
}

void MpiTransport::barrier() {
  run_collective("barrier (MPI_Ibarrier)", 0,
                 [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
}

std::unique_ptr<Transport> MpiTransport::split(int color, int key) {
  require_alive("split");
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  std::unique_ptr<MpiTransport> result(new MpiTransport(sub, Adopt{}));
  result->policy_ = policy_;
  return result;
}

std::unique_ptr<Transport> MpiTransport::split_by_node() {
  require_alive("split_by_node");
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub),
        "MPI_Comm_split_type");
  std::unique_ptr<MpiTransport> result(new MpiTransport(sub, Adopt{}));
  result->policy_ = policy_;
  return result;
}

}  // namespace gradzip::collectives
