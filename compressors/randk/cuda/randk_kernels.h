// Device side of the `randk` codec (compressors/randk/randk_codec.cpp): gather the k values a
// shared key selects, and scatter / scatter-add them back. The indices come from
// compressors/randk/randk_math.h, one thread per entry, so the GPU keeps exactly the elements
// the CPU keeps and writes exactly the CPU payload's value bytes.
//
// The payload is the 24-byte key followed by the k values. The key is written on the host
// (kernels::randk_write_key, shared with compressors/randk/randk_codec.cpp) into the message
// header area; randk_gather writes the values area only, which may sit at any alignment.
//
// Host-callable; no CUDA headers needed by includers (the stream is a cudaStream_t cast to
// void*, nullptr = the default stream). Asynchronous, no allocation, no workspace needed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/randk/randk_math.h"
#include "gradzip/error.h"
#include "kernels/host_device.h"

namespace gradzip::kernels::cuda {

// Bytes of the values area for k entries: 4 per f32 value, 2 per f16 value.
inline constexpr std::size_t randk_values_bytes(std::size_t k, bool half_values) noexcept {
  return k * (half_values ? 2 : 4);
}

// The wrappers' size check, host-side and shared with their twins: throws
// gradzip::Error(invalid_argument) naming `op` unless k <= n, and k >= 1 when n >= 1.
inline void check_randk_sizes(const char* op, std::size_t n, std::size_t k) {
  GZ_REQUIRE(k <= n && (n == 0 || k >= 1), ErrorCode::invalid_argument, op, ": k = ", k,
             " for a chunk of ", n, " elements (expected 1 <= k <= n, or k = 0 for n = 0)");
}

// The launch wrappers, declared once for the CUDA kernels (namespace cuda) and for their CPU
// twins on the emulated device (namespace emulated, compressors/randk/emulated/randk_twins.cpp;
// same contracts, queued as one operation on the emulated device's stream). Every one checks
// its sizes with check_randk_sizes first (nothing launched when they are wrong); launch
// failures: gradzip::Error(unsupported).
//   randk_gather (encode): value j = d_in[index_j] for j < k, written to d_values_out (device
//     memory, any alignment) as f32 bits, or as f16 bits rounded to nearest even when
//     half_values: the bytes compressors/randk/randk_codec.cpp puts after the key for the same
//     input and key. k == 0 launches nothing.
//   randk_scatter_add (decode_add): d_acc[index_j] += value j for j < k (one IEEE f32 add per
//     kept element; the indices of one payload are distinct, so no atomics and no order
//     question). Other elements are not touched. d_values is the values area (device memory,
//     any alignment); the message's header, validated on the host, gives k and n.
//   randk_scatter (decode): d_out = +0.0 everywhere except d_out[index_j] = value j.
//   randk_subtract_own: error feedback's residual update for a message this rank just encoded:
//     d_residual[index_j] = finite_or_zero(d_residual[index_j] - value j), other elements
//     untouched (compressors/randk/randk_cpu.h: randk_subtract_from).
#define GZ_RANDK_KERNEL_DECLARATIONS                                                           \
  void randk_gather(const float* d_in, std::size_t n, const RandkKey& key, std::size_t k,     \
                    bool half_values, std::byte* d_values_out, void* stream);                 \
  void randk_scatter_add(const std::byte* d_values, std::size_t k, bool half_values,          \
                         const RandkKey& key, std::size_t n, float* d_acc, void* stream);     \
  void randk_scatter(const std::byte* d_values, std::size_t k, bool half_values,              \
                     const RandkKey& key, std::size_t n, float* d_out, void* stream);         \
  void randk_subtract_own(const std::byte* d_values, std::size_t k, bool half_values,         \
                          const RandkKey& key, std::size_t n, float* d_residual, void* stream);
GZ_RANDK_KERNEL_DECLARATIONS

}  // namespace gradzip::kernels::cuda

namespace gradzip::kernels::emulated {
GZ_RANDK_KERNEL_DECLARATIONS
}  // namespace gradzip::kernels::emulated
#undef GZ_RANDK_KERNEL_DECLARATIONS
