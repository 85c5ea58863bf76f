// The CUDA random-k kernels give the CPU codec's bytes: gather writes exactly the values area of
// compressors/randk/randk_codec.cpp's payload for the same input and context (f32 and f16 values,
// chunk offsets, aligned and unaligned payloads), and scatter / scatter-add give the bits of the
// CPU decode / decode_add. The per-entry index rule the kernels use and the host key writer are
// checked against the CPU here without a device; the device tests skip, saying why, when no device
// is present.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "compressors/randk/randk_cpu.h"
#include "kernels/cuda/cast_cuda.h"
#include "compressors/randk/cuda/randk_kernels.h"
#include "compressors/randk/randk_math.h"
#include "gpu_test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::RandkKey;
namespace cuda = kernels::cuda;
using namespace gpu_test;

constexpr std::size_t kCounts[] = {0, 1, 7, (std::size_t{1} << 20) + 3, std::size_t{1} << 26};

// ---- host-side checks (no device needed) ---------------------------------------------------

// Every j of randk_entry_index (one division, the strata walk positioned at j) equals the CPU
// loops' indices, over small, large, k = n, k = 1 and near-2^64 chunks.
TEST(RandkCudaHost, EntryIndexMatchesTheCpuIndices) {
  struct Case {
    std::uint64_t n, k;
  };
  const Case cases[] = {{1, 1},
                        {7, 1},
                        {7, 3},
                        {7, 7},
                        {1000, 999},
                        {(std::uint64_t{1} << 20) + 3, 10486},
                        {(std::uint64_t{1} << 26), 671089},
                        {(std::uint64_t{1} << 40) + 7, 100003},
                        {(std::uint64_t{1} << 63) + 12345, 4099},
                        {std::numeric_limits<std::uint64_t>::max(), 5},
                        {std::numeric_limits<std::uint64_t>::max(), 65537}};
  const RandkKey keys[] = {{0, 0, 0, 0},
                           {0x0123456789ABCDEFull, 17, 3, 1000003},
                           {42, 0xFFFFFFFFu, 0xFFFFFFFFu, std::numeric_limits<std::uint64_t>::max() - 2}};
  for (const Case& c : cases) {
    for (const RandkKey& key : keys) {
      std::vector<std::uint64_t> want(c.k);
      kernels::cpu::randk_indices(c.n, c.k, key, want.data());
      for (std::uint64_t j = 0; j < c.k; ++j) {
        const std::uint64_t got =
            kernels::randk_entry_index(key, c.n, c.k, c.n / c.k, c.n % c.k, j);
        ASSERT_EQ(got, want[j]) << "n = " << c.n << ", k = " << c.k << ", j = " << j;
      }
    }
  }
}

// randk_write_key writes the 24 bytes the CPU codec puts at the start of its payload.
TEST(RandkCudaHost, WriteKeyMatchesTheCodec) {
  const auto codec = make_codec("randk:ratio=0.25");
  std::vector<float> values(40, 1.5f);
  const EncodeContext ctx{0xFEDCBA9876543210ull, 77, 9, 123456789012345ull};
  std::vector<std::byte> message(codec->max_encoded_bytes(values.size()));
  codec->encode(host_view(values.data(), values.size()), message, ctx);
  std::byte key[kernels::kRandkKeyBytes];
  kernels::randk_write_key(kernels::cpu::randk_key(ctx), key);
  EXPECT_EQ(std::memcmp(key, message.data() + kWireHeaderBytes, sizeof key), 0);
  EXPECT_EQ(cuda::randk_values_bytes(10, false), 40u);
  EXPECT_EQ(cuda::randk_values_bytes(10, true), 20u);
}

// Sizes the rule cannot serve are refused on the host, before anything touches the device.
TEST(RandkCudaHost, RefusesImpossibleSizes) {
  const RandkKey key{1, 2, 3, 4};
  float* fake = reinterpret_cast<float*>(std::uintptr_t{4096});
  std::byte* fake_bytes = reinterpret_cast<std::byte*>(std::uintptr_t{4096});
  const auto expect_invalid = [](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::invalid_argument) << error.what();
    }
  };
  expect_invalid([&] { cuda::randk_gather(fake, 5, key, 6, false, fake_bytes, nullptr); });
  expect_invalid([&] { cuda::randk_gather(fake, 5, key, 0, false, fake_bytes, nullptr); });
  expect_invalid([&] { cuda::randk_scatter_add(fake_bytes, 1, true, key, 0, fake, nullptr); });
  expect_invalid([&] { cuda::randk_scatter(fake_bytes, 9, false, key, 8, fake, nullptr); });
}

// ---- device tests --------------------------------------------------------------------------

class CudaRandk : public DeviceTest {};

// Deterministic finite test data: mostly values of magnitude 2^-10 .. 2^10, some zeros of
// either sign, some f32 subnormals, and (f16 payloads) some beyond the f16 range.
std::vector<float> test_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = mix(seed * 0x100000001B3ull + i);
    const std::uint32_t kind = static_cast<std::uint32_t>(r & 63);
    const std::uint32_t sign = static_cast<std::uint32_t>((r >> 6) & 1) << 31;
    const std::uint32_t mantissa = static_cast<std::uint32_t>(r >> 8) & 0x7FFFFFu;
    std::uint32_t bits;
    if (kind == 0) bits = sign;                                       // +-0
    else if (kind == 1) bits = sign | mantissa;                       // subnormal
    else if (kind == 2) bits = sign | (143u << 23) | mantissa;        // 2^16 .. 2^17
    else bits = sign | ((117u + static_cast<std::uint32_t>((r >> 40) % 21)) << 23) | mantissa;
    values[i] = kernels::bits_float(bits);
  }
  return values;
}

