// Shared helpers of the unit tests: deterministic data and dtype plumbing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"

namespace gradzip::testing {

// The element counts every codec is tested over (issue: {0, 1, 2, 7, 1000, 2^20+3}).
inline constexpr std::size_t kTestCounts[] = {0, 1, 2, 7, 1000, (std::size_t{1} << 20) + 3};
inline constexpr DType kTestDTypes[] = {DType::f32, DType::f16, DType::bf16};

// n samples of N(0, sigma^2) from a fixed-seed generator (same values on every run).
std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma = 1.0f);

// A tensor of `dtype` holding `values` (rounded to nearest even for f16/bf16), with accessors.
class HostTensor {
 public:
  HostTensor(DType dtype, std::size_t count);
  HostTensor(DType dtype, std::span<const float> values);

  TensorView view();
  ConstTensorView view() const;
  // Element i as f32 (exact for every dtype).
  float at(std::size_t i) const;
  std::vector<float> to_f32() const;
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
  std::size_t count_;
  std::vector<std::byte> bytes_;
};

// Encodes `in` with `codec` into a message of exactly the returned size.
std::vector<std::byte> encode_message(const Codec& codec, ConstTensorView in,
                                      const EncodeContext& ctx = {});

// Decodes `message` into a fresh f32 vector of `count` elements.
std::vector<float> decode_to_f32(const Codec& codec, std::span<const std::byte> message,
                                 std::size_t count);

}  // namespace gradzip::testing
