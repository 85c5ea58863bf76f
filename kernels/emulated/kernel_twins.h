// The CPU twins of the CUDA kernel launch wrappers of kernels/cuda/*.h, for the emulated device
// (kernels/emulated/emulated_device.h). Not a public header.
//
// Each function here has the signature and the contract of the kernels::cuda:: function of the
// same name (its header is the contract): the same host-side refusals (the same gradzip::Error
// codes, thrown before anything is queued), the same two-phase workspace queries, the same
// bytes and status words written, asynchronous on the given stream. The device work of a call
// is ONE operation queued with emulated::enqueue() on `stream`; inside it every device pointer
// the CUDA kernels would read or write is checked with emulated::require_device_range() (a host
// pointer there is a launch failure, as a GPU faults on it), then the bytes are computed by the
// CPU codec's loops (kernels/cpu/) and the shared element math (kernels/*_math.h), so they are
// the CPU codec's bytes, which is what the CUDA kernels are specified to write. KernelVariant
// arguments are accepted and ignored: both variants write the same bytes.
//
// Differences from the CUDA functions, where a twin cannot be the same:
//  - count_nonfinite / count_nonfinite_and_beyond wait for their queued operation (a future),
//    not with cudaStreamSynchronize; the wait is counted as one host wait at the .cu's site
//    ("cuda.count_nonfinite", "cuda.count_nonfinite_and_beyond") through count_polled_wait
//    (kernels/cuda/device_runtime.h), where the .cu counts it through synchronize_stream. A
//    failed operation (e.g. a host pointer) throws gradzip::Error(unsupported) from the wait.
//  - device_count returns emulated::device_count() and sets *reason to nullptr when it is > 0.
//
// Included by the .cu files, so it stays C++17 (nvcc is given -std=c++17).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/dtype.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/ef_cuda.h"
#include "kernels/cuda/kernel_variant.h"
#include "kernels/cuda/nonfinite_cuda.h"
#include "kernels/cuda/scale_cuda.h"
#include "kernels/cuda/small_bytes_cuda.h"
#include "kernels/cuda/sparse_cuda.h"

namespace gradzip::kernels::emulated {

// ---- kernels/cuda/cast_cuda.h ----------------------------------------------------------------
void f32_to_f16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
void f32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
void f32_to_f16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
void f32_to_bf16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
void f16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream);
void bf16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream);
int device_count(const char** reason) noexcept;

// ---- kernels/cuda/ef_cuda.h ------------------------------------------------------------------
void ef_compensate(const float* d_grad, const float* d_residual, float* d_out, std::size_t count,
                   void* stream);
void ef_update(const float* d_compensated, const float* d_decoded, float* d_residual,
               std::size_t count, void* stream);
void ef_cast_fused(const float* d_grad, float* d_residual, std::uint16_t* d_half_out, bool bf16,
                   std::size_t count, void* stream);
void ef_compensate_flagging(const float* d_grad, const float* d_residual, float* d_out,
                            std::size_t count, int* d_flag, void* stream);
void ef_zero_nonfinite_if_flagged(float* d_residual, std::size_t count, const int* d_flag,
                                  void* stream);

// ---- kernels/cuda/nonfinite_cuda.h -----------------------------------------------------------
cuda::DeviceNonfiniteCount count_nonfinite(const void* d_data, std::size_t count, DType dtype,
                                           void* stream);
cuda::DeviceNonfiniteCount count_nonfinite_and_beyond(const void* d_data, std::size_t count,
                                                      DType dtype, std::uint32_t above_bits,
                                                      void* stream);
void queue_count_nonfinite(const void* d_data, std::size_t count, DType dtype, bool count_beyond,
                           std::uint32_t above_bits, std::uint64_t* d_result, void* stream);

// ---- kernels/cuda/scale_cuda.h ---------------------------------------------------------------
void divide_f32(float* d_data, std::size_t count, float divisor, void* stream);

// ---- kernels/cuda/small_bytes_cuda.h ---------------------------------------------------------
void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream);
void compare_small_bytes(const std::byte* d_bytes, const std::byte* expected, std::size_t count,
                         int mismatch, int* d_status, void* stream);
void write_rank_flags(const cuda::FlagWords* groups, std::size_t group_count, float* d_flags,
                      std::size_t total, std::size_t first, void* stream);
void words_from_flags(const float* d_flags, std::size_t count, int* d_words, void* stream);

// ---- kernels/cuda/sparse_cuda.h --------------------------------------------------------------
void sparse_decode_add(const std::byte* const* d_payloads, const std::uint64_t* entries,
                       std::size_t payload_count, bool wide_indices, bool half_values,
                       std::size_t n, float* d_acc, int* d_status, void* stream);
void sparse_decode(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                   bool half_values, std::size_t n, float* d_out, int* d_status, void* stream);
void sparse_subtract_own(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                         bool half_values, std::size_t n, float* d_residual, void* stream);

}  // namespace gradzip::kernels::emulated
