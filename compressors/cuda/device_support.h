// Host-side helpers shared by the C++ files that run device codecs and device error feedback
// (compressors/cuda/device_codec.cpp, the codec folders' cuda/*.cpp,
// error_feedback/cuda/device_feedback.cpp): the thread's
// work stream, scratch from the thread's block cache, copies, and f32 views of f16 / bf16
// inputs. Includes cuda_runtime.h: only sources built with CUDA include it.
#pragma once

#include "kernels/device_api.h"

#include <array>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>

#include "compressors/wire_format.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "gradzip/tensor_view.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/ef_cuda.h"
#include "kernels/cuda/runtime_support.h"
#include "kernels/cuda/stream_ordered_call.h"

namespace gradzip::compressors::device {

namespace cuda = kernels::cuda;

// The stream a call runs on: the thread's work stream (kernels/cuda/runtime_support.h), by
// default the legacy default stream of the current device.
inline void* work_stream() noexcept { return cuda::thread_work_stream(); }

using cuda::check_runtime;
using DeviceScope = cuda::CurrentDevice;

// Scratch from the thread's block cache (kernels/cuda/device_runtime.h), given back when the
// scope ends. Work still queued on the work stream may use it then: the cache hands a block out
// again only on this thread, whose later work on that stream is ordered after it (in a
// stream-ordered call, the NCCL transport's stream too is ordered after the work stream before
// each of its operations: collectives/transport/nccl/nccl_transport.h).
class DeviceScratch {
 public:
  DeviceScratch(std::size_t bytes, const std::string& op) : bytes_(bytes) {
    if (bytes == 0) return;
    GZ_REQUIRE(cudaGetDevice(&device_) == cudaSuccess, ErrorCode::unsupported, op,
               ": cudaGetDevice failed");
    data_ = cuda::device_allocate(bytes, device_, static_cast<cudaStream_t>(work_stream()), op,
                                  "allocating scratch");
  }
  ~DeviceScratch() {
    cuda::device_release(data_, bytes_, device_, static_cast<cudaStream_t>(work_stream()));
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

inline void synchronize(const std::string& op) {
  cuda::synchronize_stream(static_cast<cudaStream_t>(work_stream()), op,
                           "the device work (cudaStreamSynchronize)");
}

// The end of a device codec call: its work is done when it returns (synchronised), except in a
// stream-ordered call (kernels/cuda/stream_ordered_call.h), where it stays queued on the work
// stream and the call's completion waits for it.
inline void finish(const std::string& op) {
  if (!cuda::stream_ordered()) synchronize(op);
}

// Device status words of a decode's payload checks (each written by a kernel, 0 = passed). In a
// stream-ordered call, words of the call, checked at its completion; otherwise scratch that
// check() reads back (one copy, one wait) and throws for. Words start at 0 either way.
template <std::size_t N>
class StatusWords {
 public:
  using Describe = cuda::StreamOrderedCall::Describe;
  StatusWords(const std::string& op, const std::array<Describe, N>& describe)
      : op_(op), describe_(describe) {
    if (cuda::StreamOrderedCall* call = cuda::StreamOrderedCall::current()) {
      for (std::size_t i = 0; i < N; ++i) {
        words_[i] = call->status_word(op, describe[i]);
        ordered_ = ordered_ && words_[i] != nullptr;
      }
      ordered_ = ordered_ && N > 0;
      if (ordered_) return;
    }
    ordered_ = false;
    scratch_ = std::make_unique<DeviceScratch>(N * sizeof(int), op);
    for (std::size_t i = 0; i < N; ++i) words_[i] = scratch_->as<int>() + i;
    check_runtime(cudaMemsetAsync(scratch_->as<int>(), 0, N * sizeof(int),
                                  static_cast<cudaStream_t>(work_stream())),
                  op, "clearing the validation status");
  }
  int* word(std::size_t i) const noexcept { return words_[i]; }
  // Throws ErrorCode::malformed_message for the first non-zero word (synchronous calls only;
  // a stream-ordered call checks at its completion).
  void check() const {
    if (ordered_) return;
    std::array<int, N> status{};
    check_runtime(cudaMemcpyAsync(status.data(), scratch_->as<int>(), N * sizeof(int),
                                  cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(work_stream())),
                  op_, "reading the validation status");
    synchronize(op_);
    for (std::size_t i = 0; i < N; ++i)
      GZ_REQUIRE(status[i] == 0, ErrorCode::malformed_message, op_, ": ", describe_[i](status[i]));
  }

 private:
  std::string op_;
  std::array<Describe, N> describe_;
  std::array<int*, N> words_{};
  std::unique_ptr<DeviceScratch> scratch_;
  bool ordered_ = true;
};

inline void copy_to_device(void* d_out, const void* host, std::size_t bytes, const std::string& op) {
  if (bytes == 0) return;
  check_runtime(cudaMemcpyAsync(d_out, host, bytes, cudaMemcpyHostToDevice,
                             static_cast<cudaStream_t>(work_stream())),
             op, "copying to the device");
}

inline void copy_on_device(void* d_out, const void* d_in, std::size_t bytes, const std::string& op) {
  if (bytes == 0) return;
  check_runtime(cudaMemcpyAsync(d_out, d_in, bytes, cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(work_stream())),
             op, "a device-to-device copy");
}

inline bool aligned(const void* pointer, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

inline std::size_t checked_product(std::size_t count, std::size_t element_bytes, const std::string& op) {
  GZ_REQUIRE(element_bytes == 0 || count <= SIZE_MAX / element_bytes, ErrorCode::invalid_argument,
             op, ": ", count, " elements of ", element_bytes, " bytes overflow a size");
  return count * element_bytes;
}

// The f32 values of a CUDA tensor: the tensor itself, or its widening in scratch.
class F32Input {
 public:
  F32Input(ConstTensorView in, const std::string& op)
      : scratch_(in.dtype == DType::f32 ? 0 : checked_product(in.count, sizeof(float), op), op) {
    if (in.dtype == DType::f32) {
      data_ = static_cast<const float*>(in.data);
      return;
    }
    GZ_REQUIRE(in.dtype == DType::f16 || in.dtype == DType::bf16, ErrorCode::invalid_argument, op,
               ": input dtype ", dtype_name(in.dtype), " (expected f32, f16 or bf16)");
    const auto* half = static_cast<const std::uint16_t*>(in.data);
    if (in.dtype == DType::f16) cuda::f16_to_f32(half, scratch_.as<float>(), in.count, work_stream());
    else cuda::bf16_to_f32(half, scratch_.as<float>(), in.count, work_stream());
    data_ = scratch_.as<float>();
  }
  const float* data() const noexcept { return data_; }

 private:
  DeviceScratch scratch_;
  const float* data_ = nullptr;
};

// The checked payload size of an element-wise message (none: 4 bytes an element; fp16, bf16: 2):
// flags, small_param and large_param 0 and payload_bytes = count * element_bytes, else
// ErrorCode::malformed_message naming `op`.
inline std::size_t expected_element_payload(const WireHeader& header, std::size_t element_bytes,
                                            const std::string& op) {
  GZ_REQUIRE(header.flags == 0 && header.small_param == 0 && header.large_param == 0,
             ErrorCode::malformed_message, op, ": flags ", int{header.flags}, ", small_param ",
             int{header.small_param}, ", large_param ", header.large_param, " (expected all 0)");
  GZ_REQUIRE(header.count <= SIZE_MAX / element_bytes &&
                 header.payload_bytes == header.count * element_bytes,
             ErrorCode::malformed_message, op, ": payload of ", header.payload_bytes, " bytes for ",
             header.count, " elements (expected ", element_bytes, " per element)");
  return static_cast<std::size_t>(header.payload_bytes);
}

// Error feedback fused into a sparse codec's encode (top-k, random-k), in place, as the host's
// ErrorFeedbackCodec::encode_in_place does: begin_sparse_feedback clears *d_flag and sets
// e = g + e, flagging a non-finite sum; the codec then encodes from e and subtracts its own
// message's entries from e (D is +0.0 elsewhere); end_sparse_feedback runs the finite_or_zero
// sweep, only when the sum was not finite everywhere. The message and residual bits of the
// general path (compensate into scratch, encode, decode, update), with three streams over the
// chunk instead of eight and no chunk-sized scratch. The caller allocates everything that can
// fail for want of memory (d_flag included) before begin_sparse_feedback changes the residual.
inline void begin_sparse_feedback(const float* d_grad, float* d_residual, std::size_t n,
                                  int* d_flag, const std::string& op) {
  check_runtime(cudaMemsetAsync(d_flag, 0, sizeof(int), static_cast<cudaStream_t>(work_stream())),
                op, "clearing the non-finite flag");
  cuda::ef_compensate_flagging(d_grad, d_residual, d_residual, n, d_flag, work_stream());
}
inline void end_sparse_feedback(float* d_residual, std::size_t n, const int* d_flag) {
  cuda::ef_zero_nonfinite_if_flagged(d_residual, n, d_flag, work_stream());
}

// The header a fused error-feedback encoder (DeviceCodecRow::encode_with_feedback) writes: its
// row's fixed header for the shape, which every fusing codec with messages of a fixed size has;
// ErrorCode::internal naming `spec` when there is none.
inline WireHeader required_fixed_header(const std::optional<WireHeader>& header,
                                        const CompressionSpec& spec, const std::string& op) {
  GZ_REQUIRE(header.has_value(), ErrorCode::internal, op, ": no fixed header for ",
             spec.to_string());
  return *header;
}

}  // namespace gradzip::compressors::device
