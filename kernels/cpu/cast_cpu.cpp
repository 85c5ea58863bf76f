// Host dtype conversions: the scalar loops over kernels/cast_math.h, and the dispatch to the
// vector paths (cast_cpu_avx2.cpp, cast_cpu_avx512.cpp) on active_isa(). Every path gives the
// bits of cast_math.h; compressors/cast/tests/test_cast_codec.cpp checks each ISA against an independent
// reference.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "kernels/cast_math.h"
#include "kernels/cpu/cast_cpu_simd.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"

namespace gradzip::kernels::cpu {
namespace {

// The 16-bit side is read and written with memcpy: it may sit at any byte address.
inline std::uint16_t load16(const std::byte* in16, std::size_t i) noexcept {
  std::uint16_t bits;
  std::memcpy(&bits, in16 + 2 * i, sizeof bits);
  return bits;
}

inline void store16(std::byte* out16, std::size_t i, std::uint16_t bits) noexcept {
  std::memcpy(out16 + 2 * i, &bits, sizeof bits);
}

}  // namespace

namespace scalar {

void f32_to_f16_bytes(const float* in, std::byte* out16, std::size_t count, StreamRange) noexcept {
  for (std::size_t i = 0; i < count; ++i) store16(out16, i, f32_to_f16_bits(in[i]));
}

void f32_to_bf16_bytes(const float* in, std::byte* out16, std::size_t count, StreamRange) noexcept {
  for (std::size_t i = 0; i < count; ++i) store16(out16, i, f32_to_bf16_bits(in[i]));
}

void f16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count, StreamRange) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = f16_bits_to_f32(load16(in16, i));
}

void bf16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count, StreamRange) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = bf16_bits_to_f32(load16(in16, i));
}

void add_f16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) acc[i] += f16_bits_to_f32(load16(in16, i));
}

void add_bf16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) acc[i] += bf16_bits_to_f32(load16(in16, i));
}

}  // namespace scalar

namespace {

std::atomic<std::size_t> g_streaming_min_bytes{kDefaultStreamingMinBytes};

// Where the vector kernels may stream: from the first element whose output starts a 64-byte
// line, whole blocks of 64 elements. Outputs below the threshold, or whose address can never
// reach a 64-byte boundary in steps of one element, are not streamed.
StreamRange streaming_range(const void* out, std::size_t count,
                            std::size_t element_bytes) noexcept {
  constexpr std::size_t kLine = 64;
  constexpr std::size_t kBlockElements = 64;
  if (count * element_bytes < g_streaming_min_bytes.load(std::memory_order_relaxed)) return {};
  const auto address = reinterpret_cast<std::uintptr_t>(out);
  if (address % element_bytes != 0) return {};
  const std::size_t begin = (kLine - address % kLine) % kLine / element_bytes;
  if (begin >= count) return {};
  return {begin, begin + (count - begin) / kBlockElements * kBlockElements};
}

}  // namespace

void set_streaming_min_bytes(std::size_t bytes) noexcept { g_streaming_min_bytes.store(bytes); }
void reset_streaming_min_bytes() noexcept {
  g_streaming_min_bytes.store(kDefaultStreamingMinBytes);
}

// One dispatcher per kernel: the same arguments go to the path active_isa() names.
#define GZ_DISPATCH_CAST(kernel, ...)                     \
  switch (active_isa()) {                                 \
    case Isa::avx512: return avx512::kernel(__VA_ARGS__); \
    case Isa::avx2: return avx2::kernel(__VA_ARGS__);     \
    case Isa::scalar: break;                              \
  }                                                       \
  return scalar::kernel(__VA_ARGS__)

void f32_to_f16_bytes(const float* in, std::byte* out16, std::size_t count) noexcept {
  GZ_DISPATCH_CAST(f32_to_f16_bytes, in, out16, count, streaming_range(out16, count, 2));
}

void f32_to_bf16_bytes(const float* in, std::byte* out16, std::size_t count) noexcept {
  GZ_DISPATCH_CAST(f32_to_bf16_bytes, in, out16, count, streaming_range(out16, count, 2));
}

