// CUDA memory as the collectives need it (internal): copies between a CUDA tensor and host
// memory (the staged path of CUDA tensors over a host transport) and device allocations (the
// message buffers of algorithms that run on device memory over NCCL). A build with CUDA
// implements these in collectives/cuda/device_memory.cpp; a build without it links
// collectives/no_cuda/device_memory.cpp, whose functions throw ErrorCode::unsupported.
//
// Every copy runs on the thread's work stream (the legacy default stream of `device` unless a
// Reducer lane set its own, so it follows all earlier work of blocking streams on that device)
// and restores the caller's current device. Copies between host and device memory are
// synchronous; copies, conversions and fills on the device are too, except inside an
// OrderedDeviceCall (below), where they stay queued until its completion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradzip/tensor_view.h"

namespace gradzip::collectives {

// True in builds with CUDA.
bool device_memory_built() noexcept;

// host[0, bytes) = device_data[0, bytes); device_data is memory of CUDA device `device`.
// `op` names the caller in errors.
void copy_device_to_host(void* host, const void* device_data, std::size_t bytes, int device,
                         std::string_view op);
// device_data[0, bytes) = host[0, bytes).
void copy_host_to_device(void* device_data, const void* host, std::size_t bytes, int device,
                         std::string_view op);

// Waits until the thread's work stream of `device` has finished what was queued on it: with the
// legacy default stream (the default), all earlier work of the device's blocking streams, so a
// transport with a stream of its own (NCCL) then reads the application's finished data.
void finish_queued_work(int device, std::string_view op);

// device_data[0, bytes) = 0 (so f32 arrays become +0.0f).
void zero_on_device(void* device_data, std::size_t bytes, int device);
// to[0, bytes) = from[0, bytes), both memory of `device` (they may not overlap).
void copy_on_device(void* to, const void* from, std::size_t bytes, int device);

// Throws invalid_argument naming `op` and `what` unless `pointer` is device (or managed)
// memory usable on `device`.
void require_device_pointer(const void* pointer, int device, std::string_view op,
                            std::string_view what);

// The f32 working copy of a CUDA tensor on its device, for collectives that run on device
// memory: elements [begin, end) of `tensor` (f16 / bf16, widened exactly) into d_f32[begin, end).
void widen_on_device(const TensorView& tensor, std::size_t begin, std::size_t end, float* d_f32);
// How a value beyond an f16 / bf16 range is narrowed (kernels/cast_math.h): to +-Inf, as IEEE
// rounding and PyTorch do (values stored into a tensor), or to the largest finite value
// (message payloads, whose wire type never turns a finite value into Inf).
enum class Narrowing { ieee, saturate };
// Elements [begin, end) of d_f32 back into `tensor` (f16 / bf16, rounded to nearest even).
void narrow_on_device(const float* d_f32, std::size_t begin, std::size_t end, const TensorView& tensor,
                      Narrowing narrowing = Narrowing::ieee);
// Non-finite elements (NaN, +-Inf) among elements [begin, end) of a CUDA tensor: their count
// and the first one's index relative to `begin` (kernels/cuda/nonfinite_cuda.h). When
// end > begin the count is read back after a wait for the thread's work stream, so that stream
// is then drained exactly as finish_queued_work would leave it (`work_stream_drained`), and a
// call that counted need not wait again before its transport reads the tensor. With
// `wire_limit` > 0, the same pass also counts the finite elements with |x| > wire_limit
// (`beyond`: what a 16-bit wire type would saturate; the host count's twin).
struct NonfiniteOnDevice {
  std::uint64_t count = 0;
  std::uint64_t first = 0;
  std::uint64_t beyond = 0;
  bool work_stream_drained = false;
};
NonfiniteOnDevice count_nonfinite_on_device(const TensorView& tensor, std::size_t begin,
                                            std::size_t end, float wire_limit = 0.0f);
// d_data[i] /= divisor on `device` (the bits of the host's division).
void divide_on_device(float* d_data, std::size_t count, float divisor, int device);

// A non-blocking CUDA stream of `device` (it does not wait for the legacy default stream, so
// work on it overlaps the application's kernels), destroyed with the object.
class DeviceStream {
 public:
  DeviceStream(int device, std::string_view op);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  void* get() const noexcept { return stream_; }  // a cudaStream_t

 private:
  void* stream_ = nullptr;
  int device_ = 0;
};

// While alive, this thread's synchronous device work (device codecs, the copies and conversions
// above) runs on `stream` instead of the legacy default stream of the device.
class ThreadStreamScope {
 public:
  explicit ThreadStreamScope(void* stream) noexcept;
  ~ThreadStreamScope();
  ThreadStreamScope(const ThreadStreamScope&) = delete;
  ThreadStreamScope& operator=(const ThreadStreamScope&) = delete;

 private:
  void* previous_ = nullptr;
};

// A CUDA event of `device`: record() marks the point reached by a stream's work so far,
// synchronize() waits on the host until the work before it has completed.
class DeviceEvent {
 public:
  DeviceEvent(int device, std::string_view op);
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;
  void record(void* stream, std::string_view op);  // stream: a cudaStream_t, nullptr = legacy default
  void synchronize(std::string_view op) const;

