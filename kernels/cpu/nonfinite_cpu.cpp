#include "kernels/cpu/nonfinite_cpu.h"

#include <cstring>

#include "kernels/cast_math.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cpu {
namespace {

// Element i of [begin, begin + count) read as Bits with memcpy (a plain load once compiled):
// the tensor's memory holds floats or 16-bit values of the caller's type, not Bits.
template <typename Bits>
struct ElementBits {
  const unsigned char* bytes;
  Bits operator()(std::size_t i) const noexcept {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(Bits), sizeof bits);
    return bits;
  }
};
template <typename Bits>
ElementBits<Bits> element_bits(const void* data, std::size_t begin) noexcept {
  return {static_cast<const unsigned char*>(data) + begin * sizeof(Bits)};
}

// How many of the `count` elements satisfy `first_test`, and how many `second_test`, in one
// pass with a branch-free body the compiler vectorises (a mask, an and and a compare per element
// and test). 32-bit counts per block keep the vector lanes as narrow as the elements (a 64-bit
// sum per element halves the throughput); a block never holds more than 2^32 - 1 elements.
struct TwoCounts {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
};
template <typename Bits, typename FirstTest, typename SecondTest>
TwoCounts count_where(ElementBits<Bits> at, std::size_t count, FirstTest first_test,
                      SecondTest second_test) noexcept {
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  TwoCounts found;
  for (std::size_t block = 0; block < count; block += kBlock) {
    const std::size_t end = block + kBlock < count ? block + kBlock : count;
    std::uint32_t first_in_block = 0, second_in_block = 0;
    for (std::size_t i = block; i < end; ++i) {
      const Bits bits = at(i);
      first_in_block += first_test(bits) ? 1u : 0u;
      second_in_block += second_test(bits) ? 1u : 0u;
    }
    found.first += first_in_block;
    found.second += second_in_block;
  }
  return found;
}

// A second test that counts nothing (the compiler drops it).
constexpr auto kNothing = [](auto) { return false; };

// The first index of an element satisfying `test` (there is one).
template <typename Bits, typename Test>
std::uint64_t first_where(ElementBits<Bits> at, std::size_t count, Test test) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    if (test(at(i))) return i;
  }
  return 0;
}

// The non-finite count; the first index is looked for only when the count says there is one.
template <typename Bits, typename IsNonfinite>
NonfiniteCount count_in(const void* data, std::size_t begin, std::size_t count,
                        IsNonfinite is_nonfinite) noexcept {
  const ElementBits<Bits> at = element_bits<Bits>(data, begin);
  NonfiniteCount result{count_where(at, count, is_nonfinite, kNothing).first, 0};
  if (result.count != 0) result.first = first_where(at, count, is_nonfinite);
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

// The non-finite count and, in the same pass, the count of finite magnitudes beyond the
// limit (`is_beyond`: the shared bit test of kernels/nonfinite_math.h).
template <typename Bits, typename IsNonfinite, typename IsBeyond>
RangeCount count_in_range(const void* data, std::size_t begin, std::size_t count,
                          IsNonfinite is_nonfinite, IsBeyond is_beyond) noexcept {
  const ElementBits<Bits> at = element_bits<Bits>(data, begin);
  const TwoCounts found = count_where(at, count, is_nonfinite, is_beyond);
  RangeCount result{NonfiniteCount{found.first, 0}, found.second};
  if (found.first != 0) result.nonfinite.first = first_where(at, count, is_nonfinite);
  return result;
}

}  // namespace

std::uint32_t beyond_threshold_bits(DType dtype, float limit) noexcept {
  switch (dtype) {
    case DType::f32:
      return first_pattern_above(limit, 0x7F800000u, [](std::uint32_t m) {
        float value;
        std::memcpy(&value, &m, sizeof value);
        return value;
      });
    case DType::f16:
      return first_pattern_above(
          limit, 0x7C00u, [](std::uint32_t m) { return f16_bits_to_f32(static_cast<std::uint16_t>(m)); });
    case DType::bf16:
      return first_pattern_above(
          limit, 0x7F80u, [](std::uint32_t m) { return bf16_bits_to_f32(static_cast<std::uint16_t>(m)); });
  }
  return 0;
}

RangeCount count_nonfinite_and_beyond(ConstTensorView tensor, std::size_t begin, std::size_t count,
                                      float limit) noexcept {
  if (count == 0) return {};
  const std::uint32_t above = beyond_threshold_bits(tensor.dtype, limit);
  switch (tensor.dtype) {
    case DType::f32:
      return count_in_range<std::uint32_t>(
          tensor.data, begin, count, [](std::uint32_t b) { return f32_bits_nonfinite(b); },
          [above](std::uint32_t b) { return f32_bits_beyond(b, above); });
    case DType::f16: {
      const auto above16 = static_cast<std::uint16_t>(above);
      return count_in_range<std::uint16_t>(
          tensor.data, begin, count, [](std::uint16_t b) { return f16_bits_nonfinite(b); },
          [above16](std::uint16_t b) { return f16_bits_beyond(b, above16); });
    }
    case DType::bf16: {
      const auto above16 = static_cast<std::uint16_t>(above);
      return count_in_range<std::uint16_t>(
          tensor.data, begin, count, [](std::uint16_t b) { return bf16_bits_nonfinite(b); },
          [above16](std::uint16_t b) { return bf16_bits_beyond(b, above16); });
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
