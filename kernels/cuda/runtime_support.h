// Host-side helpers for C++ code that calls the CUDA runtime around the kernels (the device
// codecs, the collectives' device memory): error checks, the current-device scope and the
// device-pointer check. Includes cuda_runtime.h, so only sources built with CUDA include it
// (compressors/cuda/, collectives/cuda/), never a public header.
#pragma once

#include "kernels/device_api.h"

#include <string_view>

#include "gradzip/error.h"

namespace gradzip::kernels::cuda {

// The stream this thread's synchronous device work (the device codecs, the collectives' copies
// and conversions) runs on: nullptr, the legacy default stream, unless a caller (a Reducer lane,
// through collectives::ThreadStreamScope) set its own. That work synchronises its stream before
// returning, except inside a stream-ordered call (kernels/cuda/stream_ordered_call.h), where
// it stays queued until the call's completion.
inline void*& thread_work_stream() noexcept {
  thread_local void* stream = nullptr;
  return stream;
}

// Throws ErrorCode::unsupported naming `op`, `what` and CUDA's text unless status is success.
inline void check_runtime(cudaError_t status, std::string_view op, std::string_view what) {
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported, op, ": ", what, " failed: ",
             cudaGetErrorString(status));
}

// Makes `device` current for a scope and restores the caller's current device after it.
class CurrentDevice {
 public:
  CurrentDevice(int device, std::string_view op) {
    check_runtime(cudaGetDevice(&previous_), op, "cudaGetDevice");
    if (previous_ != device) check_runtime(cudaSetDevice(device), op, "cudaSetDevice");
    changed_ = previous_ != device;
  }
  ~CurrentDevice() {
    if (changed_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// CurrentDevice without exceptions, for destructors and code that reports CUDA errors itself:
// makes `device` the calling thread's current CUDA device for the scope and restores the
// previous one afterwards. status() is cudaSetDevice's.
class CurrentCudaDevice {
 public:
  explicit CurrentCudaDevice(int device) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = cudaSetDevice(device);
      changed_ = status_ == cudaSuccess && previous_ >= 0;
    }
  }
  ~CurrentCudaDevice() {
    if (changed_) cudaSetDevice(previous_);
  }
  CurrentCudaDevice(const CurrentCudaDevice&) = delete;
  CurrentCudaDevice& operator=(const CurrentCudaDevice&) = delete;
  cudaError_t status() const noexcept { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  cudaError_t status_ = cudaSuccess;
};

// What cudaPointerGetAttributes says a pointer is, in words for error messages.
inline const char* memory_kind(cudaMemoryType type) noexcept {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "pageable host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of unknown kind";
}

// Throws ErrorCode::invalid_argument naming `op`, `what` (e.g. "the tensor") and the kind of
// memory it is unless `pointer` is device (or managed) memory usable on `device`: how a host
// buffer passed where device memory belongs is refused before any kernel or transfer touches it.
// ErrorCode::unsupported when CUDA cannot run here at all (no driver, no device).
inline void require_device_pointer(const void* pointer, int device, std::string_view op,
                                   std::string_view what) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  if (status != cudaSuccess) cudaGetLastError();  // leave no error for the next call to find
  GZ_REQUIRE(status != cudaErrorNoDevice && status != cudaErrorInsufficientDriver &&
                 status != cudaErrorInitializationError,
             ErrorCode::unsupported, op, ": ", what, " is on CUDA device ", device,
             ", but CUDA cannot run here (", cudaGetErrorString(status), ")");
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::invalid_argument, op, ": ", what,
             " cannot be checked as CUDA device memory of cuda:", device, " (",
             cudaGetErrorString(status), ")");
  const bool device_memory =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  GZ_REQUIRE(device_memory, ErrorCode::invalid_argument, op, ": ", what, " is ",
             memory_kind(attributes.type), ", not CUDA device memory (it must be device memory on cuda:",
             device, ")");
  GZ_REQUIRE(attributes.type == cudaMemoryTypeManaged || attributes.device == device,
             ErrorCode::invalid_argument, op, ": ", what, " is device memory of cuda:",
             attributes.device, "; it must be device memory on cuda:", device);
}

}  // namespace gradzip::kernels::cuda
