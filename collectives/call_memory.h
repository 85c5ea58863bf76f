// Where one call's f32 working values live, how a CUDA tensor's call travels (over NCCL,
// CUDA-aware MPI, or staged through host memory), and the ReduceJob an algorithm receives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "collectives/call.h"
#include "collectives/collective_job.h"
#include "collectives/communicator_state.h"
#include "collectives/device_memory.h"
#include "gradzip/compression_spec.h"
#include "gradzip/tensor_view.h"

namespace gradzip::collectives {

// Where one call's f32 working values live and what moves them. Host tensors: the tensor
// itself (f32) or the state's f32 scratch, over the host transport. CUDA tensors run on device
// memory over NCCL (or CUDA-aware MPI) when cuda_route allows it, else they are staged: copied
// into the state's host staging buffer and then treated as a host tensor.
struct CallMemory {
  Transport* transport = nullptr;
  Device device{};          // cuda: data is device memory (NCCL or CUDA-aware MPI)
  std::span<float> data;    // the f32 values the algorithm works on
  TensorView host;          // host paths: the host-side tensor (the user's, or the staging copy)
  // Over NCCL: the call runs stream-ordered (collectives/device_memory.h) and close_call_memory
  // completes it (its one host wait and its device checks).
  std::unique_ptr<OrderedDeviceCall> ordered;
  // A stream-ordered call that runs before its input is checked (collectives/call.h): the
  // check its completion reads.
  std::shared_ptr<DeferredInput> deferred_input;
};

// How a CUDA tensor's call travels.
struct CudaRoute {
  enum class Kind { nccl, cuda_aware_mpi, staged } kind = Kind::staged;
  std::string why_staged;  // for Kind::staged: the reason, for the stats' note
};

// The route of a CUDA call whose algorithm is `algorithm` under `spec` (nullopt: a path without
// a row in the algorithm table, i.e. the transport's own uncompressed sum or the all-gather
// collective): on device memory over NCCL when the build has it, else over the host transport
// when MPI is CUDA-aware, else staged; the paths whose algorithm row says they run on host
// memory (random-k's shared-index path with `shared_index`, hier, rhd, tree) and cuda_path
// staged are always staged. The same on every rank: the call check has compared everything that
// decides it (spec, count, step, cuda_path; the build and MPI library are the same everywhere).
// cuda_path nccl in a build without NCCL throws unsupported.
CudaRoute cuda_route(const CommunicatorState& state, const CompressionSpec& spec,
                     std::optional<Algorithm> algorithm, bool shared_index = false);

// True when a call on `tensor` over `route` runs stream-ordered (OrderedDeviceCall): a CUDA
// tensor over NCCL, whose transport orders its work with CUDA streams.
bool runs_stream_ordered(CommunicatorState& state, const TensorView& tensor, const CudaRoute& route);

// cuda_route for CUDA tensors; the default (unused) route for host tensors.
CudaRoute route_of(const CommunicatorState& state, const TensorView& tensor,
                   const CompressionSpec& spec, std::optional<Algorithm> algorithm,
                   bool shared_index = false);

// Prepares elements [begin, end) of the call's tensor (the rest is left for the algorithm to
// overwrite). For CUDA tensors `route` (cuda_route) picks the path; every path of a CUDA
// tensor says in the stats' note which it took. A stream-ordered call whose input check is
// deferred (Call::deferred_input; settle_input_check has run for other routes) queues the
// check first and opens the residuals' journal (collectives/call.h).
CallMemory open_call_memory(CommunicatorState& state, const Call& call, std::size_t begin,
                            std::size_t end, const CudaRoute& route, CollectiveStats& stats);

// Elements [begin, end) of the f32 result into the tensor: rounded to nearest even for f16 /
// bf16 (nothing to do for f32, which the algorithm wrote in place), and copied back to the
// device for a staged CUDA tensor. A stream-ordered call is completed here (every rank calls
// this at the same point): it throws for a failed device check, on every rank; or, when its
// deferred input check flagged some rank's input, sets DeferredInput::flagged instead (the
// caller's end_speculation undoes the call).
void close_call_memory(const CallMemory& memory, const TensorView& tensor, std::size_t begin,
                       std::size_t end);

// ReduceOp::average: every contribution is divided by the rank count before it is encoded or
// summed (reduced-precision sums of undivided gradients overflow at scale). The device path
// divides with the same IEEE division.
void divide_for_average(const CallMemory& memory, ReduceOp op);

// The job an algorithm receives: the call memory's transport, data and device; residuals keyed
// by `residual_key` (the algorithms register them, each with the sizes it needs) under this
// call's ef_resize policy; random streams of random_stream_of(spec.seed, name) at `step`.
ReduceJob make_job(CommunicatorState& state, const CompressionSpec& spec, const CallMemory& memory,
                   std::string residual_key, std::string_view name, std::uint32_t step,
                   CollectiveStats& stats);

}  // namespace gradzip::collectives
