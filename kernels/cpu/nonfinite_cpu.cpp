#include "kernels/cpu/nonfinite_cpu.h"

#include <cstring>

#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cpu {
namespace {

// Counts with a branch-free body (the compiler vectorises it: a mask, an and and a compare per
// element); the first index is looked for only when the count says there is one.
// The elements are read with memcpy (a plain load once compiled): the tensor's memory holds
// floats or 16-bit values of the caller's type, not Bits.
template <typename Bits, typename IsNonfinite>
NonfiniteCount count_in(const void* data, std::size_t begin, std::size_t count,
                        IsNonfinite is_nonfinite) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data) + begin * sizeof(Bits);
  const auto at = [bytes](std::size_t i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(Bits), sizeof bits);
    return bits;
  };
  // 32-bit counts per block keep the vector lanes as narrow as the elements (a 64-bit sum per
  // element halves the throughput); a block never holds more than 2^32 - 1 elements.
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  std::uint64_t found = 0;
  for (std::size_t block = 0; block < count; block += kBlock) {
    const std::size_t end = block + kBlock < count ? block + kBlock : count;
    std::uint32_t in_block = 0;
    for (std::size_t i = block; i < end; ++i) in_block += is_nonfinite(at(i)) ? 1u : 0u;
    found += in_block;
  }
  NonfiniteCount result{found, 0};
  if (found == 0) return result;
  for (std::size_t i = 0; i < count; ++i) {
    if (is_nonfinite(at(i))) {
      result.first = i;
      break;
    }
  }
  return result;
}

}  // namespace

NonfiniteCount count_nonfinite(ConstTensorView tensor, std::size_t begin, std::size_t count) noexcept {
  if (count == 0) return {};
  switch (tensor.dtype) {
    case DType::f32:
      return count_in<std::uint32_t>(tensor.data, begin, count,
                                     [](std::uint32_t b) { return f32_bits_nonfinite(b); });
    case DType::f16:
      return count_in<std::uint16_t>(tensor.data, begin, count,
                                     [](std::uint16_t b) { return f16_bits_nonfinite(b); });
    case DType::bf16:
      return count_in<std::uint16_t>(tensor.data, begin, count,
                                     [](std::uint16_t b) { return bf16_bits_nonfinite(b); });
  }
  return {};
}

}  // namespace gradzip::kernels::cpu
