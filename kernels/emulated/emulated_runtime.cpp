// The CUDA runtime entry points of kernels/device_api.h (gz_cuda*), and the emulated device
// behind them (kernels/emulated/emulated_device.h says what it emulates and why).
//
// Each gz_cudaX runs CUDA's cudaX unless the emulated device is active; builds without the CUDA
// toolkit have only the emulated device. This file includes CUDA's (or the stand-in) header
// under CUDA's own names.
#define GRADZIP_DEVICE_API_LIST_ONLY 1
#include "kernels/device_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

#include "gradzip/error.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/entry_points.h"
#include "kernels/tunables.h"

#ifndef GRADZIP_CUDA_TOOLKIT
#define GRADZIP_CUDA_TOOLKIT 0
#endif

namespace gradzip::kernels::emulated {
namespace {

using Clock = std::chrono::steady_clock;

// ---- mode ----------------------------------------------------------------------------------

bool read_active() {
  const std::string& value = tunable_value("GRADZIP_DEVICE");
  if (value == "emulated") return true;
  if (value == "cuda") return false;
  if (!value.empty()) {
    std::fprintf(stderr,
                 "gradzip: GRADZIP_DEVICE=%s is not one of 'cuda', 'emulated'; using the %s\n",
                 value.c_str(), GRADZIP_CUDA_TOOLKIT ? "CUDA runtime" : "emulated device");
  }
  return !GRADZIP_CUDA_TOOLKIT;
}

int configured_device_count() {
  const auto count = parse_unsigned_integer(tunable_value("GRADZIP_EMULATED_DEVICES"));
  if (!count || *count < 1 || *count > 64) {
    std::fprintf(stderr, "gradzip: GRADZIP_EMULATED_DEVICES=%s is not a count from 1 to 64; using 1\n",
                 tunable_value("GRADZIP_EMULATED_DEVICES").c_str());
    return 1;
  }
  return static_cast<int>(*count);
}

// The delay before each queued operation, read from GRADZIP_EMULATED_DELAY_US when the first
// stream is made (on the caller's thread), never by a stream's thread: those may still run an
// operation (a block freed by a thread's cache at exit) after the table of tunables is gone.
std::atomic<long> g_operation_delay_us{-1};

void read_operation_delay() {
  if (g_operation_delay_us.load(std::memory_order_acquire) >= 0) return;
  long us = 20;
  const auto parsed = parse_unsigned_integer(tunable_value("GRADZIP_EMULATED_DELAY_US"));
  if (parsed && *parsed <= 1000000) {
    us = static_cast<long>(*parsed);
  } else {
    std::fprintf(stderr,
                 "gradzip: GRADZIP_EMULATED_DELAY_US=%s is not a count of microseconds up to "
                 "1000000; using 20\n",
                 tunable_value("GRADZIP_EMULATED_DELAY_US").c_str());
  }
  g_operation_delay_us.store(us, std::memory_order_release);
}

std::chrono::microseconds operation_delay() {
  return std::chrono::microseconds(std::max(0L, g_operation_delay_us.load(std::memory_order_acquire)));
}

// ---- errors --------------------------------------------------------------------------------

// The sticky error of a failed operation (a "kernel fault"): once set, every later call that
// talks to the device returns it, as after a fault on a GPU.
std::atomic<int> g_sticky_error{cudaSuccess};
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t error) {
  t_last_error = error;
  return error;
}

// The sticky error, or success.
cudaError_t sticky() {
  return static_cast<cudaError_t>(g_sticky_error.load(std::memory_order_acquire));
}

// ---- completions and streams ---------------------------------------------------------------

// Marks one queued operation done; events and waits hold it, never the stream.
struct Completion {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  Clock::time_point at{};

  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      at = Clock::now();
    }
    changed.notify_all();
  }
  bool is_done() {
    std::lock_guard<std::mutex> lock(mutex);
    return done;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return done; });
  }
};
using CompletionPtr = std::shared_ptr<Completion>;

CompletionPtr finished_completion() {
  auto completion = std::make_shared<Completion>();
  completion->done = true;
  completion->at = Clock::now();
  return completion;
}

