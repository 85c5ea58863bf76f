// The CUDA casts give the bits of the CPU reference for every f16/bf16 pattern and for a sweep
// of f32 patterns. Skips, saying why, when no device is present.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <cstring>
#include <vector>

#include "kernels/cast_math.h"
#include "kernels/cuda/cast_cuda.h"
#include "gpu_test_support.h"

namespace gradzip {
namespace {

using namespace gpu_test;

class CudaCast : public DeviceTest {};

TEST_F(CudaCast, EveryHalfPatternWidensLikeTheCpu) {
  std::vector<std::uint16_t> halves(65536);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i);
  std::uint16_t* d_in = device_copy(halves);
  float* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_out, halves.size() * sizeof(float)), cudaSuccess);
  for (bool bf16 : {false, true}) {
    if (bf16) kernels::cuda::bf16_to_f32(d_in, d_out, halves.size(), nullptr);
    else kernels::cuda::f16_to_f32(d_in, d_out, halves.size(), nullptr);
    const auto got = from_device(d_out, halves.size());
    for (std::size_t i = 0; i < halves.size(); ++i) {
      const float want = bf16 ? kernels::bf16_bits_to_f32(halves[i]) : kernels::f16_bits_to_f32(halves[i]);
      ASSERT_EQ(kernels::float_bits(got[i]), kernels::float_bits(want)) << (bf16 ? "bf16 " : "f16 ") << i;
    }
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_F(CudaCast, FloatSweepNarrowsLikeTheCpu) {
  std::vector<float> values;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 65521) {
    values.push_back(kernels::bits_float(static_cast<std::uint32_t>(bits)));
  }
  float* d_in = device_copy(values);
  std::uint16_t* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_out, values.size() * sizeof(std::uint16_t)), cudaSuccess);
  for (bool bf16 : {false, true}) {
    if (bf16) kernels::cuda::f32_to_bf16(d_in, d_out, values.size(), nullptr);
    else kernels::cuda::f32_to_f16(d_in, d_out, values.size(), nullptr);
    const auto got = from_device(d_out, values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::uint16_t want = bf16 ? kernels::f32_to_bf16_bits(values[i]) : kernels::f32_to_f16_bits(values[i]);
      ASSERT_EQ(got[i], want) << (bf16 ? "bf16 of 0x" : "f16 of 0x") << std::hex << kernels::float_bits(values[i]);
    }
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

// The casts take a vector path (4 elements per access) only when both pointers are aligned for
// it: every combination of input and output offsets (0..3 elements, so both paths and their
// mixes), with counts that leave each tail length 0..3, must give the CPU's bits, and nothing
// outside [0, count) of the output may change.
TEST_F(CudaCast, AnyAlignmentAndTailGivesTheCpuBits) {
  constexpr std::size_t kBase = 4099;
  std::vector<float> values(kBase + 8);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = kernels::bits_float(static_cast<std::uint32_t>(i * 2654435761u));
  std::vector<std::uint16_t> halves(kBase + 8);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i * 40503u);
  float* d_values = device_copy(values);
  std::uint16_t* d_halves_in = device_copy(halves);
  constexpr std::uint16_t kUntouched16 = 0xABCD;
  const float untouched32 = kernels::bits_float(0x7F8ABCDEu);
  std::uint16_t* d_half_out = nullptr;
  float* d_float_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_half_out, (kBase + 8) * sizeof(std::uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_float_out, (kBase + 8) * sizeof(float)), cudaSuccess);
  for (bool bf16 : {false, true}) {
    for (std::size_t in_offset = 0; in_offset < 4; ++in_offset) {
      for (std::size_t out_offset = 0; out_offset < 4; ++out_offset) {
        for (std::size_t tail = 0; tail < 4; ++tail) {
          const std::size_t count = kBase - 3 + tail;  // kBase - 3 is a multiple of 4
          SCOPED_TRACE(testing::Message() << (bf16 ? "bf16" : "f16") << " in+" << in_offset << " out+"
                                          << out_offset << " count " << count);
          // Narrowing.
          to_device(d_half_out, std::vector<std::uint16_t>(kBase + 8, kUntouched16));
          if (bf16) kernels::cuda::f32_to_bf16(d_values + in_offset, d_half_out + out_offset, count, nullptr);
          else kernels::cuda::f32_to_f16(d_values + in_offset, d_half_out + out_offset, count, nullptr);
          const auto narrowed = from_device(d_half_out, kBase + 8);
          for (std::size_t i = 0; i < kBase + 8; ++i) {
            const bool inside = i >= out_offset && i < out_offset + count;
            const float source = inside ? values[i - out_offset + in_offset] : 0.0f;
            const std::uint16_t want = !inside ? kUntouched16
                                       : bf16  ? kernels::f32_to_bf16_bits(source)
                                               : kernels::f32_to_f16_bits(source);
            ASSERT_EQ(narrowed[i], want) << "narrowed element " << i;
          }
          // Widening.
          to_device(d_float_out, std::vector<float>(kBase + 8, untouched32));
          if (bf16) kernels::cuda::bf16_to_f32(d_halves_in + in_offset, d_float_out + out_offset, count, nullptr);
          else kernels::cuda::f16_to_f32(d_halves_in + in_offset, d_float_out + out_offset, count, nullptr);
          const auto widened = from_device(d_float_out, kBase + 8);
          for (std::size_t i = 0; i < kBase + 8; ++i) {
            const bool inside = i >= out_offset && i < out_offset + count;
            const std::uint16_t source = inside ? halves[i - out_offset + in_offset] : 0;
            const float want = !inside ? untouched32
                               : bf16  ? kernels::bf16_bits_to_f32(source)
                                       : kernels::f16_bits_to_f32(source);
            ASSERT_EQ(kernels::float_bits(widened[i]), kernels::float_bits(want)) << "widened element " << i;
          }
        }
      }
    }
  }
  cudaFree(d_values);
  cudaFree(d_halves_in);
  cudaFree(d_half_out);
  cudaFree(d_float_out);
}

}  // namespace
}  // namespace gradzip
