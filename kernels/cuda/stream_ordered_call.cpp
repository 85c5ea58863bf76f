// Stream-ordered calls (kernels/cuda/stream_ordered_call.h).
#include "kernels/cuda/stream_ordered_call.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/runtime_support.h"

namespace gradzip::kernels::cuda {
namespace {

constexpr std::size_t kBlockWords = StreamOrderedCall::kStatusWords + StreamOrderedCall::kMaxRankWords;

// A thread's status words and what the previous call left in them.
struct ThreadWords {
  int* block = nullptr;             // pinned, kBlockWords ints, freed at thread exit
  std::size_t dirty_checks = 0;     // words [0, dirty_checks) may be non-zero
  std::size_t dirty_ranks = 0;      // rank words [0, dirty_ranks) may be non-zero
  bool unfinished = false;          // the previous call closed without its completion
  StreamOrderedCall* open = nullptr;

  ~ThreadWords() {
    // The thread is ending: a call it left unfinished may still have kernels writing here, so
    // the block is kept (a leak of one block, only after a failed call on an exiting thread).
    if (!unfinished) pinned_release(block);
  }
};

ThreadWords& thread_words() {
  thread_local ThreadWords words;
  return words;
}

}  // namespace

StreamOrderedCall::StreamOrderedCall(std::string_view op) {
  ThreadWords& thread = thread_words();
  GZ_REQUIRE(thread.open == nullptr, ErrorCode::internal, op,
             ": a stream-ordered call is already open on this thread");
  if (thread.block == nullptr) {
    thread.block = static_cast<int*>(pinned_allocate(kBlockWords * sizeof(int), op));
    std::memset(thread.block, 0, kBlockWords * sizeof(int));
  }
  if (thread.unfinished) {
    // Kernels of the previous call may still write its words.
    synchronize_stream(static_cast<cudaStream_t>(thread_work_stream()),
                       "stream-ordered call: the unfinished previous call", "cudaStreamSynchronize");
    thread.unfinished = false;
  }
  std::memset(thread.block, 0, thread.dirty_checks * sizeof(int));
  std::memset(thread.block + kStatusWords, 0, thread.dirty_ranks * sizeof(int));
  thread.dirty_checks = 0;
  thread.dirty_ranks = 0;
  words_ = thread.block;
  thread.open = this;
}

StreamOrderedCall::~StreamOrderedCall() {
  ThreadWords& thread = thread_words();
  thread.open = nullptr;
  thread.dirty_checks = checks_.size();
  thread.dirty_ranks = ranks_ * per_rank_;
  if (!completed_) thread.unfinished = true;
}

StreamOrderedCall* StreamOrderedCall::current() noexcept { return thread_words().open; }

int* StreamOrderedCall::status_word(std::string op, Describe describe, ErrorCode code) {
  if (checks_.size() >= kStatusWords) return nullptr;
  checks_.push_back(Check{std::move(op), describe, code});
  return words_ + (checks_.size() - 1);
}

int* StreamOrderedCall::rank_words(std::size_t ranks, std::size_t per_rank) {
  GZ_REQUIRE(per_rank >= 1 && ranks <= kMaxRankWords / per_rank, ErrorCode::unsupported,
             "stream-ordered call: the checks of ", ranks, " ranks, ", per_rank,
             " words each (at most ", kMaxRankWords, " words)");
  ranks_ = ranks;
  per_rank_ = per_rank;
  return words_ + kStatusWords;
}

bool StreamOrderedCall::rank_word(std::size_t rank, std::size_t slot) const noexcept {
  return rank < ranks_ && slot < per_rank_ && words_[kStatusWords + rank * per_rank_ + slot] != 0;
}

void StreamOrderedCall::complete_and_check(int rank) {
  completed_ = true;
  for (std::size_t i = 0; i < checks_.size(); ++i) {
    const int status = words_[i];
    if (status == 0) continue;
    const Check& check = checks_[i];
    GZ_THROW(check.code, check.op, ": ", check.describe(status));
  }
  std::string failed;
  std::size_t count = 0;
  for (std::size_t r = 0; r < ranks_; ++r) {
    if (!rank_word(r, 0) || static_cast<int>(r) == rank) continue;
    failed += detail::concat(count++ == 0 ? "" : ",", r);
  }
  GZ_REQUIRE(count == 0, ErrorCode::malformed_message, "the call failed a check on rank",
             count > 1 ? "s " : " ", failed,
             " (a received message was malformed there: its error says which; this rank's "
             "messages all passed)");
}

}  // namespace gradzip::kernels::cuda