class Stream {
 public:
  Stream(int device, bool blocking, bool legacy)
      : device_(device), blocking_(blocking), legacy_(legacy), tail_(finished_completion()) {
    read_operation_delay();
    (void)device_count();  // read now too, for the same reason
    worker_ = std::thread([this] { run(); });
  }
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const noexcept { return device_; }
  bool blocking() const noexcept { return blocking_; }
  bool legacy() const noexcept { return legacy_; }

  // Queues `work` after `waits` (completions it must not start before); returns its completion.
  // `delayed`: the operation waits the configured delay first (markers do not).
  CompletionPtr submit(const char* what, std::function<void()> work,
                       std::vector<CompletionPtr> waits, bool delayed) {
    auto completion = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Operation{what, std::move(work), std::move(waits), completion, delayed});
      tail_ = completion;
    }
    work_.notify_one();
    return completion;
  }
  CompletionPtr tail() {
    std::lock_guard<std::mutex> lock(mutex_);
    return tail_;
  }

 private:
  struct Operation {
    const char* what;
    std::function<void()> work;
    std::vector<CompletionPtr> waits;
    CompletionPtr completion;
    bool delayed;
  };

  void run() {
    for (;;) {
      Operation operation;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and drained
        operation = std::move(queue_.front());
        queue_.pop_front();
      }
      for (const CompletionPtr& wait : operation.waits) wait->wait();
      if (operation.delayed && operation_delay().count() > 0)
        std::this_thread::sleep_for(operation_delay());
      if (sticky() == cudaSuccess && operation.work) {
        try {
          operation.work();
        } catch (const std::exception& error) {
          report_fault(operation.what, error.what());
        } catch (...) {
          report_fault(operation.what, "an unknown exception");
        }
      }
      operation.work = nullptr;  // release what it captured before anyone sees it done
      operation.completion->finish();
    }
  }

  void report_fault(const char* what, const char* message) {
    std::fprintf(stderr, "gradzip emulated device: %s on cuda:%d failed: %s\n", what, device_, message);
    int expected = cudaSuccess;
    g_sticky_error.compare_exchange_strong(expected, cudaErrorLaunchFailure);
  }

  const int device_;
  const bool blocking_;
  const bool legacy_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Operation> queue_;
  CompletionPtr tail_;
  bool stopping_ = false;
  std::thread worker_;
};

// Streams made by cudaStreamCreate*: the handle given out is the Stream's address.
std::mutex g_streams_mutex;
std::set<Stream*>& live_streams() {
  static auto* streams = new std::set<Stream*>();  // never destroyed: worker threads may outlive exit
  return *streams;
}
// The legacy default stream of each device, made on first use, never destroyed.
Stream* legacy_stream(int device) {
  static std::mutex mutex;
  static auto* streams = new std::map<int, Stream*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& stream = (*streams)[device];
  if (stream == nullptr) stream = new Stream(device, true, true);
  return stream;
}

thread_local int t_current_device = 0;

// The stream a handle names, or null for an unknown handle.
Stream* stream_of(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread)
    return legacy_stream(t_current_device);
  auto* stream = reinterpret_cast<Stream*>(handle);
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  return live_streams().count(stream) != 0 ? stream : nullptr;
}

// Queues on `stream` with CUDA's implicit ordering between the legacy default stream and the
// blocking streams of its device.
CompletionPtr submit_ordered(Stream* stream, const char* what, std::function<void()> work,
                             bool delayed = true) {
  std::vector<CompletionPtr> waits;
  if (stream->legacy()) {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    for (Stream* other : live_streams())
      if (other->blocking() && other->device() == stream->device()) waits.push_back(other->tail());
  } else if (stream->blocking()) {
    waits.push_back(legacy_stream(stream->device())->tail());
  }
  return stream->submit(what, std::move(work), std::move(waits), delayed);
}

// Every stream's work on every device queued so far.
void synchronize_everything() {
  std::vector<CompletionPtr> tails;
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    for (Stream* stream : live_streams()) tails.push_back(stream->tail());
  }
  for (int device = 0; device < device_count(); ++device)
    tails.push_back(legacy_stream(device)->tail());
  for (const CompletionPtr& tail : tails) tail->wait();
}

