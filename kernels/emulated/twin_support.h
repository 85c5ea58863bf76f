// Helpers of the CPU twins of the CUDA launch wrappers (kernels/emulated/kernel_twins.cpp and the
// codec folders' emulated/*.cpp): f32 views of device pointers, unaligned loads, and the
// host-side argument checks that the .cu wrappers make through kernels/cuda/launch.cuh, so that a
// twin refuses what its kernel refuses with the same error. Not a public header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradzip/error.h"
#include "gradzip/tensor_view.h"

namespace gradzip::kernels::emulated {

inline ConstTensorView f32_view(const float* data, std::size_t count) {
  return ConstTensorView{data, count, DType::f32, Device{}};
}
inline TensorView f32_view(float* data, std::size_t count) {
  return TensorView{data, count, DType::f32, Device{}};
}

inline std::uint32_t load_u32(const std::byte* at) {
  std::uint32_t word;
  std::memcpy(&word, at, sizeof word);
  return word;
}
inline std::uint64_t load_u64(const std::byte* at) {
  std::uint64_t word;
  std::memcpy(&word, at, sizeof word);
  return word;
}
inline std::uint16_t load_u16(const std::byte* at) {
  std::uint16_t word;
  std::memcpy(&word, at, sizeof word);
  return word;
}

inline void store_status(int* d_status, int value) { *d_status = value; }

// launch.cuh's answered_workspace_query: a null workspace with a size pointer is a query.
inline bool answered_workspace_query(void* d_workspace, std::size_t* workspace_bytes) {
  if (d_workspace != nullptr || workspace_bytes == nullptr) return false;
  *workspace_bytes = 0;
  return true;
}

// launch.cuh's require_encode_buffers.
inline bool require_encode_buffers(const char* op, const float* d_in, const std::byte* d_payload,
                                   std::size_t count) {
  if (count == 0) return false;
  GZ_REQUIRE(d_in != nullptr && d_payload != nullptr, ErrorCode::invalid_argument, op,
             ": null input or payload for ", count, " elements");
  return true;
}

// launch.cuh's reset_decode_status, host half: the null check (the reset itself is the first
// step of the twin's queued operation).
inline void require_status(const char* op, const int* d_status) {
  GZ_REQUIRE(d_status != nullptr, ErrorCode::invalid_argument, op, ": null status");
}

}  // namespace gradzip::kernels::emulated
