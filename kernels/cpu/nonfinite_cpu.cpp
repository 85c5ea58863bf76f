#include "kernels/cpu/nonfinite_cpu.h"

#include <cstring>

#include "kernels/cast_math.h"
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

// The smallest magnitude bit pattern of `Bits` (f32: 31 bits, f16 / bf16: 15 bits) whose value
// exceeds `limit`, by binary search (magnitudes order like their bit patterns); `value(m)` is the
// value of magnitude pattern m. Returns `infinity_bits` when no finite pattern exceeds it.
template <typename Value>
std::uint32_t first_pattern_above(float limit, std::uint32_t infinity_bits, Value value) noexcept {
  std::uint32_t low = 0, high = infinity_bits;  // value(high) > limit always (+Inf)
  while (low < high) {
    const std::uint32_t mid = low + (high - low) / 2;
    if (value(mid) > limit) high = mid;
    else low = mid + 1;
  }
  return low;
}

// count_in with a second, branch-free count in the same pass: finite magnitudes at or above
// `above` (a magnitude bit pattern) and below `infinity`.
template <typename Bits, typename IsNonfinite>
RangeCount count_in_range(const void* data, std::size_t begin, std::size_t count,
                          IsNonfinite is_nonfinite, Bits magnitude_mask, Bits above,
                          Bits infinity) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data) + begin * sizeof(Bits);
  const auto at = [bytes](std::size_t i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(Bits), sizeof bits);
    return bits;
  };
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  std::uint64_t beyond = 0;
  for (std::size_t block = 0; block < count; block += kBlock) {
    const std::size_t end = block + kBlock < count ? block + kBlock : count;
    std::uint32_t in_block = 0;
    for (std::size_t i = block; i < end; ++i) {
      const Bits magnitude = static_cast<Bits>(at(i) & magnitude_mask);
      in_block += (magnitude >= above && magnitude < infinity) ? 1u : 0u;
    }
    beyond += in_block;
  }
  return RangeCount{count_in<Bits>(data, begin, count, is_nonfinite), beyond};
}

}  // namespace

RangeCount count_nonfinite_and_beyond(ConstTensorView tensor, std::size_t begin, std::size_t count,
                                      float limit) noexcept {
  if (count == 0) return {};
  switch (tensor.dtype) {
    case DType::f32: {
      const std::uint32_t above = first_pattern_above(limit, 0x7F800000u, [](std::uint32_t m) {
        float value;
        std::memcpy(&value, &m, sizeof value);
        return value;
      });
      return count_in_range<std::uint32_t>(tensor.data, begin, count,
                                           [](std::uint32_t b) { return f32_bits_nonfinite(b); },
                                           0x7FFFFFFFu, above, 0x7F800000u);
    }
    case DType::f16: {
      const auto above = static_cast<std::uint16_t>(first_pattern_above(
          limit, 0x7C00u, [](std::uint32_t m) { return f16_bits_to_f32(static_cast<std::uint16_t>(m)); }));
      return count_in_range<std::uint16_t>(tensor.data, begin, count,
                                           [](std::uint16_t b) { return f16_bits_nonfinite(b); },
                                           std::uint16_t{0x7FFF}, above, std::uint16_t{0x7C00});
    }
    case DType::bf16: {
      const auto above = static_cast<std::uint16_t>(first_pattern_above(
          limit, 0x7F80u, [](std::uint32_t m) { return bf16_bits_to_f32(static_cast<std::uint16_t>(m)); }));
      return count_in_range<std::uint16_t>(tensor.data, begin, count,
                                           [](std::uint16_t b) { return bf16_bits_nonfinite(b); },
                                           std::uint16_t{0x7FFF}, above, std::uint16_t{0x7F80});
    }
  }
  return {};
}

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