// ---- events --------------------------------------------------------------------------------

struct Event {
  bool timing = true;
  std::mutex mutex;
  CompletionPtr recorded;  // null: never recorded (complete)
};
std::mutex g_events_mutex;
std::set<Event*>& live_events() {
  static auto* events = new std::set<Event*>();
  return *events;
}
Event* event_of(cudaEvent_t handle) {
  auto* event = reinterpret_cast<Event*>(handle);
  std::lock_guard<std::mutex> lock(g_events_mutex);
  return live_events().count(event) != 0 ? event : nullptr;
}
CompletionPtr recorded_completion(Event* event) {
  std::lock_guard<std::mutex> lock(event->mutex);
  return event->recorded;
}

// ---- memory --------------------------------------------------------------------------------

enum class MemoryKind { device, pinned };
struct Allocation {
  std::size_t bytes = 0;
  int device = 0;
  MemoryKind kind = MemoryKind::device;
};
constexpr std::align_val_t kAlignment{256};
std::mutex g_memory_mutex;
std::map<std::uintptr_t, Allocation>& allocations() {
  static auto* table = new std::map<std::uintptr_t, Allocation>();
  return *table;
}

// A new block, filled with 0xFF bytes (f32 NaN), as device memory is never zeroed for you.
void* allocate(std::size_t bytes, MemoryKind kind) {
  void* block = ::operator new(bytes == 0 ? 1 : bytes, kAlignment, std::nothrow);
  if (block == nullptr) return nullptr;
  std::memset(block, 0xFF, bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  allocations()[reinterpret_cast<std::uintptr_t>(block)] = Allocation{bytes, t_current_device, kind};
  return block;
}

// Forgets and frees the allocation that starts at `block`; false when there is none of `kind`.
bool release(void* block, MemoryKind kind) {
  {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    const auto found = allocations().find(reinterpret_cast<std::uintptr_t>(block));
    if (found == allocations().end() || found->second.kind != kind) return false;
    allocations().erase(found);
  }
  ::operator delete(block, kAlignment);
  return true;
}

// The allocation containing `pointer`, if any (copied out under the lock).
bool find_allocation(const void* pointer, std::uintptr_t* start, Allocation* allocation) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  auto after = allocations().upper_bound(address);
  if (after == allocations().begin()) return false;
  const auto& [base, found] = *std::prev(after);
  if (address >= base + std::max<std::size_t>(found.bytes, 1)) return false;
  *start = base;
  *allocation = found;
  return true;
}

// True when [pointer, pointer + bytes) lies in one allocation of `kind`.
bool inside(const void* pointer, std::size_t bytes, MemoryKind kind) {
  std::uintptr_t start = 0;
  Allocation allocation;
  if (!find_allocation(pointer, &start, &allocation) || allocation.kind != kind) return false;
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  return address - start <= allocation.bytes && bytes <= allocation.bytes - (address - start);
}

bool is_device_range(const void* pointer, std::size_t bytes) {
  return bytes == 0 || inside(pointer, bytes, MemoryKind::device);
}

// Checks a copy's pointers against its kind: the device side(s) must be device memory of the
// right size; cudaMemcpyDefault accepts any pointer.
cudaError_t check_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  const bool device_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool device_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyHostToDevice &&
      kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return cudaErrorInvalidMemcpyDirection;
  if (device_dst && !is_device_range(dst, bytes)) return cudaErrorInvalidValue;
  if (device_src && !is_device_range(src, bytes)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

std::size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
}

std::size_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return physical_memory_bytes() / 2;
}

const char* error_text(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated device)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated device)";
    case cudaErrorInitializationError: return "initialization error (emulated device)";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer (emulated device)";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy (emulated device)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (this build has no CUDA toolkit and GRADZIP_DEVICE is not 'emulated')";
    case cudaErrorInvalidDevice: return "invalid device ordinal (emulated device)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (emulated device)";
    case cudaErrorNotReady: return "device not ready (emulated device)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulated device)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated device: an operation failed, see stderr)";
    case cudaErrorNotSupported: return "operation not supported (emulated device)";
    default: return "unknown error (emulated device)";
  }
}

