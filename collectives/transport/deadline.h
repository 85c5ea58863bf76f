// Deadlines of blocking waits (docs/reliability.md, "Timeouts instead of hangs"): the policy a
// transport applies to each of its waits and where it comes from (CommunicatorOptions::
// timeout_seconds / on_timeout, GRADZIP_TIMEOUT_S), the calling thread's current operation
// (what a timeout report names), and the process-wide "a wait timed out" flag that makes
// gradzip's atexit skip MPI_Finalize.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gradzip/communicator.h"

namespace gradzip::collectives {

inline constexpr double kDefaultTimeoutSeconds = 600;

struct DeadlinePolicy {
  double seconds = kDefaultTimeoutSeconds;  // finite, > 0: the longest any one wait may take
  TimeoutAction action = TimeoutAction::abort;
};

// `text` as a number of seconds: the whole text must be a finite number > 0 (fractional
// allowed, e.g. "2.5"). Otherwise throws ErrorCode::invalid_argument naming `source` (e.g.
// "GRADZIP_TIMEOUT_S") and the text.
double parse_timeout_seconds(std::string_view text, std::string_view source);

// GRADZIP_TIMEOUT_S when it is set (parsed as above), else options.timeout_seconds when > 0,
// else 600 s; the action is options.on_timeout. A non-finite timeout_seconds throws
// invalid_argument.
DeadlinePolicy resolve_deadline_policy(const CommunicatorOptions& options);

// How long a rank that timed out listens for the other ranks' timeout notices before it
// reports: min(5% of the timeout, 5 s).
double timeout_grace_seconds(const DeadlinePolicy& policy) noexcept;

// The Communicator call the calling thread is in, for timeout reports. Set for the duration of
// one call (collectives/call.h run_call); scopes nest (the inner one is reported).
struct CurrentOperation {
  std::string_view kind;       // "allreduce", "reduce_scatter", "allgather"
  std::string_view name;       // the tensor name (valid for the call)
  std::uint32_t step = 0;      // the name's step
  std::uint64_t sequence = 0;  // the communicator's call sequence number (1 = its first call)
  const char* phase = "";      // e.g. "the call check"; set_operation_phase changes it
};

class OperationScope {
 public:
  explicit OperationScope(const CurrentOperation& operation) noexcept;
  ~OperationScope();
  OperationScope(const OperationScope&) = delete;
  OperationScope& operator=(const OperationScope&) = delete;

 private:
  CurrentOperation operation_;
  const CurrentOperation* previous_;
};

// Changes the phase of the calling thread's innermost operation (no-op outside one).
void set_operation_phase(const char* phase) noexcept;
// The calling thread's innermost operation, or nullptr.
const CurrentOperation* current_operation() noexcept;
// e.g. "allreduce 'layer1.weight' (step 17, call 42 of its communicator), in the call check";
// "no gradzip call (the transport was used directly)" outside one.
std::string describe_current_operation();

// Process-wide: some wait timed out. gradzip's atexit MPI_Finalize and the MPI transports'
// destructors then make no MPI call (they could wait for the operation that never finished).
void note_timeout() noexcept;
bool timed_out_anywhere() noexcept;

// Writes `report` to stderr with one write(2), so that the blocks of different ranks and
// threads do not interleave line by line.
void write_timeout_report(const std::string& report) noexcept;

}  // namespace gradzip::collectives
