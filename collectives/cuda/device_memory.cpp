// CUDA memory for the collectives (collectives/device_memory.h).
#include "collectives/device_memory.h"

#include "kernels/device_api.h"

#include <cstdint>
#include <optional>

#include "collectives/transport/transport.h"
#include "gradzip/error.h"
#include "kernels/cpu/nonfinite_cpu.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/nonfinite_cuda.h"
#include "kernels/cuda/runtime_support.h"
#include "kernels/cuda/scale_cuda.h"
#include "kernels/cuda/small_bytes_cuda.h"
#include "kernels/cuda/stream_ordered_call.h"

namespace gradzip::collectives {
namespace {

using kernels::cuda::check_runtime;
using kernels::cuda::CurrentDevice;

// The thread's work stream (the legacy default stream unless a Reducer lane set its own).
cudaStream_t work_stream() noexcept {
  return static_cast<cudaStream_t>(kernels::cuda::thread_work_stream());
}

void synchronize(std::string_view op, const char* what) {
  kernels::cuda::synchronize_stream(work_stream(), op, what);
}

// The end of device-only work (copies and conversions on the device): done when the function
// returns, except in a stream-ordered call (kernels/cuda/stream_ordered_call.h), whose
// completion waits for it.
void finish(std::string_view op, const char* what) {
  if (!kernels::cuda::stream_ordered()) synchronize(op, what);
}

// For destructors: runs `release` with `device` current and restores the caller's device,
// throwing nothing (a failing CUDA call leaves the resource to the process's end).
template <typename Release>
void release_on(int device, Release release) noexcept {
  const kernels::cuda::CurrentCudaDevice current(device);
  release();
}

void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind, int device,
          std::string_view op) {
  if (bytes == 0) return;
  const CurrentDevice current(device, op);
  check_runtime(cudaMemcpyAsync(to, from, bytes, kind, work_stream()), op,
                kind == cudaMemcpyDeviceToHost   ? "a copy to host memory"
                : kind == cudaMemcpyHostToDevice ? "a copy to the device"
                                                 : "a device-to-device copy");
  // A copy between host and device always completes here (the host reads or reuses its side).
  if (kind == cudaMemcpyDeviceToDevice) finish(op, "the copy");
  else synchronize(op, "the copy");
}

}  // namespace

bool device_memory_built() noexcept { return true; }

void copy_device_to_host(void* host, const void* device_data, std::size_t bytes, int device,
                         std::string_view op) {
  copy(host, device_data, bytes, cudaMemcpyDeviceToHost, device, op);
}

void copy_host_to_device(void* device_data, const void* host, std::size_t bytes, int device,
                         std::string_view op) {
  copy(device_data, host, bytes, cudaMemcpyHostToDevice, device, op);
}

void finish_queued_work(int device, std::string_view op) {
  const CurrentDevice current(device, op);
  synchronize(op, "the work queued before the call");
}

void zero_on_device(void* device_data, std::size_t bytes, int device) {
  if (bytes == 0) return;
  const CurrentDevice current(device, "zero_on_device");
  check_runtime(cudaMemsetAsync(device_data, 0, bytes, work_stream()), "zero_on_device", "cudaMemsetAsync");
  finish("zero_on_device", "the memset");
}

void copy_on_device(void* to, const void* from, std::size_t bytes, int device) {
  copy(to, from, bytes, cudaMemcpyDeviceToDevice, device, "copy_on_device");
}

void require_device_pointer(const void* pointer, int device, std::string_view op,
                            std::string_view what) {
  kernels::cuda::require_device_pointer(pointer, device, op, what);
}

void widen_on_device(const TensorView& tensor, std::size_t begin, std::size_t end, float* d_f32) {
  if (end <= begin) return;
  const CurrentDevice current(tensor.device.index, "widen_on_device");
  const std::size_t count = end - begin;
  if (tensor.dtype == DType::f32) {
    copy(d_f32 + begin, static_cast<const float*>(tensor.data) + begin, count * sizeof(float),
         cudaMemcpyDeviceToDevice, tensor.device.index, "widen_on_device");
    return;
  }
  const auto* half = static_cast<const std::uint16_t*>(tensor.data) + begin;
  if (tensor.dtype == DType::f16) kernels::cuda::f16_to_f32(half, d_f32 + begin, count, work_stream());
  else kernels::cuda::bf16_to_f32(half, d_f32 + begin, count, work_stream());
  finish("widen_on_device", "the conversion");
}

