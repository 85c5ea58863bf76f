// Device-side dtype conversions: the CUDA counterparts of kernels/cpu/convert.h, built from the
// same kernels/cast_math.h so the GPU gives the CPU's bits. Host-callable; no CUDA headers
// needed by includers (the stream is passed as an opaque cudaStream_t cast to void*).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradzip::kernels::cuda {

// d_out[i] = RNE f16 / bf16 bits of d_in[i], saturating (message payloads; kernels/cast_math.h).
// Asynchronous on `stream` (nullptr = default stream). Throws gradzip::Error(unsupported) when
// the launch fails (no device, bad pointer).
void f32_to_f16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
void f32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
// The same with IEEE overflow to +-Inf (values stored into f16 / bf16 tensors).
void f32_to_f16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
void f32_to_bf16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream);
// d_out[i] = exact f32 value of d_in[i].
void f16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream);
void bf16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream);

// Number of CUDA devices usable by this process, 0 when there is none or no driver; `reason`
// (if not null) receives the CUDA error text when the answer is 0.
int device_count(const char** reason) noexcept;

}  // namespace gradzip::kernels::cuda
