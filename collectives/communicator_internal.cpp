#include "collectives/communicator_internal.h"

#include <cstdlib>
#include <set>
#include <utility>

#include "collectives/algorithm_choice.h"
#include "collectives/algorithm_table.h"
#include "collectives/codec_table.h"
#include "collectives/communicator_state.h"

namespace gradzip::collectives {

std::vector<Communicator> make_lane_communicators(Communicator& user, int count,
                                                  std::span<const CompressionSpec* const> specs,
                                                  std::string_view who) {
  GZ_REQUIRE(count >= 1, ErrorCode::invalid_argument, who, ": ", count,
             " lanes (at least one is needed)");
  CommunicatorState& user_state = state_of(user);
  Transport& transport = user_state.transport();
  GZ_REQUIRE(count == 1 || transport.concurrent_use_supported(), ErrorCode::unsupported, who, ": ",
             count, " lanes drive MPI from ", count,
             " threads at once, which needs MPI_THREAD_MULTIPLE; MPI was initialised with less "
             "(initialise it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or use lanes = 1)");
  // algo=auto's link and the node structures the specs ask for, measured once on `user`.
  bool any_auto = false;
  std::set<std::uint32_t> node_sizes;
  for (const CompressionSpec* spec : specs) {
    if (!spec_uses_model(*spec)) continue;
    any_auto = true;
    if (may_form_nodes(transport.size(), spec->ranks_per_node)) node_sizes.insert(spec->ranks_per_node);
  }
  const bool measure = any_auto && transport.size() > 1;
  if (measure) {
    user_state.auto_model().link();
    for (std::uint32_t ranks_per_node : node_sizes) user_state.auto_model().hierarchy(ranks_per_node);
  }

  std::vector<Communicator> lanes;
  lanes.reserve(static_cast<std::size_t>(count));
  for (int l = 0; l < count; ++l) {
    // A duplicate per lane (collective: every rank makes its lanes in the same order).
    std::unique_ptr<Transport> duplicate = transport.split(0, transport.rank());
    duplicate->set_idle_waits(true);
    CommunicatorOptions options;
    options.cuda_path = user_state.transports().cuda_path();
    // A lane's names are fixed for its owner's life and all used every step; their state goes
    // with it.
    options.release_unused_after_calls = 0;
    // The user communicator's deadline and timeout action (the split inherits them too).
    const DeadlinePolicy& policy = user_state.transports().deadline_policy();
    options.timeout_seconds = policy.seconds;
    options.on_timeout = policy.action;
    lanes.push_back(make_communicator(std::move(duplicate), options));
    CommunicatorState& lane = state_of(lanes.back());
    if (const std::optional<LinkModel>& link = user_state.auto_model().known_link())
      lane.auto_model().set_link(*link);
    if (measure)
      for (std::uint32_t ranks_per_node : node_sizes)
        lane.auto_model().set_hierarchy(ranks_per_node, user_state.auto_model().hierarchy(ranks_per_node));
  }
  return lanes;
}

std::vector<std::uint64_t> allgather_u64(Communicator& communicator,
                                         std::span<const std::uint64_t> mine) {
  Transport& transport = state_of(communicator).transport();
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(transport.size()));
  transport.allgather_u64(mine, all);
  return all;
}

bool sent_uncompressed(const CompressionSpec& spec, std::size_t count) {
  if (!codec_row(spec.codec).element_codec) return false;
  return choose_allreduce(spec, count, spec.warmup).path == AllreducePath::transport_sum;
}

bool ran_transport_sum(const CollectiveStats& stats) { return stats.algorithm == kTransportSumName; }

std::string transport_description(Communicator& communicator) {
  return state_of(communicator).transport().describe();
}

const DeadlinePolicy& deadline_policy_of(Communicator& communicator) {
  return state_of(communicator).transports().deadline_policy();
}

[[noreturn]] void abort_job(Communicator& communicator) {
  state_of(communicator).transport().abort_job();
  // Transport::abort_job is [[noreturn]], which a compiler does not assume of a virtual call.
  std::abort();
}

error_feedback::ResidualStore& residuals_of(Communicator& communicator) {
  return state_of(communicator).residuals();
}

void claim_random_stream(Communicator& communicator, std::uint64_t seed, std::string_view name,
                         std::string_view who) {
  if (const std::optional<std::string> other = state_of(communicator).names().claim_random_stream(seed, name)) {
    GZ_THROW(ErrorCode::invalid_argument, who, ": ", stream_conflict(seed, name, *other));
  }
}

AutoModelInputs auto_model_inputs(Communicator& communicator) {
  return state_of(communicator).auto_model().inputs();
}

void adopt_auto_model_inputs(Communicator& communicator, const AutoModelInputs& inputs) {
  state_of(communicator).auto_model().adopt(inputs);
}

void prepare_device_transport(Communicator& communicator, int device) {
  state_of(communicator).transports().prepare_device_transport(device);
}

CollectiveStats allreduce_at_step(Communicator& communicator, TensorView tensor,
                                  std::string_view name, const CompressionSpec& spec, ReduceOp op,
                                  std::uint32_t step, const Error* preset_error) {
  return allreduce_at_step(state_of(communicator), tensor, name, spec, op, step, preset_error);
}

CollectiveStats allreduce_keyed_by_step(Communicator& communicator, TensorView tensor,
                                        std::string_view name, const CompressionSpec& spec,
                                        ReduceOp op, std::uint32_t step) {
  return allreduce_keyed_by_step(state_of(communicator), tensor, name, spec, op, step);
}

CollectiveStats reduce_scatter_keyed_by_step(Communicator& communicator, TensorView tensor,
                                             std::string_view name, const CompressionSpec& spec,
                                             ReduceOp op, std::uint32_t step) {
  return reduce_scatter_keyed_by_step(state_of(communicator), tensor, name, spec, op, step);
}

}  // namespace gradzip::collectives