void narrow_on_device(const float* d_f32, std::size_t begin, std::size_t end, const TensorView& tensor,
                      Narrowing narrowing) {
  if (end <= begin) return;
  const CurrentDevice current(tensor.device.index, "narrow_on_device");
  const std::size_t count = end - begin;
  if (tensor.dtype == DType::f32) {
    copy(static_cast<float*>(tensor.data) + begin, d_f32 + begin, count * sizeof(float),
         cudaMemcpyDeviceToDevice, tensor.device.index, "narrow_on_device");
    return;
  }
  auto* half = static_cast<std::uint16_t*>(tensor.data) + begin;
  const bool ieee = narrowing == Narrowing::ieee;
  if (tensor.dtype == DType::f16) {
    if (ieee) kernels::cuda::f32_to_f16_ieee(d_f32 + begin, half, count, work_stream());
    else kernels::cuda::f32_to_f16(d_f32 + begin, half, count, work_stream());
  } else {
    if (ieee) kernels::cuda::f32_to_bf16_ieee(d_f32 + begin, half, count, work_stream());
    else kernels::cuda::f32_to_bf16(d_f32 + begin, half, count, work_stream());
  }
  finish("narrow_on_device", "the conversion");
}

NonfiniteOnDevice count_nonfinite_on_device(const TensorView& tensor, std::size_t begin,
                                            std::size_t end, float wire_limit) {
  if (end <= begin) return {};
  const CurrentDevice current(tensor.device.index, "count_nonfinite_on_device");
  const auto* data = static_cast<const std::byte*>(tensor.data) + begin * dtype_size(tensor.dtype);
  const kernels::cuda::DeviceNonfiniteCount found =
      wire_limit > 0.0f
          ? kernels::cuda::count_nonfinite_and_beyond(
                data, end - begin, tensor.dtype,
                kernels::cpu::beyond_threshold_bits(tensor.dtype, wire_limit), work_stream())
          : kernels::cuda::count_nonfinite(data, end - begin, tensor.dtype, work_stream());
  return NonfiniteOnDevice{found.count, found.first, found.beyond, /*work_stream_drained=*/true};
}

void divide_on_device(float* d_data, std::size_t count, float divisor, int device) {
  if (count == 0) return;
  const CurrentDevice current(device, "divide_on_device");
  kernels::cuda::divide_f32(d_data, count, divisor, work_stream());
  finish("divide_on_device", "the division");
}

DeviceStream::DeviceStream(int device, std::string_view op) : device_(device) {
  const CurrentDevice current(device, op);
  cudaStream_t stream = nullptr;
  check_runtime(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), op, "cudaStreamCreateWithFlags");
  stream_ = stream;
}

// cudaStreamDestroy returns at once; CUDA releases the stream when its queued work is done.
DeviceStream::~DeviceStream() {
  release_on(device_, [&] { cudaStreamDestroy(static_cast<cudaStream_t>(stream_)); });
}

ThreadStreamScope::ThreadStreamScope(void* stream) noexcept
    : previous_(kernels::cuda::thread_work_stream()) {
  kernels::cuda::thread_work_stream() = stream;
}

ThreadStreamScope::~ThreadStreamScope() { kernels::cuda::thread_work_stream() = previous_; }

DeviceEvent::DeviceEvent(int device, std::string_view op) : device_(device) {
  const CurrentDevice current(device, op);
  cudaEvent_t event = nullptr;
  check_runtime(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), op, "cudaEventCreate");
  event_ = event;
}

DeviceEvent::~DeviceEvent() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void DeviceEvent::record(void* stream, std::string_view op) {
  const CurrentDevice current(device_, op);
  check_runtime(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
                op, "cudaEventRecord");
}

void DeviceEvent::synchronize(std::string_view op) const {
  kernels::cuda::synchronize_event(static_cast<cudaEvent_t>(event_), op, "cudaEventSynchronize");
}

// From kernels/cuda/device_runtime.h: a block of the thread's cache, or a new stream-ordered
// one (complete when the constructor returns, so any stream may use it). The destructor gives
// it back to the destroying thread's cache; whoever used it on another stream (the NCCL
// transport) has finished by then (a synchronous call), or the work stream has been made to wait
// for that use (a stream-ordered call), so the cache's next user on this thread comes after it.
DeviceAllocation::DeviceAllocation(std::size_t bytes, int device, std::string_view op)
    : bytes_(bytes), device_(device) {
  const CurrentDevice current(device, op);
  data_ = static_cast<std::byte*>(
      kernels::cuda::device_allocate(bytes, device, work_stream(), op, "allocating message buffers"));
}

DeviceAllocation::~DeviceAllocation() {
  kernels::cuda::device_release(data_, bytes_, device_, work_stream());
}

DeferredInputCheck::DeferredInputCheck(const TensorView& tensor, std::size_t begin, std::size_t end,
                                       float wire_limit)
    : tensor_(tensor),
      snapshot_(tensor.size_bytes(), tensor.device.index, "the input check: the tensor's copy"),
      counts_(3 * sizeof(std::uint64_t), tensor.device.index, "the input check: the counts") {
  const char* const op = "the input check of a stream-ordered call";
  const CurrentDevice current(tensor.device.index, op);
  if (tensor.count > 0) copy_on_device(snapshot_.data(), tensor.data, tensor.size_bytes(), tensor.device.index);
  const std::size_t counted = end > begin ? end - begin : 0;
  const auto* data = static_cast<const std::byte*>(tensor.data) + begin * dtype_size(tensor.dtype);
  kernels::cuda::queue_count_nonfinite(
      counted == 0 ? nullptr : data, counted, tensor.dtype, wire_limit > 0.0f,
      wire_limit > 0.0f ? kernels::cpu::beyond_threshold_bits(tensor.dtype, wire_limit) : 0,
      reinterpret_cast<std::uint64_t*>(counts_.data()), work_stream());
}

