// The launch wrappers of kernels/cuda/*.h in a build without the CUDA toolkit
// (GRADZIP_WITH_CUDA=EMULATED), where no .cu file is compiled: each forwards to its CPU twin
// (kernels/emulated/kernel_twins.h), which is what the .cu wrapper does when the emulated device
// is active, and that is always the case here. A codec folder keeps its own forwarders
// (compressors/<codec>/emulated/no_toolkit/).
#include "kernels/emulated/kernel_twins.h"

namespace gradzip::kernels::cuda {

// ---- kernels/cuda/cast_cuda.h ----------------------------------------------------------------

void f32_to_f16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  emulated::f32_to_f16(d_in, d_out, count, stream);
}
void f32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  emulated::f32_to_bf16(d_in, d_out, count, stream);
}
void f32_to_f16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  emulated::f32_to_f16_ieee(d_in, d_out, count, stream);
}
void f32_to_bf16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  emulated::f32_to_bf16_ieee(d_in, d_out, count, stream);
}
void f16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  emulated::f16_to_f32(d_in, d_out, count, stream);
}
void bf16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  emulated::bf16_to_f32(d_in, d_out, count, stream);
}
int device_count(const char** reason) noexcept { return emulated::device_count(reason); }

// ---- kernels/cuda/ef_cuda.h ------------------------------------------------------------------

void ef_compensate(const float* d_grad, const float* d_residual, float* d_out, std::size_t count,
                   void* stream) {
  emulated::ef_compensate(d_grad, d_residual, d_out, count, stream);
}
void ef_update(const float* d_compensated, const float* d_decoded, float* d_residual,
               std::size_t count, void* stream) {
  emulated::ef_update(d_compensated, d_decoded, d_residual, count, stream);
}
void ef_cast_fused(const float* d_grad, float* d_residual, std::uint16_t* d_half_out, bool bf16,
                   std::size_t count, void* stream) {
  emulated::ef_cast_fused(d_grad, d_residual, d_half_out, bf16, count, stream);
}
void ef_compensate_flagging(const float* d_grad, const float* d_residual, float* d_out,
                            std::size_t count, int* d_flag, void* stream) {
  emulated::ef_compensate_flagging(d_grad, d_residual, d_out, count, d_flag, stream);
}
void ef_zero_nonfinite_if_flagged(float* d_residual, std::size_t count, const int* d_flag,
                                  void* stream) {
  emulated::ef_zero_nonfinite_if_flagged(d_residual, count, d_flag, stream);
}

// ---- kernels/cuda/nonfinite_cuda.h -----------------------------------------------------------

DeviceNonfiniteCount count_nonfinite(const void* d_data, std::size_t count, DType dtype,
                                     void* stream) {
  return emulated::count_nonfinite(d_data, count, dtype, stream);
}
DeviceNonfiniteCount count_nonfinite_and_beyond(const void* d_data, std::size_t count, DType dtype,
                                                std::uint32_t above_bits, void* stream) {
  return emulated::count_nonfinite_and_beyond(d_data, count, dtype, above_bits, stream);
}
void queue_count_nonfinite(const void* d_data, std::size_t count, DType dtype, bool count_beyond,
                           std::uint32_t above_bits, std::uint64_t* d_result, void* stream) {
  emulated::queue_count_nonfinite(d_data, count, dtype, count_beyond, above_bits, d_result, stream);
}

// ---- kernels/cuda/scale_cuda.h ---------------------------------------------------------------

void divide_f32(float* d_data, std::size_t count, float divisor, void* stream) {
  emulated::divide_f32(d_data, count, divisor, stream);
}

// ---- kernels/cuda/small_bytes_cuda.h ---------------------------------------------------------

void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream) {
  emulated::write_small_bytes(d_out, host, count, stream);
}
void compare_small_bytes(const std::byte* d_bytes, const std::byte* expected, std::size_t count,
                         int mismatch, int* d_status, void* stream) {
  emulated::compare_small_bytes(d_bytes, expected, count, mismatch, d_status, stream);
}
void write_rank_flags(const FlagWords* groups, std::size_t group_count, float* d_flags,
                      std::size_t total, std::size_t first, void* stream) {
  emulated::write_rank_flags(groups, group_count, d_flags, total, first, stream);
}
void words_from_flags(const float* d_flags, std::size_t count, int* d_words, void* stream) {
  emulated::words_from_flags(d_flags, count, d_words, stream);
}

// ---- kernels/cuda/sparse_cuda.h --------------------------------------------------------------

void sparse_decode_add(const std::byte* const* d_payloads, const std::uint64_t* entries,
                       std::size_t payload_count, bool wide_indices, bool half_values,
                       std::size_t n, float* d_acc, int* d_status, void* stream) {
  emulated::sparse_decode_add(d_payloads, entries, payload_count, wide_indices, half_values, n,
                              d_acc, d_status, stream);
}
void sparse_decode(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                   bool half_values, std::size_t n, float* d_out, int* d_status, void* stream) {
  emulated::sparse_decode(d_payload, entries, wide_indices, half_values, n, d_out, d_status,
                          stream);
}
void sparse_subtract_own(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                         bool half_values, std::size_t n, float* d_residual, void* stream) {
  emulated::sparse_subtract_own(d_payload, entries, wide_indices, half_values, n, d_residual,
                                stream);
}

}  // namespace gradzip::kernels::cuda
