// Internal to the host cast kernels and the fp16/bf16 codec: the vector paths of the dtype
// conversions (cast_cpu_avx2.cpp, cast_cpu_avx512.cpp) and the dispatching entry points whose
// 16-bit side may sit at ANY byte address (cast_cpu.cpp).
//
// The 16-bit side is a `std::byte*` rather than a `std::uint16_t*` because codec payloads sit
// at any alignment inside send/receive buffers, where forming a misaligned uint16_t* is
// undefined. Element i of the 16-bit side is bytes [2i, 2i+2), little-endian. The f32 side is a
// plain float*: a caller's tensor or a stack block, aligned for float.
//
// Every path gives the bits of kernels/cast_math.h: f32 -> f16/bf16 rounds to nearest even;
// f16/bf16 -> f32 is exact; f32 -> f16/bf16 and f16 -> f32 turn a NaN into a quiet NaN of the
// same sign keeping the payload's top bits, bf16 -> f32 keeps every bit. No result depends on
// MXCSR (rounding mode, FTZ, DAZ) except the float additions of the add_* kernels, which are
// one IEEE f32 add per element on every path.
#pragma once

#include <cstddef>

namespace gradzip::kernels::cpu {

// ---- dispatching entry points (active_isa()), any alignment of the 16-bit side --------------

// out16[i] = RNE(in[i]) as binary16 / bfloat16 bits, for i < count.
void f32_to_f16_bytes(const float* in, std::byte* out16, std::size_t count) noexcept;
void f32_to_bf16_bytes(const float* in, std::byte* out16, std::size_t count) noexcept;
// out[i] = in16[i] widened exactly to f32.
void f16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count) noexcept;
void bf16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count) noexcept;
// acc[i] += in16[i] widened to f32.
void add_f16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept;
void add_bf16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept;

// Outputs of at least this many bytes are written with non-temporal (streaming) stores: a
// conversion that large does not fit the caches anyway, and streaming skips reading each output
// line before overwriting it (2-3x faster encodes of 16M elements on the dev EPYC). Smaller
// outputs, e.g. a pipeline chunk about to be sent, stay cached. Both store kinds give the same
// bits.
inline constexpr std::size_t kDefaultStreamingMinBytes = std::size_t{16} << 20;

// For tests: stream outputs of at least `bytes` bytes (0: every output that can be aligned).
// Not thread-safe against conversions running concurrently.
void set_streaming_min_bytes(std::size_t bytes) noexcept;
void reset_streaming_min_bytes() noexcept;

// ---- per-ISA implementations, called only by the dispatchers above --------------------------

// The elements [begin, end) whose output the narrowing/widening kernels write with streaming
// stores: the output of element `begin` starts on a 64-byte boundary and end - begin is a
// multiple of 64 elements. Empty (begin == end) means cached stores throughout.
struct StreamRange {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// Each namespace holds the same kernels with the contracts above; `stream` is a hint the scalar
// path ignores. The avx2 ones need AVX2 + F16C, the avx512 ones AVX-512 F/BW/VL + F16C; the
// dispatcher checks active_isa().
#define GZ_CAST_KERNEL_DECLARATIONS                                                         \
  void f32_to_f16_bytes(const float* in, std::byte* out16, std::size_t count,               \
                        StreamRange stream) noexcept;                                       \
  void f32_to_bf16_bytes(const float* in, std::byte* out16, std::size_t count,              \
                         StreamRange stream) noexcept;                                      \
  void f16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count,               \
                        StreamRange stream) noexcept;                                       \
  void bf16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count,              \
                         StreamRange stream) noexcept;                                      \
  void add_f16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept; \
  void add_bf16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept;

namespace scalar {
GZ_CAST_KERNEL_DECLARATIONS
}  // namespace scalar
namespace avx2 {
GZ_CAST_KERNEL_DECLARATIONS
}  // namespace avx2
namespace avx512 {
GZ_CAST_KERNEL_DECLARATIONS
}  // namespace avx512

#undef GZ_CAST_KERNEL_DECLARATIONS

}  // namespace gradzip::kernels::cpu
