#include "collectives/transport/deadline.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "collectives/transport/transport.h"
#include "gradzip/error.h"
#include "kernels/tunables.h"

namespace gradzip::collectives {
namespace {

thread_local const CurrentOperation* current = nullptr;
std::atomic<bool> timed_out{false};

}  // namespace

double parse_timeout_seconds(std::string_view text, std::string_view source) {
  const std::optional<double> seconds = kernels::parse_finite_number(text);
  GZ_REQUIRE(seconds && *seconds > 0, ErrorCode::invalid_argument, source, "='", text,
             "' is not a timeout: expected a finite number of seconds > 0 (fractional allowed, "
             "e.g. 600 or 2.5)");
  return *seconds;
}

DeadlinePolicy resolve_deadline_policy(const CommunicatorOptions& options) {
  DeadlinePolicy policy;
  policy.action = options.on_timeout;
  // Presence is asked of the environment directly: kernels/tunables.h reports values only.
  if (std::getenv("GRADZIP_TIMEOUT_S") != nullptr) {
    policy.seconds = parse_timeout_seconds(kernels::tunable_value("GRADZIP_TIMEOUT_S"),
                                           "GRADZIP_TIMEOUT_S");
    return policy;
  }
  GZ_REQUIRE(std::isfinite(options.timeout_seconds), ErrorCode::invalid_argument,
             "CommunicatorOptions::timeout_seconds = ", options.timeout_seconds,
             " (expected a finite number of seconds; <= 0 for the default)");
  if (options.timeout_seconds > 0) policy.seconds = options.timeout_seconds;
  return policy;
}

double timeout_grace_seconds(const DeadlinePolicy& policy) noexcept {
  return std::min(0.05 * policy.seconds, 5.0);
}

OperationScope::OperationScope(const CurrentOperation& operation) noexcept
    : operation_(operation), previous_(current) {
  current = &operation_;
}

OperationScope::~OperationScope() { current = previous_; }

void set_operation_phase(const char* phase) noexcept {
  if (current != nullptr) const_cast<CurrentOperation*>(current)->phase = phase;
}

const CurrentOperation* current_operation() noexcept { return current; }

std::string describe_current_operation() {
  if (current == nullptr) return "no gradzip call (the transport was used directly)";
  return detail::concat(current->kind, " '", current->name, "' (step ", current->step, ", call ",
                        current->sequence, " of its communicator)",
                        *current->phase != '\0' ? ", in " : "", current->phase);
}

void note_timeout() noexcept { timed_out.store(true); }
bool timed_out_anywhere() noexcept { return timed_out.load(); }

void Transport::abort_job() noexcept { std::abort(); }

void Transport::begin_stream_order(void* /*work_stream*/) {
  GZ_THROW(ErrorCode::unsupported, "begin_stream_order (", describe(),
           "): this transport does not order its work with CUDA streams");
}

void Transport::wait_for_stream(std::string_view op) {
  GZ_THROW(ErrorCode::unsupported, op, " (", describe(),
           "): this transport does not order its work with CUDA streams");
}

void write_timeout_report(const std::string& report) noexcept {
  const char* data = report.data();
  std::size_t left = report.size();
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    data += written;
    left -= static_cast<std::size_t>(written);
  }
}

}  // namespace gradzip::collectives
