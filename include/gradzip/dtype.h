// Element types gradzip accepts and produces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradzip {

// Gradient element types. Accumulation inside gradzip is always f32.
enum class DType : std::uint8_t {
  f32 = 0,
  f16 = 1,   // IEEE 754 binary16
  bf16 = 2,  // bfloat16: the upper half of an f32
};

constexpr std::size_t dtype_size(DType dtype) noexcept {
  return dtype == DType::f32 ? 4 : 2;
}

constexpr std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "unknown";
}

}  // namespace gradzip
