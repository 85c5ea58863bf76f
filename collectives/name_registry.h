// The names one Communicator's calls use (internal to collectives/): each name's call number
// (the step its next call encodes at), the count of calls started, the random streams the
// names hold, and the release of what belongs to names no call used for a window of calls (their
// call numbers, streams and, in the residual store given at construction, residuals).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "collectives/random_streams.h"
#include "error_feedback/residual_store.h"

namespace gradzip::collectives {

class NameRegistry {
 public:
  // release_window: CommunicatorOptions::release_unused_after_calls (0: keep everything);
  // rank: this rank, for the release's warning. `residuals` must outlive the registry.
  NameRegistry(error_feedback::ResidualStore& residuals, std::uint64_t release_window, int rank);

  // How many calls with this name passed the call check so far: the call number of the next
  // one, which Communicator calls use as EncodeContext::step (allreduce_at_step passes its
  // own). Counted per name across allreduce, reduce_scatter and allgather; wraps at 2^32.
  std::uint32_t call_number_of(std::string_view name) const;
  void count_call(std::string_view name);

  // Opens call number calls_started() (every collective, on every rank, in the same order):
  // at the end of each window of release_window calls, releases the residuals, call numbers
  // and random streams of the names no call used in that window, then stamps this call's uses
  // with its number.
  void start_call();
  std::uint64_t calls_started() const noexcept { return calls_started_; }
  // Records that `name` draws from random_stream_of(seed, name) (at the current call, for the
  // release window) and returns nothing; or, when a different name in use in this process holds
  // that stream's key (their random numbers would coincide), returns that name and records
  // nothing (collectives/random_streams.h). The claim is process-wide, so ranks may decide
  // differently; callers report the refusal as this rank's argument error, which the call
  // check turns into an error on every rank.
  std::optional<std::string> claim_random_stream(std::uint64_t seed, std::string_view name);

  // Residuals released by start_call so far (the first release also writes one warning to
  // stderr naming them: a name that comes back starts error feedback anew).
  std::uint64_t released_residuals() const noexcept { return released_residuals_; }

  // Every name's call number (for a checkpoint), and their replacement by a checkpoint's: the
  // loaded names count as used by the latest call, so the next window does not release them.
  std::map<std::string, std::uint32_t, std::less<>> call_numbers() const;
  void replace_call_numbers(const std::map<std::string, std::uint32_t, std::less<>>& numbers);

 private:
  struct NameUse {
    std::uint32_t call_number = 0;  // of the name's next call
    std::uint64_t last_use = 0;     // the communicator call that last counted it
  };
  error_feedback::ResidualStore& residuals_;
  std::uint64_t release_window_ = 0;
  int rank_ = 0;
  std::map<std::string, NameUse, std::less<>> call_numbers_;
  RandomStreamClaims stream_claims_;  // the stream keys this communicator's names hold
  std::uint64_t calls_started_ = 0;
  std::uint64_t released_residuals_ = 0;
  bool warned_release_ = false;
};

}  // namespace gradzip::collectives
