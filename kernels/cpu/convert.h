// Host conversions between gradient dtypes and the f32 that codecs compute in.
// Vectorised where the CPU allows (kernels/cpu/cast_cpu.cpp); every path gives the bits of
// kernels/cast_math.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/tensor_view.h"

namespace gradzip::kernels::cpu {

// f32 -> f16 / bf16 bits, round to nearest even, saturating (message payloads:
// kernels/cast_math.h's f32_to_f16_bits).
void f32_to_f16(const float* in, std::uint16_t* out, std::size_t count) noexcept;
void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t count) noexcept;
// The same with IEEE overflow to +-Inf (tensor stores: f32_to_f16_bits_ieee).
void f32_to_f16_ieee(const float* in, std::uint16_t* out, std::size_t count) noexcept;
void f32_to_bf16_ieee(const float* in, std::uint16_t* out, std::size_t count) noexcept;
// f16 / bf16 bits -> f32 (exact).
void f16_to_f32(const std::uint16_t* in, float* out, std::size_t count) noexcept;
void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t count) noexcept;

// out[i] = element (begin + i) of `in` as f32, for i < count.
void load_as_f32(ConstTensorView in, std::size_t begin, std::size_t count, float* out) noexcept;
// Element (begin + i) of `out` = in[i] converted to out.dtype: IEEE round to nearest even, so
// values beyond an f16 / bf16 tensor's range become +-Inf (f32_to_f16_ieee).
void store_from_f32(const float* in, std::size_t count, TensorView out, std::size_t begin) noexcept;

// Elements a codec converts at a time when its input is not f32 (fits L1 with room to spare).
inline constexpr std::size_t kConvertBlock = 4096;

}  // namespace gradzip::kernels::cpu