struct Variant {
  const char* spec;
  std::size_t max_count;  // larger counts skip this variant (k = n costs CPU time)
};

// For each count, spec, chunk offset and payload alignment: gather == the CPU payload's values,
// scatter == CPU decode, scatter_add == CPU decode_add, bit for bit.
TEST_F(CudaRandk, GatherScatterMatchTheCpuCodec) {
  const Variant variants[] = {{"randk:ratio=0.01", ~std::size_t{0}},
                              {"randk:ratio=0.01,values=fp16", ~std::size_t{0}},
                              {"randk:k=3", ~std::size_t{0}},
                              {"randk:ratio=1,values=fp16", std::size_t{1} << 21}};
  for (const std::size_t n : kCounts) {
    const std::vector<float> input = test_values(n, n + 1);
    const std::vector<float> acc0 = test_values(n, n + 2);
    DeviceBytes d_in(n * sizeof(float));
    to_device(d_in.get(), input.data(), n * sizeof(float));
    DeviceBytes d_out(n * sizeof(float));
    for (const Variant& variant : variants) {
      if (n > variant.max_count) continue;
      const auto codec = make_codec(variant.spec);
      const bool half = codec->spec().values == DType::f16;
      for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1000003}}) {
        SCOPED_TRACE(std::string(variant.spec) + ", n = " + std::to_string(n) +
                     ", element_offset = " + std::to_string(offset));
        const EncodeContext ctx{0x5EEDull + n, 11, 4, offset};
        std::vector<std::byte> message(codec->max_encoded_bytes(n));
        message.resize(codec->encode(host_view(input.data(), n), message, ctx));
        const compressors::WireHeader header = compressors::read_header(message, "test");
        const std::size_t k = header.large_param;
        const std::size_t value_bytes = cuda::randk_values_bytes(k, half);
        ASSERT_EQ(message.size(), kWireHeaderBytes + kernels::kRandkKeyBytes + value_bytes);
        const std::byte* cpu_values = message.data() + kWireHeaderBytes + kernels::kRandkKeyBytes;
        const RandkKey key = kernels::cpu::randk_key(ctx);

        // The payload at an odd address when the offset is not 0: the byte-wise paths.
        const std::size_t shift = offset == 0 ? 0 : 1;
        DeviceBytes d_values(value_bytes + shift);
        std::byte* values_at = d_values.get() + shift;
        cuda::randk_gather(d_in.as<float>(), n, key, k, half, values_at, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(same_bytes(cpu_values, from_device<std::byte>(values_at, value_bytes)));

        // Decode from the CPU's bytes (the same as the gathered ones, checked above).
        to_device(values_at, cpu_values, value_bytes);
        std::vector<float> want(n, -1.0f);
        codec->decode(message, host_view(want.data(), n));
        ASSERT_EQ(cudaMemset(d_out.get(), 0xFF, n * sizeof(float)), cudaSuccess);
        cuda::randk_scatter(values_at, k, half, key, n, d_out.as<float>(), nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(same_bits(want, from_device<float>(d_out.get(), n)));

        std::vector<float> acc = acc0;
        codec->decode_add(message, acc.data(), n);
        to_device(d_out.get(), acc0.data(), n * sizeof(float));
        cuda::randk_scatter_add(values_at, k, half, key, n, d_out.as<float>(), nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(same_bits(acc, from_device<float>(d_out.get(), n)));
      }
    }
  }
}

// NaN, Inf, f16 overflow and signed zeros travel through gather and decode as on the CPU.
TEST_F(CudaRandk, SpecialValuesGatherAndDecodeLikeTheCpu) {
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            kernels::bits_float(0x7FA00001u),  // signalling NaN
                            65519.0f, 65520.0f, -65536.0f, 1e-8f, -0.0f, 0.0f,
                            kernels::bits_float(0x00000001u)};
  constexpr std::size_t n = 4096;
  std::vector<float> input(n);
  for (std::size_t i = 0; i < n; ++i) input[i] = specials[i % std::size(specials)];
  DeviceBytes d_in(n * sizeof(float));
  to_device(d_in.get(), input.data(), n * sizeof(float));
  DeviceBytes d_out(n * sizeof(float));
  for (const char* spec : {"randk:ratio=0.5", "randk:ratio=0.5,values=fp16"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec);
    const bool half = codec->spec().values == DType::f16;
    const EncodeContext ctx{99, 1, 2, 3};
    std::vector<std::byte> message(codec->max_encoded_bytes(n));
    message.resize(codec->encode(host_view(input.data(), n), message, ctx));
    const std::size_t k = compressors::read_header(message, "test").large_param;
    const std::size_t value_bytes = cuda::randk_values_bytes(k, half);
    const std::byte* cpu_values = message.data() + kWireHeaderBytes + kernels::kRandkKeyBytes;
    const RandkKey key = kernels::cpu::randk_key(ctx);
    DeviceBytes d_values(value_bytes);
    cuda::randk_gather(d_in.as<float>(), n, key, k, half, d_values.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(same_bytes(cpu_values, from_device<std::byte>(d_values.get(), value_bytes)));
    std::vector<float> want(n);
    codec->decode(message, host_view(want.data(), n));
    cuda::randk_scatter(d_values.get(), k, half, key, n, d_out.as<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(same_bits(want, from_device<float>(d_out.get(), n)));
  }
}

}  // namespace
}  // namespace gradzip
