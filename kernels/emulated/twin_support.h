// Helpers of the CPU twins of the CUDA launch wrappers (kernels/emulated/kernel_twins.cpp and the
// codec folders' emulated/*.cpp): f32 views of device pointers, unaligned loads, and the
// host-side argument checks the .cu wrappers make (kernels/launch_checks.h), so that a twin
// refuses what its kernel refuses with the same error. Not a public header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradzip/error.h"
#include "gradzip/tensor_view.h"
#include "kernels/launch_checks.h"

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

// The wrappers' host-side argument checks (kernels/launch_checks.h), the same functions the .cu
// files call.
using kernels::answered_workspace_query;
using kernels::require_decode_buffers;
using kernels::require_encode_buffers;
using kernels::require_feedback_buffers;
using kernels::require_status;

}  // namespace gradzip::kernels::emulated
