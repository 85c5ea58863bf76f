// Internal launch helpers shared by the kernels/cuda/*.cu files (not a public header): the
// host-side argument checks (kernels/launch_checks.h), the default block size, grid sizes for grid-stride loops, the launch check that turns
// cudaGetLastError into gradzip::Error(unsupported), grid-stride indices, and little-endian word
// loads/stores that work at any alignment. Compiled by nvcc (C++17).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gradzip/error.h"
#include "kernels/host_device.h"
#include "kernels/launch_checks.h"

namespace gradzip::kernels::cuda::detail {

// Block size of the plain grid-stride kernels (a power of two; block reductions rely on it).
constexpr int kThreads = 256;
static_assert((kThreads & (kThreads - 1)) == 0, "kThreads must be a power of two");
// Most blocks a grid-stride kernel gets; the loop covers the rest.
constexpr unsigned kMaxBlocks = 65535u * 8u;

// `blocks`, clamped to [1, cap].
inline unsigned clamp_blocks(std::uint64_t blocks, std::uint64_t cap = kMaxBlocks) {
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < cap ? blocks : cap));
}

// Blocks of kThreads for a grid-stride loop over `work` units (at least 1, at most kMaxBlocks).
inline unsigned grid_for(std::uint64_t work) {
  return clamp_blocks((work + kThreads - 1) / kThreads);
}

// Throws Error(unsupported) when the last launch failed: "<op>: kernel launch for <count>
// <unit> failed: <cuda error>".
inline void check_launch(const char* op, std::uint64_t count, const char* unit = "elements") {
  const cudaError_t status = cudaGetLastError();
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported, op, ": kernel launch for ", count,
             " ", unit, " failed: ", cudaGetErrorString(status));
}

// The host-side argument checks, shared with the emulated device's twins.
using kernels::answered_workspace_query;
using kernels::require_decode_buffers;
using kernels::require_encode_buffers;
using kernels::require_feedback_buffers;

// Decoders: the validation status starts at 0 (ok) on `stream`, before the validation pass
// ORs or writes its findings into it. A null status is a caller bug (invalid_argument).
inline void reset_decode_status(const char* op, int* d_status, cudaStream_t stream) {
  kernels::require_status(op, d_status);
  const cudaError_t reset = cudaMemsetAsync(d_status, 0, sizeof(int), stream);
  GZ_REQUIRE(reset == cudaSuccess, ErrorCode::unsupported, op, ": clearing the status failed: ",
             cudaGetErrorString(reset));
}

inline bool aligned_to(const void* pointer, std::size_t width) {
  return reinterpret_cast<std::uintptr_t>(pointer) % width == 0;
}

// First index and stride of a grid-stride loop, in 64 bits.
__device__ __forceinline__ std::uint64_t global_thread() {
  return blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ std::uint64_t grid_threads() {
  return std::uint64_t{gridDim.x} * blockDim.x;
}

// Word j of an array of little-endian words at `base` (device memory); Aligned = false reads it
// bytewise, so `base` may sit at any address.
template <typename Word, bool Aligned>
__device__ __forceinline__ Word load_word(const std::byte* base, std::uint64_t j) {
  const std::byte* at = base + j * sizeof(Word);
  if constexpr (Aligned) {
    return *reinterpret_cast<const Word*>(at);
  } else {
    std::uint64_t word = 0;
    for (std::size_t b = 0; b < sizeof(Word); ++b)
      word |= static_cast<std::uint64_t>(static_cast<unsigned char>(at[b])) << (8 * b);
    return static_cast<Word>(word);
  }
}

template <typename Word, bool Aligned>
__device__ __forceinline__ void store_word(std::byte* base, std::uint64_t j, Word word) {
  std::byte* at = base + j * sizeof(Word);
  if constexpr (Aligned) {
    *reinterpret_cast<Word*>(at) = word;
  } else {
    for (std::size_t b = 0; b < sizeof(Word); ++b)
      at[b] = static_cast<std::byte>((static_cast<std::uint64_t>(word) >> (8 * b)) & 0xFFu);
  }
}

// A little-endian f32 at any alignment.
__device__ __forceinline__ float load_f32(const std::byte* p) {
  return bits_float(load_word<std::uint32_t, false>(p, 0));
}
__device__ __forceinline__ void store_f32(std::byte* p, float value) {
  store_word<std::uint32_t, false>(p, 0, float_bits(value));
}

// f32 number j of an array at `base` (device memory): a word access when `aligned` (base is
// 4-byte aligned, decided once on the host), else bytewise (any address). The scales of the
// qsgd and sign payloads, which follow a 32-byte header inside messages at any offset.
__device__ __forceinline__ float load_f32_at(const std::byte* base, std::uint64_t j, bool aligned) {
  return aligned ? bits_float(load_word<std::uint32_t, true>(base, j)) : load_f32(base + j * sizeof(float));
}
__device__ __forceinline__ void store_f32_at(std::byte* base, std::uint64_t j, float value, bool aligned) {
  if (aligned) {
    store_word<std::uint32_t, true>(base, j, float_bits(value));
  } else {
    store_f32(base + j * sizeof(float), value);
  }
}

}  // namespace gradzip::kernels::cuda::detail