const char* error_name(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

// Counts a copy's bytes when exactly one side is host memory (the copies between host and
// device that `gradzip-bench calls` reports per call). cudaMemcpyDefault asks where each
// pointer is (the emulator's table, or CUDA).
bool host_side(const void* pointer) {
#if GRADZIP_CUDA_TOOLKIT
  if (!active()) {
    cudaPointerAttributes attributes{};
    if (::cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      ::cudaGetLastError();
      return true;
    }
    return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
  }
#endif
  std::uintptr_t start = 0;
  Allocation allocation;
  return !find_allocation(pointer, &start, &allocation) || allocation.kind == MemoryKind::pinned;
}

void count_copy(const void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  bool crosses = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost;
  if (kind == cudaMemcpyDefault) crosses = host_side(dst) != host_side(src);
  if (crosses) cuda::count_host_device_bytes(bytes);
}

// Fake pool handles: one per created pool; allocation ignores them.
struct Pool {
  int device = 0;
};

}  // namespace

// ---- emulated_device.h ---------------------------------------------------------------------

bool active() noexcept {
  static const bool value = [] {
    try {
      return read_active();
    } catch (...) {
      return !GRADZIP_CUDA_TOOLKIT;
    }
  }();
  return value;
}

bool toolkit_free_build() noexcept { return !GRADZIP_CUDA_TOOLKIT; }

int device_count() noexcept {
  static const int count = [] {
    try {
      return configured_device_count();
    } catch (...) {
      return 1;
    }
  }();
  return count;
}

int current_device() noexcept { return t_current_device; }

void enqueue(void* stream, const char* what, std::function<void()> work) {
  Stream* target = stream_of(static_cast<cudaStream_t>(stream));
  GZ_REQUIRE(target != nullptr, ErrorCode::invalid_argument, what,
             ": the stream is not one the emulated device made (destroyed, or not a stream)");
  submit_ordered(target, what, std::move(work));
}

void require_device_range(const void* pointer, std::size_t bytes, const char* what) {
  GZ_REQUIRE(is_device_range(pointer, bytes), ErrorCode::invalid_argument, what, ": ", bytes,
             " bytes at ", pointer,
             " are not inside one emulated device allocation (a host pointer, a freed block, or "
             "past the end of a block)");
}

void require_device_accessible_range(const void* pointer, std::size_t bytes, const char* what) {
  GZ_REQUIRE(bytes == 0 || inside(pointer, bytes, MemoryKind::device) ||
                 inside(pointer, bytes, MemoryKind::pinned),
             ErrorCode::invalid_argument, what, ": ", bytes, " bytes at ", pointer,
             " are neither inside one emulated device allocation nor inside one pinned host "
             "allocation");
}

}  // namespace gradzip::kernels::emulated

// ---- the entry points ----------------------------------------------------------------------

namespace emu = gradzip::kernels::emulated;

#if GRADZIP_CUDA_TOOLKIT
#define GRADZIP_REAL_UNLESS_EMULATED(call) \
  if (!emu::active()) return ::call
#else
#define GRADZIP_REAL_UNLESS_EMULATED(call) \
  if (!emu::active()) return emu::fail(cudaErrorNoDevice)
#endif

// Returns the sticky error, if any, from a call that talks to the device.
#define GRADZIP_RETURN_IF_STICKY()                                  \
  do {                                                              \
    if (const cudaError_t sticky_error = emu::sticky(); sticky_error != cudaSuccess) \
      return emu::fail(sticky_error);                               \
  } while (false)

extern "C" {

cudaError_t gz_cudaGetDeviceCount(int* count) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaGetDeviceCount(count));
  if (count == nullptr) return emu::fail(cudaErrorInvalidValue);
  *count = emu::device_count();
  return cudaSuccess;
}

cudaError_t gz_cudaGetDevice(int* device) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaGetDevice(device));
  if (device == nullptr) return emu::fail(cudaErrorInvalidValue);
  *device = emu::t_current_device;
  return cudaSuccess;
}

