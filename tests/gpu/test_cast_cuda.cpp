// The CUDA casts give the bits of the CPU reference for every f16/bf16 pattern and for a sweep
// of f32 patterns. Skips, saying why, when no device is present.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

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

}  // namespace
}  // namespace gradzip
