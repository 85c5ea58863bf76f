// The host-side argument checks of the device launch wrappers, shared by the CUDA wrappers
// (kernels/cuda/launch.cuh re-exports them to the .cu files) and their CPU twins on the emulated
// device (kernels/emulated/twin_support.h), so that a twin refuses what its kernel refuses, with
// the same error. Plain C++17 (nvcc compiles the .cu files); no CUDA headers. Not a public header.
#pragma once

#include <cstddef>

#include "gradzip/error.h"

namespace gradzip::kernels {

// The two-phase workspace rule for kernels that need no workspace: a call with a null
// workspace and a size pointer is a query (reports 0 bytes and launches nothing: returns
// true); a call with a null size pointer, or with a workspace, runs.
inline bool answered_workspace_query(void* d_workspace, std::size_t* workspace_bytes) {
  if (d_workspace != nullptr || workspace_bytes == nullptr) return false;
  *workspace_bytes = 0;
  return true;
}

// Encoders: nothing to do for 0 elements (returns false); otherwise both pointers must be set.
inline bool require_encode_buffers(const char* op, const float* d_in, const std::byte* d_payload,
                                   std::size_t count) {
  if (count == 0) return false;
  GZ_REQUIRE(d_in != nullptr && d_payload != nullptr, ErrorCode::invalid_argument, op,
             ": null input or payload for ", count, " elements");
  return true;
}

// Encoders with error feedback fused in: gradient, residual and payload must all be set.
inline void require_feedback_buffers(const char* op, const float* d_grad, const float* d_residual,
                                     const std::byte* d_payload, std::size_t count) {
  GZ_REQUIRE(d_grad != nullptr && d_residual != nullptr && d_payload != nullptr,
             ErrorCode::invalid_argument, op, ": null pointer for ", count, " elements");
}

// Decoders: payload and output must be set unless there is nothing to decode.
inline void require_decode_buffers(const char* op, const std::byte* d_payload, const float* d_out,
                                   std::size_t count) {
  GZ_REQUIRE(count == 0 || (d_payload != nullptr && d_out != nullptr), ErrorCode::invalid_argument,
             op, ": null payload or output for ", count, " elements");
}

// Decoders: a null status is a caller bug.
inline void require_status(const char* op, const int* d_status) {
  GZ_REQUIRE(d_status != nullptr, ErrorCode::invalid_argument, op, ": null status");
}

}  // namespace gradzip::kernels