const std::uint64_t* DeferredInputCheck::device_counts() const noexcept {
  return reinterpret_cast<const std::uint64_t*>(counts_.data());
}

void DeferredInputCheck::restore() const {
  const char* const op = "the input check: restoring the tensor";
  const CurrentDevice current(tensor_.device.index, op);
  if (tensor_.count > 0) copy_on_device(tensor_.data, snapshot_.data(), tensor_.size_bytes(), tensor_.device.index);
  synchronize(op, "the restoring copy");
}

NonfiniteOnDevice DeferredInputCheck::counts() const {
  std::uint64_t words[3] = {0, 0, 0};
  copy_device_to_host(words, counts_.data(), sizeof words, tensor_.device.index,
                      "the input check: reading the counts");
  return NonfiniteOnDevice{words[0], words[0] == 0 ? 0 : words[1], words[2], true};
}

struct OrderedDeviceCall::State {
  explicit State(std::string_view op) : call(op) {}
  kernels::cuda::StreamOrderedCall call;
};

OrderedDeviceCall::OrderedDeviceCall(Transport& transport, int device, std::string_view op)
    : transport_(transport), device_(device) {
  GZ_REQUIRE(transport.orders_with_streams(), ErrorCode::unsupported, op, " (",
             transport.describe(), "): the transport does not order its work with CUDA streams");
  const CurrentDevice current(device, op);
  state_ = std::make_unique<State>(op);
  transport.begin_stream_order(kernels::cuda::thread_work_stream());
}

OrderedDeviceCall::~OrderedDeviceCall() { transport_.end_stream_order(); }

bool OrderedDeviceCall::complete(std::string_view op, const DeferredInputCheck* input) {
  const CurrentDevice current(device_, op);
  kernels::cuda::StreamOrderedCall& call = state_->call;
  const std::size_t ranks = static_cast<std::size_t>(transport_.size());
  // Per rank: [0] any device check failed, and with `input` [1] non-finite input, [2] input
  // beyond the wire range. Each rank writes 1.0 into its own slots only; the sum tells every
  // rank every rank's flags.
  const std::size_t per_rank = input != nullptr ? 3 : 1;
  std::optional<DeviceAllocation> flags;
  if (ranks > 1 || input != nullptr) {
    flags.emplace(ranks * per_rank * sizeof(float), device_, op);
    auto* const d_flags = reinterpret_cast<float*>(flags->data());
    // This rank's flags, the others' slots zeroed, in one launch. A u64 count is non-zero
    // when either of its two 32-bit words is.
    kernels::cuda::FlagWords groups[3] = {{call.words(), call.words_used()}, {}, {}};
    if (input != nullptr) {
      const auto* counts = reinterpret_cast<const int*>(input->device_counts());
      groups[1] = {counts, 2};      // non-finite
      groups[2] = {counts + 4, 2};  // beyond the wire range
    }
    kernels::cuda::write_rank_flags(groups, per_rank, d_flags, ranks * per_rank,
                                    static_cast<std::size_t>(transport_.rank()) * per_rank,
                                    work_stream());
    if (ranks > 1) transport_.allreduce_f32_sum({d_flags, ranks * per_rank});
    kernels::cuda::words_from_flags(d_flags, ranks * per_rank, call.rank_words(ranks, per_rank),
                                    work_stream());
  }
  transport_.wait_for_stream(op);
  if (input != nullptr) {
    for (std::size_t r = 0; r < ranks; ++r) {
      if (call.rank_word(r, 1) || call.rank_word(r, 2)) {
        call.complete_unchecked();
        return true;
      }
    }
  }
  call.complete_and_check(transport_.rank());
  return false;
}

void set_wait_site_counting(bool on) noexcept { kernels::cuda::set_wait_site_counting(on); }

std::vector<std::pair<std::string, std::uint64_t>> device_wait_sites() {
  return kernels::cuda::device_wait_sites();
}

std::vector<std::pair<std::string, std::uint64_t>> wait_sites_between(
    const std::vector<std::pair<std::string, std::uint64_t>>& before,
    const std::vector<std::pair<std::string, std::uint64_t>>& after) {
  return kernels::cuda::wait_sites_between(before, after);
}

DeviceRuntimeCounts device_runtime_counts() noexcept {
  const kernels::cuda::DeviceRuntimeCounters counters = kernels::cuda::device_runtime_counters();
  return DeviceRuntimeCounts{counters.allocations, counters.cache_hits, counters.frees,
                             counters.synchronizations, counters.host_device_bytes};
}

}  // namespace gradzip::collectives