 private:
  void* event_ = nullptr;
  int device_ = 0;
};

// An allocation of `bytes` bytes on CUDA device `device` (kernels/cuda/device_runtime.h: from
// the thread's block cache or gradzip's stream-ordered pool; at least one byte, so data() is
// never null), given back to the cache by the destructor. Nothing here synchronises the device.
class DeviceAllocation {
 public:
  DeviceAllocation(std::size_t bytes, int device, std::string_view op);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

// The input check of a call that runs before it knows its input is reducible (collectives/
// call.h, DeferredInput): at construction it queues on the thread's work stream, before any
// later work of the call, a device copy of the whole tensor as passed and the count of this
// rank's non-finite elements among [begin, end) (and, with wire_limit > 0, of the finite ones
// beyond it: nonfinite_policy.h's wire_range_limit) into three u64 of device memory. Nothing
// waits. The call's completion (OrderedDeviceCall::complete) turns the counts into flags every
// rank sees; when a rank flagged, restore() puts the tensor back and counts() reads this rank's
// numbers, both with a wait (the rare path).
class DeferredInputCheck {
 public:
  DeferredInputCheck(const TensorView& tensor, std::size_t begin, std::size_t end, float wire_limit);
  DeferredInputCheck(const DeferredInputCheck&) = delete;
  DeferredInputCheck& operator=(const DeferredInputCheck&) = delete;

  // {non-finite count, first index (all ones when none), beyond count}, device memory.
  const std::uint64_t* device_counts() const noexcept;
  // The tensor's bytes as they were at construction; returns once they are back.
  void restore() const;
  // This rank's counts (first: relative to begin), after a wait for the work stream.
  NonfiniteOnDevice counts() const;

 private:
  TensorView tensor_;
  DeviceAllocation snapshot_;
  DeviceAllocation counts_;
};

class Transport;

// One collective call on device memory over a transport that orders its work with CUDA streams
// (NCCL), run stream-ordered (kernels/cuda/stream_ordered_call.h): while it is open on this
// thread, the device codecs, device error feedback and the copies and conversions above only
// queue their work on the thread's work stream, received messages are checked on the device
// into status words, and the transport orders its operations with the work stream instead of
// waiting (Transport::begin_stream_order). Nothing waits on the host until complete().
class OrderedDeviceCall {
 public:
  // Opens the call on this thread and begins the transport's stream order with the thread's
  // work stream. Throws unsupported when the transport cannot order with streams.
  OrderedDeviceCall(Transport& transport, int device, std::string_view op);
  // Ends the transport's stream order; a call closed without complete() (an exception) makes
  // the next one opened on this thread wait for the work stream first.
  ~OrderedDeviceCall();
  OrderedDeviceCall(const OrderedDeviceCall&) = delete;
  OrderedDeviceCall& operator=(const OrderedDeviceCall&) = delete;

  // The call's one host wait, made by every rank at the same point of the call: on more than
  // one rank, first an all-reduce (queued, through the transport) of flags per rank saying
  // whether any of its device checks failed and, with `input`, whether its input held
  // non-finite elements or elements beyond the wire range; then the wait for the work stream
  // (Transport::wait_for_stream: deadline, transport errors). Returns true when some rank's
  // input was flagged: the call's result is to be discarded (the same answer on every rank),
  // and its checks are not looked at (a NaN may well fail them). Else throws for this rank's
  // first failed check (naming it, ErrorCode::malformed_message for a received message), or,
  // when only other ranks' checks failed, malformed_message naming those ranks: every rank
  // throws. Returns false when all passed.
  bool complete(std::string_view op, const DeferredInputCheck* input = nullptr);

 private:
  struct State;
  Transport& transport_;
  int device_ = 0;
  std::unique_ptr<State> state_;
};

// What the device runtime layer (kernels/cuda/device_runtime.h) has counted in this process:
// blocks taken from CUDA, blocks served from a thread's cache, blocks given back to CUDA, and
// host waits for the device. All 0 in a build without CUDA. The difference of two readings
// around a call is what that call cost (with nothing else running on the device).
struct DeviceRuntimeCounts {
  std::uint64_t allocations = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t frees = 0;
  std::uint64_t synchronizations = 0;
  std::uint64_t host_device_bytes = 0;  // copied between host and device memory, either way
};
DeviceRuntimeCounts device_runtime_counts() noexcept;
// Host waits by the site that waited (the operation's name, "nccl transport" for the NCCL
// transport's polls), counted only while set_wait_site_counting(true) (off by default: then a
// wait costs one atomic increment), sorted by site; wait_sites_between gives the sites whose
// count grew between two readings, with the growth (kernels/cuda/device_runtime.h). Empty in a
// build without CUDA.
void set_wait_site_counting(bool on) noexcept;
std::vector<std::pair<std::string, std::uint64_t>> device_wait_sites();
std::vector<std::pair<std::string, std::uint64_t>> wait_sites_between(
    const std::vector<std::pair<std::string, std::uint64_t>>& before,
    const std::vector<std::pair<std::string, std::uint64_t>>& after);

}  // namespace gradzip::collectives
