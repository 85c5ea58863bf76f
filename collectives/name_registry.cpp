// NameRegistry (collectives/name_registry.h).
#include "collectives/name_registry.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gradzip/error.h"

namespace gradzip::collectives {

NameRegistry::NameRegistry(error_feedback::ResidualStore& residuals, std::uint64_t release_window,
                           int rank)
    : residuals_(residuals), release_window_(release_window), rank_(rank) {}

std::uint32_t NameRegistry::call_number_of(std::string_view name) const {
  const auto found = call_numbers_.find(name);
  return found == call_numbers_.end() ? 0 : found->second.call_number;
}

void NameRegistry::count_call(std::string_view name) {
  auto found = call_numbers_.find(name);
  if (found == call_numbers_.end()) found = call_numbers_.emplace(std::string(name), NameUse{}).first;
  ++found->second.call_number;
  found->second.last_use = calls_started_ - 1;  // the call start_call opened
}

void NameRegistry::start_call() {
  const std::uint64_t call = calls_started_++;
  if (release_window_ != 0 && call != 0 && call % release_window_ == 0) {
    // The window [call - N, call) just ended: forget what it did not use.
    const std::uint64_t oldest_kept = call - release_window_;
    std::vector<std::string> released;
    residuals_.release_unused_before(oldest_kept, &released);
    released_residuals_ += released.size();
    if (!released.empty() && !warned_release_) {
      // Once per communicator: a name that comes back starts error feedback anew, which is
      // right for a tensor that is gone but wrong for one only paused (say, by a long
      // evaluation loop of other all-reduces), so the first release is said aloud.
      warned_release_ = true;
      std::string names;
      for (std::size_t i = 0; i < released.size() && i < 5; ++i)
        names += detail::concat(i == 0 ? "" : ", ", "'", released[i], "'");
      if (released.size() > 5) names += detail::concat(" and ", released.size() - 5, " more");
      std::fprintf(stderr,
                   "gradzip: warning: released the error-feedback residuals of %s (rank %d): no "
                   "call used them for %llu calls of this communicator "
                   "(CommunicatorOptions::release_unused_after_calls); such a name that comes "
                   "back starts with zero residuals. Set release_unused_after_calls = 0 to keep "
                   "every residual. (Said once per communicator.)\n",
                   names.c_str(), rank_, static_cast<unsigned long long>(release_window_));
    }
    std::erase_if(call_numbers_, [&](const auto& entry) { return entry.second.last_use < oldest_kept; });
    stream_claims_.release_unused_before(oldest_kept);
  }
  residuals_.set_use_clock(call);
}

std::optional<std::string> NameRegistry::claim_random_stream(std::uint64_t seed,
                                                            std::string_view name) {
  return stream_claims_.claim(seed, name, calls_started_);
}

std::map<std::string, std::uint32_t, std::less<>> NameRegistry::call_numbers() const {
  std::map<std::string, std::uint32_t, std::less<>> numbers;
  for (const auto& [name, use] : call_numbers_)
    numbers.emplace_hint(numbers.end(), name, use.call_number);
  return numbers;
}

void NameRegistry::replace_call_numbers(
    const std::map<std::string, std::uint32_t, std::less<>>& numbers) {
  call_numbers_.clear();
  const std::uint64_t now = calls_started_ == 0 ? 0 : calls_started_ - 1;
  for (const auto& [name, call_number] : numbers)
    call_numbers_.emplace_hint(call_numbers_.end(), name, NameUse{call_number, now});
}

}  // namespace gradzip::collectives