cudaError_t gz_cudaSetDevice(int device) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaSetDevice(device));
  if (device < 0 || device >= emu::device_count()) return emu::fail(cudaErrorInvalidDevice);
  emu::t_current_device = device;
  return cudaSuccess;
}

cudaError_t gz_cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaGetDeviceProperties(prop, device));
  if (prop == nullptr) return emu::fail(cudaErrorInvalidValue);
  if (device < 0 || device >= emu::device_count()) return emu::fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "gradzip emulated device %d (CPU)", device);
  prop->totalGlobalMem = emu::physical_memory_bytes();
  prop->multiProcessorCount = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  prop->major = 9;
  prop->minor = 0;
  prop->memoryBusWidth = 64;
  prop->l2CacheSize = 4 << 20;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}

cudaError_t gz_cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaDeviceGetAttribute(value, attr, device));
  if (value == nullptr) return emu::fail(cudaErrorInvalidValue);
  if (device < 0 || device >= emu::device_count()) return emu::fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      return cudaSuccess;
    case cudaDevAttrL2CacheSize: *value = 4 << 20; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; return cudaSuccess;
    default: return emu::fail(cudaErrorInvalidValue);
  }
}

cudaError_t gz_cudaDeviceSynchronize(void) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaDeviceSynchronize());
  emu::synchronize_everything();
  GRADZIP_RETURN_IF_STICKY();
  return cudaSuccess;
}

cudaError_t gz_cudaRuntimeGetVersion(int* runtimeVersion) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaRuntimeGetVersion(runtimeVersion));
  if (runtimeVersion == nullptr) return emu::fail(cudaErrorInvalidValue);
  *runtimeVersion = 13000;
  return cudaSuccess;
}

cudaError_t gz_cudaDriverGetVersion(int* driverVersion) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaDriverGetVersion(driverVersion));
  if (driverVersion == nullptr) return emu::fail(cudaErrorInvalidValue);
  *driverVersion = 13000;
  return cudaSuccess;
}

cudaError_t gz_cudaMemGetInfo(size_t* free, size_t* total) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemGetInfo(free, total));
  if (free == nullptr || total == nullptr) return emu::fail(cudaErrorInvalidValue);
  *total = emu::physical_memory_bytes();
  *free = std::min(*total, emu::available_memory_bytes());
  return cudaSuccess;
}

cudaError_t gz_cudaGetLastError(void) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaGetLastError());
  const cudaError_t last = emu::t_last_error;
  emu::t_last_error = cudaSuccess;
  const cudaError_t sticky_error = emu::sticky();
  return sticky_error != cudaSuccess ? sticky_error : last;
}

cudaError_t gz_cudaPeekAtLastError(void) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaPeekAtLastError());
  const cudaError_t sticky_error = emu::sticky();
  return sticky_error != cudaSuccess ? sticky_error : emu::t_last_error;
}

const char* gz_cudaGetErrorString(cudaError_t error) {
#if GRADZIP_CUDA_TOOLKIT
  if (!emu::active()) return ::cudaGetErrorString(error);
#endif
  return emu::error_text(error);
}

const char* gz_cudaGetErrorName(cudaError_t error) {
#if GRADZIP_CUDA_TOOLKIT
  if (!emu::active()) return ::cudaGetErrorName(error);
#endif
  return emu::error_name(error);
}

cudaError_t gz_cudaMalloc(void** devPtr, size_t size) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMalloc(devPtr, size));
  GRADZIP_RETURN_IF_STICKY();
  if (devPtr == nullptr) return emu::fail(cudaErrorInvalidValue);
  // cudaMalloc synchronises the device: work queued before it has run when it returns.
  emu::synchronize_everything();
  *devPtr = emu::allocate(size, emu::MemoryKind::device);
  return *devPtr != nullptr ? cudaSuccess : emu::fail(cudaErrorMemoryAllocation);
}

