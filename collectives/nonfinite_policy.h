// What a call does instead of its compressed reduction when its input could not take it: the
// nonfinite= policy for NaN / Inf on any rank, and the wire-range fallback for values a 16-bit
// wire type would saturate. Both reduce uncompressed (run_uncompressed) or skip, never touching
// error feedback; every rank learned the counts through the call check, so all take one branch.
#pragma once

#include <cstdint>

#include "collectives/call.h"
#include "collectives/call_memory.h"
#include "collectives/communicator_state.h"
#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

// The largest magnitude an input element may have for the spec's 16-bit wire values (fp16 and
// bf16, top-k and random-k with values=fp16) to carry the whole reduction without saturating
// anywhere: the type's largest finite value for an average (every rank's values are divided by
// the rank count first, so every partial sum of them is at most the largest input) and for an
// all-gather (no sums), that over the rank count for a sum (a partial sum of up to P inputs).
// Conservative: a call may fall back although its actual sums would have fitted. 0: the spec
// narrows nothing.
float wire_range_limit(const CompressionSpec& spec, CollectiveKind kind, ReduceOp op, int ranks);

// The nonfinite= policy (compression_spec.h) of a call whose input holds NaN or Inf on some
// rank. call.nonfinite came out of the call check, so it is the same on every rank and every
// rank takes the same branch. Returns false when no rank has non-finite input (the call runs
// as usual); else runs the policy and returns true, or throws (nonfinite=error). No branch
// adds, updates or even registers an error-feedback residual (worker or server side): a NaN
// must never reach one.
bool run_nonfinite_policy(CommunicatorState& state, const Call& call, std::uint32_t step,
                          CollectiveStats& stats);

// The wire-range fallback: a call whose spec narrows values to a 16-bit type (fp16, bf16, or
// top-k / random-k with values=fp16) and whose input holds, on some rank, a finite value that
// the narrowing could saturate somewhere in the reduction (wire_range_limit) runs uncompressed
// in f32, with the true values, instead of returning a silently clipped sum; error feedback
// is left untouched. Returns whether it ran the call.
bool run_wire_range_fallback(CommunicatorState& state, const Call& call, std::uint32_t step,
                             CollectiveStats& stats);

// run_nonfinite_policy, then run_wire_range_fallback: true when one of them ran the call.
bool run_input_policies(CommunicatorState& state, const Call& call, std::uint32_t step,
                        CollectiveStats& stats);

// The input policies of a call whose route is now known: a deferred input check
// (collectives/call.h) is settled first unless the route runs stream-ordered, whose
// completion settles it. True when a policy ran the call.
bool run_input_policies_for_route(CommunicatorState& state, Call& call, const CudaRoute& route,
                                  std::uint32_t step, CollectiveStats& stats);

// Runs the call with the `none` codec and no error feedback (what nonfinite=propagate and the
// wire-range fallback do): the transport's own sum for an all-reduce, the ring for a
// reduce-scatter, the all-gather for an all-gather.
void run_uncompressed(CommunicatorState& state, const Call& call, std::uint32_t step,
                      CollectiveStats& stats);

}  // namespace gradzip::collectives
