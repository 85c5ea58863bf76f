// The non-finite policy and the wire-range fallback (collectives/nonfinite_policy.h).
#include "collectives/nonfinite_policy.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/call_memory.h"
#include "collectives/codec_table.h"
#include "collectives/device_memory.h"
#include "collectives/job_encoder.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

// "1,3": the ranks of `inputs`.
std::string rank_list(const std::vector<NonfiniteInput>& inputs) {
  std::string out;
  for (const NonfiniteInput& input : inputs) out += detail::concat(out.empty() ? "" : ",", input.rank);
  return out;
}

}  // namespace

float wire_range_limit(const CompressionSpec& spec, CollectiveKind kind, ReduceOp op, int ranks) {
  constexpr float kF16Max = 65504.0f;
  constexpr float kBf16Max = 3.38953139e38f;  // 0x7F7F0000
  const DType wire = wire_value_type(spec);
  if (wire == DType::f32) return 0.0f;
  const float type_max = wire == DType::f16 ? kF16Max : kBf16Max;
  const bool sums = kind != CollectiveKind::allgather && op == ReduceOp::sum;
  return sums ? type_max / static_cast<float>(std::max(ranks, 1)) : type_max;
}

bool run_nonfinite_policy(CommunicatorState& state, const Call& call, std::uint32_t step,
                          CollectiveStats& stats) {
  if (call.nonfinite.empty()) return false;
  const CompressionSpec& spec = *call.spec;
  const TensorView& tensor = call.tensor;
  const std::size_t count = tensor.count;
  const std::string ranks = rank_list(call.nonfinite);
  switch (spec.nonfinite) {
    case NonfinitePolicy::error: {
      std::string found;
      for (const NonfiniteInput& input : call.nonfinite) {
        found += detail::concat(found.empty() ? "" : "; ", "rank ", input.rank, ": ", input.count,
                                " non-finite element(s), the first at index ", input.first);
      }
      GZ_THROW(ErrorCode::nonfinite, collective_kind_name(call.kind), " of '", call.name,
               "' on rank ", state.transport().rank(), ": NaN or Inf in the input of rank(s) ",
               ranks, " (", found, "); the spec says nonfinite=error, so nothing was reduced "
               "and the tensor is left as passed");
    }
    case NonfinitePolicy::skip: {
      // Zero bits are +0 in f32, f16 and bf16: the same finite result on every rank.
      if (tensor.device.kind == DeviceKind::cuda) {
        zero_on_device(tensor.data, tensor.size_bytes(), tensor.device.index);
      } else if (count > 0) {
        std::memset(tensor.data, 0, tensor.size_bytes());
      }
      stats.algorithm = "skip";
      stats.skipped = true;
      stats.note = detail::concat("non-finite input on rank(s) ", ranks,
                                  ": skipped (nonfinite=skip), the tensor is zeros on every rank; "
                                  "error feedback untouched");
      return true;
    }
    case NonfinitePolicy::propagate: break;
  }
  // propagate: the raw input, uncompressed, without error feedback, so the NaN / Inf land
  // where a plain all-reduce puts them.
  stats.note = detail::concat("non-finite input on rank(s) ", ranks,
                              ": reduced uncompressed; error feedback untouched");
  run_uncompressed(state, call, step, stats);
  return true;
}

bool run_wire_range_fallback(CommunicatorState& state, const Call& call, std::uint32_t step,
                             CollectiveStats& stats) {
  if (call.beyond_wire_range == 0) return false;
  stats.note = detail::concat(call.beyond_wire_range, " input element(s) beyond what ",
                              call.spec->to_string(), "'s 16-bit values carry through this "
                              "reduction (|x| > ", wire_range_limit(*call.spec, call.kind, call.op,
                              state.transport().size()), "): reduced uncompressed in f32 "
                              "(the true values, not a saturated sum); error feedback untouched");
  run_uncompressed(state, call, step, stats);
  return true;
}

bool run_input_policies(CommunicatorState& state, const Call& call, std::uint32_t step,
                        CollectiveStats& stats) {
  return run_nonfinite_policy(state, call, step, stats) ||
         run_wire_range_fallback(state, call, step, stats);
}

bool run_input_policies_for_route(CommunicatorState& state, Call& call, const CudaRoute& route,
                                  std::uint32_t step, CollectiveStats& stats) {
  if (!call.deferred_input) return false;  // settled by begin_call: the policies ran already
  settle_input_check(state, call, runs_stream_ordered(state, call.tensor, route));
  return !call.deferred_input && run_input_policies(state, call, step, stats);
}

void run_uncompressed(CommunicatorState& state, const Call& call, std::uint32_t step,
                      CollectiveStats& stats) {
  const CompressionSpec& spec = *call.spec;
  const TensorView& tensor = call.tensor;
  const std::size_t count = tensor.count;
  const CompressionSpec dense = warmup_spec(spec);
  const Transport& transport = state.transport();
  switch (call.kind) {
    case CollectiveKind::allreduce: {
      stats.algorithm = kTransportSumName;
      const CallMemory memory = open_call_memory(state, call, 0, count,
                                                 route_of(state, tensor, dense, std::nullopt), stats);
      divide_for_average(memory, call.op);
      {
        StageTimer communicate(stats, Stage::communicate);
        memory.transport->allreduce_f32_sum(memory.data);
      }
      close_call_memory(memory, tensor, 0, count);
      return;
    }
    case CollectiveKind::reduce_scatter: {
      stats.algorithm = algorithm_name(Algorithm::ring);
      const CallMemory memory = open_call_memory(
          state, call, 0, count, route_of(state, tensor, dense, Algorithm::ring), stats);
      divide_for_average(memory, call.op);
      ReduceJob job = make_job(state, dense, memory, std::string(call.name), call.name, step, stats);
      ring_reduce_scatter(job);
      const Transport& moved_by = *memory.transport;
      close_call_memory(memory, tensor, shard_begin(count, moved_by.size(), moved_by.rank()),
                        shard_begin(count, moved_by.size(), moved_by.rank() + 1));
      return;
    }
    case CollectiveKind::allgather: {
      stats.algorithm = "allgather";
      const CallMemory memory = open_call_memory(
          state, call, shard_begin(count, transport.size(), transport.rank()),
          shard_begin(count, transport.size(), transport.rank() + 1),
          route_of(state, tensor, dense, std::nullopt), stats);
      ReduceJob job = make_job(state, dense, memory, allgather_job_name(call.name), call.name,
                               step, stats);
      compressed_allgather(job);
      close_call_memory(memory, tensor, 0, count);
      return;
    }
  }
}

}  // namespace gradzip::collectives