cudaError_t gz_cudaFree(void* devPtr) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaFree(devPtr));
  if (devPtr == nullptr) return cudaSuccess;
  emu::synchronize_everything();  // cudaFree waits for the device
  if (!emu::release(devPtr, emu::MemoryKind::device)) return emu::fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t gz_cudaMallocHost(void** ptr, size_t size) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMallocHost(ptr, size));
  if (ptr == nullptr) return emu::fail(cudaErrorInvalidValue);
  *ptr = emu::allocate(size, emu::MemoryKind::pinned);
  return *ptr != nullptr ? cudaSuccess : emu::fail(cudaErrorMemoryAllocation);
}

cudaError_t gz_cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaHostAlloc(pHost, size, flags));
  if (pHost == nullptr || flags != cudaHostAllocDefault) return emu::fail(cudaErrorInvalidValue);
  *pHost = emu::allocate(size, emu::MemoryKind::pinned);
  return *pHost != nullptr ? cudaSuccess : emu::fail(cudaErrorMemoryAllocation);
}

cudaError_t gz_cudaFreeHost(void* ptr) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaFreeHost(ptr));
  if (ptr == nullptr) return cudaSuccess;
  emu::synchronize_everything();
  if (!emu::release(ptr, emu::MemoryKind::pinned)) return emu::fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

// Stream-ordered allocation: the block exists at once (a later operation of the stream may use
// it); cudaFreeAsync frees it when the stream reaches the free.
cudaError_t gz_cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMallocAsync(devPtr, size, hStream));
  GRADZIP_RETURN_IF_STICKY();
  if (devPtr == nullptr) return emu::fail(cudaErrorInvalidValue);
  if (emu::stream_of(hStream) == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  *devPtr = emu::allocate(size, emu::MemoryKind::device);
  return *devPtr != nullptr ? cudaSuccess : emu::fail(cudaErrorMemoryAllocation);
}

cudaError_t gz_cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool,
                                       cudaStream_t stream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMallocFromPoolAsync(ptr, size, memPool, stream));
  if (memPool == nullptr) return emu::fail(cudaErrorInvalidValue);
  return gz_cudaMallocAsync(ptr, size, stream);
}

cudaError_t gz_cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaFreeAsync(devPtr, hStream));
  GRADZIP_RETURN_IF_STICKY();
  if (devPtr == nullptr) return cudaSuccess;
  emu::Stream* stream = emu::stream_of(hStream);
  if (stream == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  if (!emu::is_device_range(devPtr, 1)) return emu::fail(cudaErrorInvalidValue);
  emu::submit_ordered(stream, "cudaFreeAsync", [devPtr] {
    GZ_REQUIRE(emu::release(devPtr, emu::MemoryKind::device), gradzip::ErrorCode::invalid_argument,
               "cudaFreeAsync: the block was already freed");
  });
  return cudaSuccess;
}

cudaError_t gz_cudaMemPoolCreate(cudaMemPool_t* memPool, const cudaMemPoolProps* poolProps) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemPoolCreate(memPool, poolProps));
  if (memPool == nullptr || poolProps == nullptr) return emu::fail(cudaErrorInvalidValue);
  if (poolProps->location.type != cudaMemLocationTypeDevice || poolProps->location.id < 0 ||
      poolProps->location.id >= emu::device_count())
    return emu::fail(cudaErrorInvalidValue);
  *memPool = reinterpret_cast<cudaMemPool_t>(new emu::Pool{poolProps->location.id});
  return cudaSuccess;
}

cudaError_t gz_cudaMemPoolDestroy(cudaMemPool_t memPool) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemPoolDestroy(memPool));
  if (memPool == nullptr) return emu::fail(cudaErrorInvalidValue);
  delete reinterpret_cast<emu::Pool*>(memPool);
  return cudaSuccess;
}

cudaError_t gz_cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemPoolSetAttribute(memPool, attr, value));
  if (memPool == nullptr || value == nullptr || attr != cudaMemPoolAttrReleaseThreshold)
    return emu::fail(cudaErrorInvalidValue);
  return cudaSuccess;  // the emulated device keeps no pool: a threshold changes nothing
}

