// One collective call inside the Communicator, from the user's arguments to the body that
// moves the data: the Call as the user made it, begin_call (argument checks, the non-finite and
// wire-range counts, the call check, the call number), the stats it starts from, and run_call,
// which runs a body between them. collectives/communicator.cpp's run_allreduce,
// run_reduce_scatter and run_allgather are its users.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/call_check.h"
#include "collectives/collective_job.h"
#include "collectives/communicator_state.h"
#include "collectives/device_memory.h"
#include "collectives/spec_cache.h"
#include "collectives/timeline.h"
#include "collectives/transport/deadline.h"
#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

// The input check of a call on a CUDA tensor that does not wait for it. Counting the
// non-finite input (and what a 16-bit wire type would saturate) before the call check needs the
// count on the host: one wait for the device per call. Instead, a call that runs stream-ordered
// over NCCL (collectives/device_memory.h, OrderedDeviceCall) counts on the device, keeps a
// device copy of the tensor and journals the residuals it touches (ResidualStore::
// begin_journal), and runs speculatively; its completion tells every rank whether any rank's
// input was flagged. If so, the result is undone (tensor and residuals as passed) and the call
// runs again with the counts exchanged, under the nonfinite= policy or the wire-range fallback,
// exactly as if they had been known up front. A route that is not stream-ordered (staged,
// CUDA-aware MPI) settles the check before it runs (a wait and an exchange of the counts).
// The price of no wait: one device copy of the tensor and of each residual the call touches,
// and device memory for them while the call runs.
struct DeferredInput {
  std::size_t begin = 0;      // the elements counted: the tensor, or an all-gather's own shard
  std::size_t end = 0;
  float wire_limit = 0.0f;    // nonfinite_policy.h's wire_range_limit; 0: nothing to count
  // Set by open_call_memory when the call runs stream-ordered.
  std::unique_ptr<DeferredInputCheck> check;
  // Set by close_call_memory: some rank's input was flagged; the call's result is to be undone.
  bool flagged = false;
};

// One call as the user made it.
struct Call {
  CollectiveKind kind = CollectiveKind::allreduce;
  TensorView tensor;
  std::string_view name;
  ReduceOp op = ReduceOp::sum;
  std::optional<CompressionSpec> spec;  // empty when the spec text did not parse
  std::string spec_text;                // canonical when it parsed, else as given
  std::optional<Error> error;           // this rank's first argument error
  // The step given by the caller (allreduce_at_step); empty: the name's call number.
  std::optional<std::uint32_t> explicit_step;
  // Set by begin_call: the ranks whose input holds NaN or Inf (the same on every rank).
  std::vector<NonfiniteInput> nonfinite;
  // Set by begin_call: counting the non-finite input of a CUDA tensor waited for the thread's
  // work stream, so the work queued before the call is done (open_call_memory skips its wait).
  bool device_work_finished = false;
  // Set by begin_call: the input elements, summed over ranks, beyond what the spec's 16-bit
  // wire type carries through the reduction (wire_range_limit); > 0 runs the call uncompressed.
  std::uint64_t beyond_wire_range = 0;
  // Set by begin_call instead of the two counts above for a CUDA tensor that may run
  // stream-ordered (DeferredInput); cleared once the counts are known on every rank. Shared by
  // the copies of the Call.
  std::shared_ptr<DeferredInput> deferred_input;
};

// A Call of a parsed spec, or of spec text (a parse error is kept in Call::error and thrown by
// begin_call on every rank). `specs` (the Communicator's) parses and prints the spec once per
// text, not once per call.
Call describe_call(CollectiveKind kind, TensorView tensor, std::string_view name, ReduceOp op,
                   const CompressionSpec& spec, SpecCache& specs);
Call describe_call(CollectiveKind kind, TensorView tensor, std::string_view name, ReduceOp op,
                   std::string_view spec_text, SpecCache& specs);

// Checks the arguments, runs the call check with every rank, and counts the call. Returns the
// call's step. Throws on every rank when any rank's arguments are bad or the ranks disagree.
std::uint32_t begin_call(CommunicatorState& state, Call& call);

// After a call's body: a call that ran speculatively (DeferredInput) keeps its residuals'
// changes, or, when its input was flagged on some rank, gets its tensor and residuals back as
// they were, exchanges every rank's counts (Call::nonfinite, beyond_wire_range) and returns
// true: the body is to run again, now under the policies. Every rank returns the same.
bool end_speculation(CommunicatorState& state, Call& call);
// After a body that threw: the residuals' changes are kept, as on any failed call.
void keep_speculation(CommunicatorState& state) noexcept;

// A call whose input check is still deferred, about to run on `route` that is not
// stream-ordered: reads this rank's counts (a wait) and exchanges them with every rank, so that
// Call::nonfinite and beyond_wire_range hold what begin_call would have set. Nothing when the
// check is not deferred or the route is stream-ordered.
void settle_input_check(CommunicatorState& state, Call& call, bool stream_ordered_route);

// The stats every call starts from: its spec, count and rank count.
CollectiveStats start_stats(const Call& call, const Transport& transport);

// The spec of a warm-up call: no compression, no error feedback.
CompressionSpec warmup_spec(const CompressionSpec& spec);

// While the thread records a timeline (collectives/timeline.h): records one call as a span
// "<kind> <name>" (category "call") from construction to destruction, with the stats as args
// (spec, algorithm, count, ranks, step, bytes by kind; "failed": true when left by an exception).
class CallSpan {
 public:
  CallSpan(const Call& call, const CollectiveStats& stats);
  ~CallSpan();
  CallSpan(const CallSpan&) = delete;
  CallSpan& operator=(const CallSpan&) = delete;
  void set_step(std::uint32_t step) noexcept { step_ = step; }

 private:
  const Call& call_;
  const CollectiveStats& stats_;
  ThreadTimeline timeline_;
  TimelineClock::time_point begin_{};  // set only while recording
  int exceptions_at_begin_ = 0;
  std::optional<std::uint32_t> step_;
};

// Runs one call: the stats header, the call check (which gives the step), then
// body(step, stats), all timed as the call's total.
template <typename Body>
CollectiveStats run_call(CommunicatorState& state, Call& call, Body&& body) {
  CollectiveStats stats = start_stats(call, state.transport());
  CallSpan span(call, stats);
  // What a timeout report names (collectives/transport/deadline.h): this call, its step and its
  // number among the communicator's calls (begin_call's start_call opens calls_started() + 1).
  const OperationScope operation(CurrentOperation{
      collective_kind_name(call.kind), call.name,
      call.explicit_step ? *call.explicit_step : state.names().call_number_of(call.name),
      state.names().calls_started() + 1, "the call check"});
  {
    StageTimer total(stats, Stage::total);
    const std::uint32_t step = begin_call(state, call);
    span.set_step(step);
    set_operation_phase("the data exchange");
    try {
      body(step, stats);
    } catch (...) {
      keep_speculation(state);
      throw;
    }
    if (end_speculation(state, call)) {
      // Undone: the input was flagged on some rank, and its counts are now known everywhere.
      stats = start_stats(call, state.transport());
      body(step, stats);
    }
  }
  return stats;
}

// The spec a reduce-scatter / all-gather runs with: the call's, or uncompressed in warm-up.
CompressionSpec sharded_spec(const ShardedChoice& choice, const CompressionSpec& spec,
                             CollectiveStats& stats);

}  // namespace gradzip::collectives
