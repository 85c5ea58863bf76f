// A stream-ordered call: while one is open on a thread, the device work gradzip does on that
// thread (the device codecs, device error feedback, the collectives' device copies and
// conversions) is only queued on the thread's work stream (runtime_support.h's
// thread_work_stream): nothing waits for the device, and a check whose answer the device holds
// (a received message's header and payload, top-k's entry count) writes a status word of the
// call instead of being read back. Whoever opened the call waits for the work stream once, at
// its end (its completion), then calls check(), which throws for the first failed check.
//
// The Communicator opens one per call that runs over NCCL (collectives/device_memory.h's
// OrderedDeviceCall, which also orders the NCCL transport's stream with the work stream); the
// public Codec calls on CUDA tensors stay synchronous (gradzip/codec.h).
//
// Status words live in pinned host memory (cudaMallocHost: with unified addressing, kernels
// write it directly), one block per thread kept for the thread's life: reading them after the
// completion wait copies nothing between host and device. They are zeroed on the host when a
// call opens. A call that closes without its completion (an exception unwound it) leaves work
// that may still write its words: the next call opened on the thread waits for the work stream
// first (counted, at site "stream-ordered call: the unfinished previous call").
// Host code of device builds only (includes the CUDA runtime through device_api.h).
#pragma once

#include "kernels/device_api.h"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gradzip/error.h"

namespace gradzip::kernels::cuda {

class StreamOrderedCall {
 public:
  // Status words one call may take. A call needing more (a ring over thousands of ranks) gets
  // nullptr from status_word and checks the rest synchronously.
  static constexpr std::size_t kStatusWords = 4096;
  // Ranks whose all-reduced answer rank_words can hold (after the status words in the block).
  static constexpr std::size_t kMaxRankWords = 65536;

  // Explains a non-zero status word (for the exception's text).
  using Describe = std::string (*)(int status);

  // Opens the call on this thread. Throws ErrorCode::internal when one is already open here,
  // unsupported when pinned memory cannot be had.
  explicit StreamOrderedCall(std::string_view op);
  ~StreamOrderedCall();
  StreamOrderedCall(const StreamOrderedCall&) = delete;
  StreamOrderedCall& operator=(const StreamOrderedCall&) = delete;

  // The call open on this thread, or nullptr.
  static StreamOrderedCall* current() noexcept;

  // A status word, 0 until a kernel writes it, for a check of `op`: a non-zero value at check()
  // throws `code` with "<op>: <describe(value)>". nullptr when the call's words are all taken.
  int* status_word(std::string op, Describe describe, ErrorCode code = ErrorCode::malformed_message);

  // `ranks` x `per_rank` words, 0 until a kernel writes them, for the all-reduced answers of
  // every rank: word r * per_rank non-zero says a check failed on rank r; the caller gives the
  // other slots their meaning (rank_word). Throws unsupported above kMaxRankWords words.
  int* rank_words(std::size_t ranks, std::size_t per_rank = 1);
  // Slot `slot` of rank `rank` in rank_words, after the completion wait.
  bool rank_word(std::size_t rank, std::size_t slot) const noexcept;

  // Every status word written so far, after the caller's completion wait: marks the call
  // finished, then throws for this rank's first non-zero word, or else (ErrorCode::
  // malformed_message) when rank_words name other ranks whose checks failed.
  void complete_and_check(int rank);
  // Marks the call finished without looking at its checks: for a caller that discards the
  // whole result (a speculative call whose input turned out not to be reducible).
  void complete_unchecked() noexcept { completed_ = true; }

  // The words taken so far (for write_rank_flags).
  const int* words() const noexcept { return words_; }
  std::size_t words_used() const noexcept { return checks_.size(); }

 private:
  struct Check {
    std::string op;
    Describe describe;
    ErrorCode code;
  };
  int* words_ = nullptr;  // the thread's pinned block: kStatusWords, then kMaxRankWords
  std::vector<Check> checks_;
  std::size_t ranks_ = 0;
  std::size_t per_rank_ = 1;
  bool completed_ = false;
};

// True while a StreamOrderedCall is open on this thread.
inline bool stream_ordered() noexcept { return StreamOrderedCall::current() != nullptr; }

}  // namespace gradzip::kernels::cuda