cudaError_t gz_cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaPointerGetAttributes(attributes, ptr));
  if (attributes == nullptr) return emu::fail(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof *attributes);
  attributes->device = -2;
  std::uintptr_t start = 0;
  emu::Allocation allocation;
  if (ptr == nullptr || !emu::find_allocation(ptr, &start, &allocation)) {
    attributes->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  attributes->device = allocation.device;
  if (allocation.kind == emu::MemoryKind::device) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = const_cast<void*>(ptr);
    attributes->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t gz_cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                               cudaStream_t stream) {
  emu::count_copy(dst, src, count, kind);
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemcpyAsync(dst, src, count, kind, stream));
  GRADZIP_RETURN_IF_STICKY();
  emu::Stream* target = emu::stream_of(stream);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t error = emu::check_copy(dst, src, count, kind); error != cudaSuccess)
    return emu::fail(error);
  if (count == 0) return cudaSuccess;
  // Asynchronous whatever the host memory is: stricter than CUDA, which copies pageable host
  // memory before returning, so that code which relies on that is caught here.
  emu::submit_ordered(target, "cudaMemcpyAsync", [dst, src, count] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

cudaError_t gz_cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  emu::count_copy(dst, src, count, kind);
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemcpy(dst, src, count, kind));
  GRADZIP_RETURN_IF_STICKY();
  if (const cudaError_t error = emu::check_copy(dst, src, count, kind); error != cudaSuccess)
    return emu::fail(error);
  if (count == 0) return cudaSuccess;
  // On the legacy stream, and the host waits for it.
  emu::submit_ordered(emu::stream_of(nullptr), "cudaMemcpy",
                      [dst, src, count] { std::memmove(dst, src, count); })
      ->wait();
  GRADZIP_RETURN_IF_STICKY();
  return cudaSuccess;
}

cudaError_t gz_cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemsetAsync(devPtr, value, count, stream));
  GRADZIP_RETURN_IF_STICKY();
  emu::Stream* target = emu::stream_of(stream);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!emu::is_device_range(devPtr, count)) return emu::fail(cudaErrorInvalidValue);
  emu::submit_ordered(target, "cudaMemsetAsync",
                      [devPtr, value, count] { std::memset(devPtr, value, count); });
  return cudaSuccess;
}

// Asynchronous to the host for device memory, as CUDA's is.
cudaError_t gz_cudaMemset(void* devPtr, int value, size_t count) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaMemset(devPtr, value, count));
  return gz_cudaMemsetAsync(devPtr, value, count, nullptr);
}

cudaError_t gz_cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaStreamCreateWithFlags(pStream, flags));
  if (pStream == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0)
    return emu::fail(cudaErrorInvalidValue);
  auto* stream = new emu::Stream(emu::t_current_device, (flags & cudaStreamNonBlocking) == 0, false);
  {
    std::lock_guard<std::mutex> lock(emu::g_streams_mutex);
    emu::live_streams().insert(stream);
  }
  *pStream = reinterpret_cast<cudaStream_t>(stream);
  return cudaSuccess;
}

cudaError_t gz_cudaStreamCreate(cudaStream_t* pStream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaStreamCreate(pStream));
  return gz_cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

// Waits for the stream's work (CUDA returns at once and releases the stream when its work is
// done; the caller sees no difference but the time).
cudaError_t gz_cudaStreamDestroy(cudaStream_t stream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaStreamDestroy(stream));
  auto* target = reinterpret_cast<emu::Stream*>(stream);
  {
    std::lock_guard<std::mutex> lock(emu::g_streams_mutex);
    if (emu::live_streams().erase(target) == 0) return emu::fail(cudaErrorInvalidResourceHandle);
  }
  delete target;
  return cudaSuccess;
}

cudaError_t gz_cudaStreamSynchronize(cudaStream_t stream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaStreamSynchronize(stream));
  emu::Stream* target = emu::stream_of(stream);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  target->tail()->wait();
  GRADZIP_RETURN_IF_STICKY();
  return cudaSuccess;
}

