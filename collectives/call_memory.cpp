// A call's working memory and CUDA routing (collectives/call_memory.h).
#include "collectives/call_memory.h"

#include <utility>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/codec_table.h"
#include "collectives/device_memory.h"
#include "collectives/random_streams.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"
#include "kernels/cpu/convert.h"

namespace gradzip::collectives {

CudaRoute cuda_route(const CommunicatorState& state, const CompressionSpec& spec,
                     std::optional<Algorithm> algorithm, bool shared_index) {
  const auto staged = [&](std::string why) {
    GZ_REQUIRE(state.transport().device_only() < 0, ErrorCode::unsupported,
               "this communicator was made from an ncclComm_t and has no host transport, but ",
               why);
    return CudaRoute{CudaRoute::Kind::staged, std::move(why)};
  };
  if (state.transports().cuda_path() == CudaPath::staged) return staged("cuda_path is staged");
  GZ_REQUIRE(state.transports().cuda_path() != CudaPath::nccl || nccl_transport_built(), ErrorCode::unsupported,
             "cuda_path is nccl, but this gradzip was built without NCCL");
  if (algorithm) {
    const AlgorithmRow& row =
        shared_index ? algorithm_row(AlgorithmId::randk) : algorithm_row(*algorithm);
    if (!row.host_only_reason.empty()) return staged(std::string(row.host_only_reason));
  }
  if (nccl_transport_built()) {
    // NCCL receives exactly the size the sender sends, and the ring does not exchange sizes.
    if (algorithm && *algorithm == Algorithm::ring && message_size_varies(spec))
      return staged(detail::concat("approximate ", codec_kind_name(spec.codec),
                                   " messages vary in size, which the ring over NCCL cannot receive"));
    return CudaRoute{CudaRoute::Kind::nccl, ""};
  }
  if (state.transports().cuda_path() == CudaPath::automatic &&
      state.transport().moves_device_memory())
    return CudaRoute{CudaRoute::Kind::cuda_aware_mpi, ""};
  return staged("this build has no NCCL and MPI is not CUDA-aware");
}

CallMemory open_call_memory(CommunicatorState& state, const Call& call, std::size_t begin,
                            std::size_t end, const CudaRoute& route, CollectiveStats& stats) {
  const TensorView& tensor = call.tensor;
  CallMemory memory;
  memory.transport = &state.transport();
  memory.host = tensor;
  if (tensor.device.kind == DeviceKind::cuda && route.kind != CudaRoute::Kind::staged) {
    const bool nccl = route.kind == CudaRoute::Kind::nccl;
    if (nccl) memory.transport = &state.transports().nccl_transport(tensor.device.index);
    if (nccl && memory.transport->orders_with_streams()) {
      // Stream-ordered: the transport's stream follows the work stream (the legacy default
      // stream, so earlier work of blocking streams too, as the contract says), no wait.
      memory.ordered = std::make_unique<OrderedDeviceCall>(*memory.transport, tensor.device.index,
                                                           "a collective on a CUDA tensor");
      if (call.deferred_input) {
        // Before anything of the call touches the tensor or a residual.
        DeferredInput& deferred = *call.deferred_input;
        deferred.check = std::make_unique<DeferredInputCheck>(tensor, deferred.begin, deferred.end,
                                                              deferred.wire_limit);
        state.residuals().begin_journal();
        memory.deferred_input = call.deferred_input;
      }
    } else if (!call.device_work_finished) {
      // The transport may read the tensor from a stream of its own: the work that produced it
      // (earlier work of blocking streams, as the contract says) must be done first. Counting
      // the non-finite input already waited for it, with nothing queued since; then one wait
      // is enough.
      finish_queued_work(tensor.device.index, "a collective on a CUDA tensor");
    }
    memory.device = tensor.device;
    stats.note += detail::concat(stats.note.empty() ? "" : "; ",
                                 nccl ? "over NCCL" : "over CUDA-aware MPI");
    float* const data = tensor.dtype == DType::f32
                            ? static_cast<float*>(tensor.data)
                            : state.scratch().device_f32(tensor.device.index, tensor.count);
    if (tensor.dtype != DType::f32) widen_on_device(tensor, begin, end, data);
    memory.data = {data, tensor.count};
    return memory;
  }
  if (tensor.device.kind == DeviceKind::cuda) {
    const std::size_t element = dtype_size(tensor.dtype);
    std::vector<std::byte>& staging = state.scratch().host_staging();
    if (staging.size() < tensor.size_bytes()) staging.resize(tensor.size_bytes());
    if (end > begin) {
      copy_device_to_host(staging.data() + begin * element,
                          static_cast<const std::byte*>(tensor.data) + begin * element,
                          (end - begin) * element, tensor.device.index, "staging a CUDA tensor");
    }
    stats.note += detail::concat(stats.note.empty() ? "" : "; ", "staged through host memory (",
                                 route.why_staged, ")");
    memory.host = TensorView{staging.data(), tensor.count, tensor.dtype, Device{}};
  }
  if (memory.host.dtype == DType::f32) {
    memory.data = {static_cast<float*>(memory.host.data), tensor.count};
    return memory;
  }
  std::vector<float>& scratch = state.scratch().f32();
  if (scratch.size() < tensor.count) scratch.resize(tensor.count);
  if (end > begin) kernels::cpu::load_as_f32(memory.host, begin, end - begin, scratch.data() + begin);
  memory.data = {scratch.data(), tensor.count};
  return memory;
}

void close_call_memory(const CallMemory& memory, const TensorView& tensor, std::size_t begin,
                       std::size_t end) {
  if (memory.device.kind == DeviceKind::cuda) {
    if (end > begin && tensor.dtype != DType::f32)
      narrow_on_device(memory.data.data(), begin, end, tensor);
    if (memory.ordered) {
      DeferredInput* const deferred = memory.deferred_input.get();
      const bool flagged = memory.ordered->complete(
          "a collective on a CUDA tensor", deferred != nullptr ? deferred->check.get() : nullptr);
      if (deferred != nullptr) deferred->flagged = flagged;
    }
    return;
  }
  if (end <= begin) return;
  if (memory.host.dtype != DType::f32)
    kernels::cpu::store_from_f32(memory.data.data() + begin, end - begin, memory.host, begin);
  if (tensor.device.kind == DeviceKind::cuda) {
    const std::size_t element = dtype_size(tensor.dtype);
    copy_host_to_device(static_cast<std::byte*>(tensor.data) + begin * element,
                        static_cast<const std::byte*>(memory.host.data) + begin * element,
                        (end - begin) * element, tensor.device.index, "writing back a CUDA tensor");
  }
}

void divide_for_average(const CallMemory& memory, ReduceOp op) {
  if (op != ReduceOp::average) return;
  const float divisor = static_cast<float>(memory.transport->size());
  if (memory.device.kind == DeviceKind::cuda) {
    divide_on_device(memory.data.data(), memory.data.size(), divisor, memory.device.index);
    return;
  }
  for (float& value : memory.data) value /= divisor;
}

ReduceJob make_job(CommunicatorState& state, const CompressionSpec& spec, const CallMemory& memory,
                   std::string residual_key, std::string_view name, std::uint32_t step,
                   CollectiveStats& stats) {
  error_feedback::ResidualStore* residuals = nullptr;
  if (spec.error_feedback) {
    residuals = &state.residuals();
    residuals->set_resize_policy(spec.ef_resize);
  }
  const RandomStream stream = random_stream_of(spec.seed, name);
  const EncodeContext ctx{stream.key, step, stream.tensor_id, 0};
  ReduceJob job{*memory.transport, state.codecs().codec_for(spec), memory.data, std::move(residual_key),
                residuals, ctx, stats, memory.device};
  job.segment_bytes = spec.segment_bytes;
  job.stream_ordered = memory.ordered != nullptr;
  job.sizes_known = job.stream_ordered && !message_size_varies(spec);
  return job;
}

bool runs_stream_ordered(CommunicatorState& state, const TensorView& tensor, const CudaRoute& route) {
  return tensor.device.kind == DeviceKind::cuda && route.kind == CudaRoute::Kind::nccl &&
         state.transports().nccl_transport(tensor.device.index).orders_with_streams();
}

CudaRoute route_of(const CommunicatorState& state, const TensorView& tensor,
                   const CompressionSpec& spec, std::optional<Algorithm> algorithm,
                   bool shared_index) {
  if (tensor.device.kind != DeviceKind::cuda) return CudaRoute{};
  return cuda_route(state, spec, algorithm, shared_index);
}

}  // namespace gradzip::collectives
