// The CUDA non-finite and wire-range counts (kernels/cuda/nonfinite_cuda.h) against the CPU
// counts (kernels/cpu/nonfinite_cpu.h) they share their bit tests with: every 16-bit pattern of
// f16 and bf16, f32 values at the boundary, and a large random tensor with planted values, at
// the limits the Communicator uses. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpu_test_support.h"
#include "kernels/cpu/nonfinite_cpu.h"
#include "kernels/cuda/nonfinite_cuda.h"

namespace gradzip {
namespace {

using gpu_test::DeviceArray;
using gpu_test::StreamTest;

class CudaRangeCount : public StreamTest {};

template <typename T>
void expect_same_counts(const std::vector<T>& host, DType dtype, float limit, void* stream) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " limit " << limit);
  DeviceArray<T> device(host);
  const kernels::cpu::RangeCount cpu = kernels::cpu::count_nonfinite_and_beyond(
      ConstTensorView(host.data(), host.size(), dtype), 0, host.size(), limit);
  const kernels::cuda::DeviceNonfiniteCount gpu = kernels::cuda::count_nonfinite_and_beyond(
      device.get(), host.size(), dtype, kernels::cpu::beyond_threshold_bits(dtype, limit), stream);
  EXPECT_EQ(gpu.beyond, cpu.beyond);
  EXPECT_EQ(gpu.count, cpu.nonfinite.count);
  EXPECT_EQ(gpu.first, cpu.nonfinite.first);
  // The count alone (no range) agrees too and reports nothing beyond.
  const kernels::cuda::DeviceNonfiniteCount plain =
      kernels::cuda::count_nonfinite(device.get(), host.size(), dtype, stream);
  EXPECT_EQ(plain.count, cpu.nonfinite.count);
  EXPECT_EQ(plain.beyond, 0u);
}

TEST_F(CudaRangeCount, Every16BitPatternMatchesTheCpu) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  for (const float limit : {65504.0f, 65504.0f / 3.0f, 1.0f, 0.1f, 3.0e38f}) {
    expect_same_counts(all, DType::f16, limit, stream());
    expect_same_counts(all, DType::bf16, limit, stream());
  }
}

TEST_F(CudaRangeCount, F32BoundaryAndARandomTensorMatchTheCpu) {
  const float limit = 65504.0f;
  const float above = std::nextafter(limit, std::numeric_limits<float>::infinity());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edges = {limit, -limit, above, -above, 1e30f, -3.4e38f, inf, -inf,
                                    std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1.0f};
  expect_same_counts(edges, DType::f32, limit, stream());

  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1000.0f);
  std::vector<float> large(3'000'017);
  for (float& x : large) x = normal(random);
  for (std::size_t i = 11; i < large.size(); i += 100'003) large[i] = 70000.0f;  // planted
  large[2'000'000] = std::numeric_limits<float>::quiet_NaN();
  for (const float at : {limit, limit / 4.0f, 1000.0f}) expect_same_counts(large, DType::f32, at, stream());
}

}  // namespace
}  // namespace gradzip