cudaError_t gz_cudaStreamQuery(cudaStream_t stream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaStreamQuery(stream));
  GRADZIP_RETURN_IF_STICKY();
  emu::Stream* target = emu::stream_of(stream);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  return target->tail()->is_done() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t gz_cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaStreamWaitEvent(stream, event, flags));
  GRADZIP_RETURN_IF_STICKY();
  emu::Stream* target = emu::stream_of(stream);
  emu::Event* source = emu::event_of(event);
  if (target == nullptr || source == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return emu::fail(cudaErrorInvalidValue);
  emu::CompletionPtr recorded = emu::recorded_completion(source);
  if (!recorded) return cudaSuccess;  // never recorded: nothing to wait for
  emu::submit_ordered(target, "cudaStreamWaitEvent", [recorded] { recorded->wait(); }, false);
  return cudaSuccess;
}

cudaError_t gz_cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaLaunchHostFunc(stream, fn, userData));
  GRADZIP_RETURN_IF_STICKY();
  emu::Stream* target = emu::stream_of(stream);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  if (fn == nullptr) return emu::fail(cudaErrorInvalidValue);
  emu::submit_ordered(target, "cudaLaunchHostFunc", [fn, userData] { fn(userData); });
  return cudaSuccess;
}

cudaError_t gz_cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventCreateWithFlags(event, flags));
  constexpr unsigned kKnown = cudaEventBlockingSync | cudaEventDisableTiming;
  if (event == nullptr || (flags & ~kKnown) != 0) return emu::fail(cudaErrorInvalidValue);
  auto* made = new emu::Event();
  made->timing = (flags & cudaEventDisableTiming) == 0;
  {
    std::lock_guard<std::mutex> lock(emu::g_events_mutex);
    emu::live_events().insert(made);
  }
  *event = reinterpret_cast<cudaEvent_t>(made);
  return cudaSuccess;
}

cudaError_t gz_cudaEventCreate(cudaEvent_t* event) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventCreate(event));
  return gz_cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t gz_cudaEventDestroy(cudaEvent_t event) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventDestroy(event));
  auto* target = reinterpret_cast<emu::Event*>(event);
  {
    std::lock_guard<std::mutex> lock(emu::g_events_mutex);
    if (emu::live_events().erase(target) == 0) return emu::fail(cudaErrorInvalidResourceHandle);
  }
  delete target;  // operations waiting on it hold its completion, not the event
  return cudaSuccess;
}

cudaError_t gz_cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventRecord(event, stream));
  GRADZIP_RETURN_IF_STICKY();
  emu::Event* target = emu::event_of(event);
  emu::Stream* on = emu::stream_of(stream);
  if (target == nullptr || on == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  emu::CompletionPtr marker = emu::submit_ordered(on, "cudaEventRecord", nullptr, false);
  std::lock_guard<std::mutex> lock(target->mutex);
  target->recorded = std::move(marker);
  return cudaSuccess;
}

cudaError_t gz_cudaEventQuery(cudaEvent_t event) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventQuery(event));
  GRADZIP_RETURN_IF_STICKY();
  emu::Event* target = emu::event_of(event);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  const emu::CompletionPtr recorded = emu::recorded_completion(target);
  return !recorded || recorded->is_done() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t gz_cudaEventSynchronize(cudaEvent_t event) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventSynchronize(event));
  emu::Event* target = emu::event_of(event);
  if (target == nullptr) return emu::fail(cudaErrorInvalidResourceHandle);
  if (const emu::CompletionPtr recorded = emu::recorded_completion(target)) recorded->wait();
  GRADZIP_RETURN_IF_STICKY();
  return cudaSuccess;
}

cudaError_t gz_cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  GRADZIP_REAL_UNLESS_EMULATED(cudaEventElapsedTime(ms, start, end));
  emu::Event* first = emu::event_of(start);
  emu::Event* second = emu::event_of(end);
  if (ms == nullptr || first == nullptr || second == nullptr)
    return emu::fail(first == nullptr || second == nullptr ? cudaErrorInvalidResourceHandle
                                                           : cudaErrorInvalidValue);
  if (!first->timing || !second->timing) return emu::fail(cudaErrorInvalidResourceHandle);
  const emu::CompletionPtr a = emu::recorded_completion(first);
  const emu::CompletionPtr b = emu::recorded_completion(second);
  if (!a || !b) return emu::fail(cudaErrorInvalidResourceHandle);
  if (!a->is_done() || !b->is_done()) return emu::fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

}  // extern "C"