void f16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count) noexcept {
  GZ_DISPATCH_CAST(f16_bytes_to_f32, in16, out, count, streaming_range(out, count, 4));
}

void bf16_bytes_to_f32(const std::byte* in16, float* out, std::size_t count) noexcept {
  GZ_DISPATCH_CAST(bf16_bytes_to_f32, in16, out, count, streaming_range(out, count, 4));
}

void add_f16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  GZ_DISPATCH_CAST(add_f16_bytes_to_f32, in16, acc, count);
}

void add_bf16_bytes_to_f32(const std::byte* in16, float* acc, std::size_t count) noexcept {
  GZ_DISPATCH_CAST(add_bf16_bytes_to_f32, in16, acc, count);
}

#undef GZ_DISPATCH_CAST

// The convert.h API: typed (aligned) 16-bit pointers, same kernels.

void f32_to_f16(const float* in, std::uint16_t* out, std::size_t count) noexcept {
  f32_to_f16_bytes(in, reinterpret_cast<std::byte*>(out), count);
}

void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t count) noexcept {
  f32_to_bf16_bytes(in, reinterpret_cast<std::byte*>(out), count);
}

void f16_to_f32(const std::uint16_t* in, float* out, std::size_t count) noexcept {
  f16_bytes_to_f32(reinterpret_cast<const std::byte*>(in), out, count);
}

void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t count) noexcept {
  bf16_bytes_to_f32(reinterpret_cast<const std::byte*>(in), out, count);
}

void load_as_f32(ConstTensorView in, std::size_t begin, std::size_t count, float* out) noexcept {
  switch (in.dtype) {
    case DType::f32:
      std::memcpy(out, static_cast<const float*>(in.data) + begin, count * sizeof(float));
      return;
    case DType::f16:
      f16_to_f32(static_cast<const std::uint16_t*>(in.data) + begin, out, count);
      return;
    case DType::bf16:
      bf16_to_f32(static_cast<const std::uint16_t*>(in.data) + begin, out, count);
      return;
  }
}

namespace {

// The saturating vector conversion, then Inf where IEEE rounding overflows: block by block, so
// the second look at each block's f32 values finds them in L1. `overflows_from` is the first
// magnitude (f32 bits) that IEEE rounds to Inf; `infinity` the format's Inf bits.
void narrow_ieee(const float* in, std::uint16_t* out, std::size_t count,
                 void (*saturating)(const float*, std::uint16_t*, std::size_t) noexcept,
                 std::uint32_t overflows_from, std::uint16_t infinity) noexcept {
  for (std::size_t begin = 0; begin < count; begin += kConvertBlock) {
    const std::size_t n = std::min(kConvertBlock, count - begin);
    saturating(in + begin, out + begin, n);
    for (std::size_t i = begin; i < begin + n; ++i) {
      const std::uint32_t bits = float_bits(in[i]);
      const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
      if (magnitude >= overflows_from && magnitude < 0x7F800000u)
        out[i] = static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | infinity);
    }
  }
}

}  // namespace

void f32_to_f16_ieee(const float* in, std::uint16_t* out, std::size_t count) noexcept {
  narrow_ieee(in, out, count, f32_to_f16, 0x477FF000u, 0x7C00u);
}

void f32_to_bf16_ieee(const float* in, std::uint16_t* out, std::size_t count) noexcept {
  narrow_ieee(in, out, count, f32_to_bf16, 0x7F7F8000u, 0x7F80u);
}

void store_from_f32(const float* in, std::size_t count, TensorView out,
                    std::size_t begin) noexcept {
  switch (out.dtype) {
    case DType::f32:
      std::memcpy(static_cast<float*>(out.data) + begin, in, count * sizeof(float));
      return;
    case DType::f16: f32_to_f16_ieee(in, static_cast<std::uint16_t*>(out.data) + begin, count); return;
    case DType::bf16: f32_to_bf16_ieee(in, static_cast<std::uint16_t*>(out.data) + begin, count); return;
  }
}

}  // namespace gradzip::kernels::cpu
