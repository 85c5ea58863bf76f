// Scalar reference loops for the dtype conversions. (The vectorised paths are added here,
// dispatched on active_isa(); they must give the same bits.)
#include <cstring>

#include "kernels/cast_math.h"
#include "kernels/cpu/convert.h"

namespace gradzip::kernels::cpu {

void f32_to_f16(const float* in, std::uint16_t* out, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = f32_to_f16_bits(in[i]);
}

void f32_to_bf16(const float* in, std::uint16_t* out, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = f32_to_bf16_bits(in[i]);
}

void f16_to_f32(const std::uint16_t* in, float* out, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = f16_bits_to_f32(in[i]);
}

void bf16_to_f32(const std::uint16_t* in, float* out, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) out[i] = bf16_bits_to_f32(in[i]);
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

void store_from_f32(const float* in, std::size_t count, TensorView out, std::size_t begin) noexcept {
  switch (out.dtype) {
    case DType::f32:
      std::memcpy(static_cast<float*>(out.data) + begin, in, count * sizeof(float));
      return;
    case DType::f16:
      f32_to_f16(in, static_cast<std::uint16_t*>(out.data) + begin, count);
      return;
    case DType::bf16:
      f32_to_bf16(in, static_cast<std::uint16_t*>(out.data) + begin, count);
      return;
  }
}

}  // namespace gradzip::kernels::cpu
