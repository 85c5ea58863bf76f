// The public Communicator: per call it checks the arguments, runs the call check
// (collectives/call_check.h), makes the f32 working buffer (f16 / bf16 converted, divided by
// the rank count for ReduceOp::average), picks the algorithm (collectives/algorithm_choice.h),
// runs it with this communicator's residual store, writes the result back, and returns the
// stats.
#include "gradzip/communicator.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/algorithm_table.h"
#include "collectives/call.h"
#include "collectives/call_memory.h"
#include "collectives/codec_table.h"
#include "collectives/collective_job.h"
#include "collectives/communicator_state.h"
#include "collectives/job_encoder.h"
#include "collectives/nonfinite_policy.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"

namespace gradzip {
namespace collectives {
namespace {

CollectiveStats run_allreduce(CommunicatorState& state, Call call) {
  return run_call(state, call, [&](std::uint32_t step, CollectiveStats& stats) {
    if (run_input_policies(state, call, step, stats)) return;
    const CompressionSpec& spec = *call.spec;
    const std::size_t count = call.tensor.count;
    // algo=auto's model: its inputs are measured at the first call that needs them (every
    // rank reaches this point in the same call with the same spec, count and step: the call
    // check compared them), then kept, and so is its choice, used here in place (its name and
    // note are copied once, into the stats; nothing in this call changes the cache).
    AllreduceChoice fixed;
    const AllreduceChoice* chosen = nullptr;
    if (!auto_uses_model(spec, count, step, state.transport().size(),
                         call.tensor.device.kind == DeviceKind::cuda)) {
      fixed = choose_allreduce(spec, count, step);
      chosen = &fixed;
    } else {
      chosen = &state.auto_model().choice(spec, call.spec_text, count, step);
    }
    const AllreduceChoice& choice = *chosen;
    stats.algorithm = choice.name;
    stats.note = choice.note;

    std::optional<Algorithm> algorithm;  // nullopt: the transport's own sum
    if (choice.path == AllreducePath::hierarchical) algorithm = Algorithm::hier;
    if (choice.path == AllreducePath::flat) {
      algorithm = choice.algorithm == Algorithm::auto_select ? default_flat_algorithm(spec.codec)
                                                             : choice.algorithm;
    }
    const bool shared_index = choice.path == AllreducePath::flat &&
                              choice.algorithm == Algorithm::auto_select &&
                              codec_row(spec.codec).shared_indices;
    const CudaRoute route = route_of(state, call.tensor, spec, algorithm, shared_index);
    if (run_input_policies_for_route(state, call, route, step, stats)) return;
    const CallMemory memory = open_call_memory(state, call, 0, count, route, stats);
    divide_for_average(memory, call.op);
    if (choice.path == AllreducePath::transport_sum) {
      if (choice.dense_fallback) {
        stats.fallback = true;
        // Nothing is lost: every residual of this tensor (the worker's and those the
        // algorithms' re-encodes keep) goes into the dense sum, and is zero afterwards.
        ReduceJob job = make_job(state, spec, memory, std::string(call.name), call.name, step, stats);
        if (job.residuals != nullptr) {
          job.residuals->fold_into(job.name, count);
          deliver_worker_residual(job, "fallback=dense");
        }
      }
      StageTimer communicate(stats, Stage::communicate);
      memory.transport->allreduce_f32_sum(memory.data);
    } else {
      ReduceJob job = make_job(state, spec, memory, std::string(call.name), call.name, step, stats);
      if (choice.path == AllreducePath::flat) {
        run_flat_allreduce(job, choice.algorithm);
      } else {
        TransportSet::NodeTransports& node = state.transports().node_transports(spec.ranks_per_node);
        hierarchical_allreduce(job, *node.intra, *node.inter, choice.algorithm);
      }
    }
    close_call_memory(memory, call.tensor, 0, count);
  });
}

CollectiveStats run_reduce_scatter(CommunicatorState& state, Call call) {
  return run_call(state, call, [&](std::uint32_t step, CollectiveStats& stats) {
    if (run_input_policies(state, call, step, stats)) return;
    const ShardedChoice choice = choose_reduce_scatter(*call.spec, step);
    const CompressionSpec spec = sharded_spec(choice, *call.spec, stats);
    const std::size_t count = call.tensor.count;
    const CudaRoute route = route_of(state, call.tensor, spec, choice.algorithm);
    if (run_input_policies_for_route(state, call, route, step, stats)) return;
    const CallMemory memory = open_call_memory(state, call, 0, count, route, stats);
    divide_for_average(memory, call.op);
    ReduceJob job = make_job(state, spec, memory, std::string(call.name), call.name, step, stats);
    algorithm_row(*choice.algorithm).run_reduce_scatter(job);
    const Transport& transport = *memory.transport;
    close_call_memory(memory, call.tensor, shard_begin(count, transport.size(), transport.rank()),
                      shard_begin(count, transport.size(), transport.rank() + 1));
  });
}

CollectiveStats run_allgather(CommunicatorState& state, Call call) {
  return run_call(state, call, [&](std::uint32_t step, CollectiveStats& stats) {
    if (run_input_policies(state, call, step, stats)) return;
    Transport& transport = state.transport();
    const ShardedChoice choice = choose_allgather(*call.spec, step);
    const CompressionSpec spec = sharded_spec(choice, *call.spec, stats);
    const std::size_t count = call.tensor.count;
    // Only this rank's shard holds data on entry; the algorithm writes every other shard.
    const CudaRoute route = route_of(state, call.tensor, spec, std::nullopt);
    if (run_input_policies_for_route(state, call, route, step, stats)) return;
    const CallMemory memory = open_call_memory(
        state, call, shard_begin(count, transport.size(), transport.rank()),
        shard_begin(count, transport.size(), transport.rank() + 1), route, stats);
    ReduceJob job = make_job(state, spec, memory, allgather_job_name(call.name), call.name,
                             step, stats);
    compressed_allgather(job);
    close_call_memory(memory, call.tensor, 0, count);
  });
}

}  // namespace

CollectiveStats allreduce_at_step(CommunicatorState& state, TensorView tensor, std::string_view name,
                                  const CompressionSpec& spec, ReduceOp op, std::uint32_t step,
                                  const Error* preset_error) {
  CompressionSpec without_warmup = spec;
  without_warmup.warmup = 0;
  Call call = describe_call(CollectiveKind::allreduce, tensor, name, op, without_warmup,
                            state.specs());
  call.explicit_step = step;
  if (preset_error != nullptr) call.error = *preset_error;
  return run_allreduce(state, std::move(call));
}

CollectiveStats allreduce_keyed_by_step(CommunicatorState& state, TensorView tensor,
                                        std::string_view name, const CompressionSpec& spec,
                                        ReduceOp op, std::uint32_t step) {
  Call call = describe_call(CollectiveKind::allreduce, tensor, name, op, spec, state.specs());
  call.explicit_step = step;
  return run_allreduce(state, std::move(call));
}

CollectiveStats reduce_scatter_keyed_by_step(CommunicatorState& state, TensorView tensor,
                                             std::string_view name, const CompressionSpec& spec,
                                             ReduceOp op, std::uint32_t step) {
  Call call = describe_call(CollectiveKind::reduce_scatter, tensor, name, op, spec,
                            state.specs());
  call.explicit_step = step;
  return run_reduce_scatter(state, std::move(call));
}

}  // namespace collectives

Communicator Communicator::from_nccl(void* nccl_comm, CommunicatorOptions options) {
  // NCCL for every CUDA call: there is no host transport to stage through.
  options.cuda_path = CudaPath::nccl;
  return collectives::make_communicator(collectives::adopt_nccl_communicator(nccl_comm),
                                        std::move(options));
}

std::string CollectiveStats::to_string() const {
  char numbers[160];
  std::snprintf(numbers, sizeof numbers,
                "ratio=%.2f encode=%.3f ms communicate=%.3f ms decode=%.3f ms total=%.3f ms",
                compression_ratio, encode_seconds * 1e3, communicate_seconds * 1e3,
                decode_seconds * 1e3, total_seconds * 1e3);
  std::string line = detail::concat(
      algorithm.empty() ? "?" : algorithm, " '", spec, "' count=", count, " ranks=", ranks,
      " sent=", sent_bytes(), " B (header ", sent_header_bytes, ", index ", sent_index_bytes,
      ", payload ", sent_payload_bytes, ") received=", received_bytes, " B ", numbers);
  if (!note.empty()) line += " (" + note + ")";
  return line;
}

Communicator::Communicator(std::unique_ptr<collectives::CommunicatorState> state)
    : state_(std::move(state)) {
  GZ_REQUIRE(state_ != nullptr, ErrorCode::invalid_argument, "Communicator: null state");
}

Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

int Communicator::rank() const noexcept { return state_->transport().rank(); }
int Communicator::size() const noexcept { return state_->transport().size(); }

CollectiveStats Communicator::allreduce(TensorView tensor, std::string_view name,
                                        const CompressionSpec& spec, ReduceOp op) {
  return collectives::run_allreduce(
      *state_, collectives::describe_call(collectives::CollectiveKind::allreduce, tensor, name, op,
                                          spec, state_->specs()));
}

CollectiveStats Communicator::allreduce(TensorView tensor, std::string_view name,
                                        std::string_view spec, ReduceOp op) {
  return collectives::run_allreduce(
      *state_, collectives::describe_call(collectives::CollectiveKind::allreduce, tensor, name, op,
                                          spec, state_->specs()));
}

CollectiveStats Communicator::allreduce(TensorView tensor, std::string_view name, ReduceOp op) {
  return allreduce(tensor, name, state_->default_spec(), op);
}

CollectiveStats Communicator::reduce_scatter(TensorView tensor, std::string_view name,
                                             const CompressionSpec& spec, ReduceOp op) {
  return collectives::run_reduce_scatter(
      *state_,
      collectives::describe_call(collectives::CollectiveKind::reduce_scatter, tensor, name, op,
                                 spec, state_->specs()));
}

CollectiveStats Communicator::allgather(TensorView tensor, std::string_view name,
                                        const CompressionSpec& spec) {
  return collectives::run_allgather(
      *state_, collectives::describe_call(collectives::CollectiveKind::allgather, tensor, name,
                                          ReduceOp::sum, spec, state_->specs()));
}

std::size_t Communicator::shard_begin(std::size_t count, int r) const noexcept {
  return collectives::shard_begin(count, size(), r);
}

void Communicator::save_residuals(const std::string& path) const { state_->save_checkpoint(path); }

void Communicator::load_residuals(const std::string& path) { state_->load_checkpoint(path); }

const CompressionSpec& Communicator::default_spec() const noexcept {
  return state_->default_spec();
}

}  // namespace gradzip
