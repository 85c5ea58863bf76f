// The CUDA sign kernels (compressors/sign/cuda/sign_kernels.h) against the CPU codec on the same inputs,
// every device check for both kernel variants (KernelVariant::reference and ::fast, the
// parameter of the CudaSign tests; the fast kernels' shapes -- long buckets staged chunk by
// chunk, unaligned inputs, outputs and payloads -- have tests of their own): byte-identical payloads (after the 32-byte header) for counts {0, 1, 7, 2^20+3, 2^26} and
// buckets {1, 7, 512} (plus 15, 16, 17, 100 and one bucket larger than the tensor below 2^26),
// on N(0,1) data, on data of a wide dynamic range (where another summation order would give
// other scale bits), on data with zeros, denormals, tiny and huge values (sums overflowing to
// Inf), and on data with Inf/NaN in some buckets; decode and decode-accumulate equal to the CPU
// codec's decode / decode_add; a payload with a nonzero unused bit sets the status and leaves
// the output untouched. The size function is checked without a device; everything else skips,
// saying why, when no device is present.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cuda/cast_cuda.h"
#include "compressors/sign/cuda/sign_kernels.h"
#include "kernels/host_device.h"
#include "gpu_test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::bits_float;
using kernels::float_bits;
namespace cuda = kernels::cuda;

using namespace gpu_test;

using cuda::KernelVariant;

// Every device test runs once per kernel variant.
class CudaSign : public StreamTest, public ::testing::WithParamInterface<KernelVariant> {};

std::string variant_name(const ::testing::TestParamInfo<KernelVariant>& info) {
  return info.param == KernelVariant::fast ? "fast" : "reference";
}

// ---- the round trip against the CPU codec ------------------------------------------------------

std::unique_ptr<Codec> sign_codec(std::size_t bucket) {
  return make_codec("sign:bucket=" + std::to_string(bucket));
}

// Decodes `message` (the CPU codec's) on the device, plainly and accumulating, against the CPU
// codec's decode / decode_add.
void check_decode(const std::vector<std::byte>& message, std::size_t count, std::size_t bucket,
                  KernelVariant variant, void* stream) {
  const auto decode = [&](const std::byte* d_cpu, float* d_out, bool accumulate, int* d_status) {
    cuda::sign_decode(d_cpu, count, bucket, d_out, accumulate, d_status, stream, variant);
  };
  check_decode_against_cpu(*sign_codec(bucket), message, count, cuda::kSignStatusOk, stream, decode);
}

// Encodes x with the CPU codec and with the kernels, checks the payloads byte for byte, then
// the decoders.
void check_against_cpu(const std::vector<float>& x, std::size_t bucket, const EncodeContext& ctx,
                       KernelVariant variant, void* stream) {
  const std::size_t count = x.size();
  const auto codec = sign_codec(bucket);
  std::vector<std::byte> message(codec->max_encoded_bytes(count));
  ASSERT_EQ(codec->encode(host_view(x.data(), count), message, ctx), message.size());
  const std::size_t payload_bytes = message.size() - kWireHeaderBytes;
  ASSERT_EQ(cuda::sign_payload_bytes(count, bucket), payload_bytes);

  DeviceArray<float> d_in(x);
  DeviceArray<std::byte> d_payload(payload_bytes);
  ASSERT_EQ(cudaMemset(d_payload.get(), 0xA5, std::max<std::size_t>(payload_bytes, 1)), cudaSuccess);
  std::size_t workspace = 12345;
  cuda::sign_encode(d_in.get(), count, bucket, d_payload.get(), nullptr, &workspace, stream, variant);
  EXPECT_EQ(workspace, 0u);
  cuda::sign_encode(d_in.get(), count, bucket, d_payload.get(), nullptr, nullptr, stream, variant);
  sync(stream);
  const std::vector<std::byte> gpu_payload = d_payload.download();
  const std::byte* cpu_payload = message.data() + kWireHeaderBytes;
  const std::size_t diff = first_byte_difference(gpu_payload.data(), cpu_payload, payload_bytes);
  const std::size_t scale_bytes = 4 * ((count + bucket - 1) / bucket);
  if (diff != kNoDifference && diff < scale_bytes) {
    std::uint32_t gpu_scale = 0, cpu_scale = 0;
    std::memcpy(&gpu_scale, gpu_payload.data() + diff / 4 * 4, 4);
    std::memcpy(&cpu_scale, cpu_payload + diff / 4 * 4, 4);
    FAIL() << "scale of bucket " << diff / 4 << ": gpu " << hex(gpu_scale) << ", cpu " << hex(cpu_scale);
  }
  ASSERT_EQ(diff, kNoDifference) << "sign byte " << diff - scale_bytes << ": gpu 0x" << std::hex
                                 << std::to_integer<int>(gpu_payload[diff]) << ", cpu 0x"
                                 << std::to_integer<int>(cpu_payload[diff]);
  check_decode(message, count, bucket, variant, stream);
}

constexpr Data kData[] = {Data::gaussian, Data::wide_range, Data::finite_specials, Data::nonfinite};

void check_count(std::size_t count, const std::vector<std::size_t>& buckets, KernelVariant variant,
                 void* stream) {
  for (Data data : kData) {
    const std::vector<float> x = make_data(count, data, 2000 + count);
    for (std::size_t bucket : buckets) {
      SCOPED_TRACE("count=" + std::to_string(count) + " bucket=" + std::to_string(bucket) +
                   " data=" + data_name(data));
      check_against_cpu(x, bucket, EncodeContext{}, variant, stream);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// ---- tests -------------------------------------------------------------------------------------

// Host-side: needs no device.
TEST(CudaSignHost, PayloadBytesEqualTheCpuCodecs) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                            std::size_t{513}, (std::size_t{1} << 20) + 3, std::size_t{1} << 26,
                            (std::size_t{1} << 31) + 5}) {
    for (std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{512},
                               std::size_t{1} << 31}) {
      EXPECT_EQ(cuda::sign_payload_bytes(count, bucket),
                sign_codec(bucket)->max_encoded_bytes(count) - kWireHeaderBytes)
          << count << " " << bucket;
    }
  }
}

TEST(CudaSignHost, BadShapesThrowBeforeTouchingTheDevice) {
  const auto expect_invalid = [](auto call) {
    try {
      call();
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    }
  };
  expect_invalid([] { cuda::sign_payload_bytes(10, 0); });
  expect_invalid([] { cuda::sign_payload_bytes(std::numeric_limits<std::size_t>::max(), 1); });
  expect_invalid([] { cuda::sign_encode(nullptr, 10, 0, nullptr, nullptr, nullptr, nullptr); });
  expect_invalid([] { cuda::sign_decode(nullptr, 10, 4, nullptr, false, nullptr, nullptr); });
  std::size_t workspace = 99;
  cuda::sign_encode(nullptr, 10, 4, nullptr, nullptr, &workspace, nullptr);
  EXPECT_EQ(workspace, 0u);
}

TEST_P(CudaSign, SmallCountsMatchTheCpuCodec) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
    check_count(count, {1, 7, 512, 15, 16, 17}, GetParam(), stream());
    if (HasFatalFailure()) return;
  }
}

TEST_P(CudaSign, MillionElementsMatchTheCpuCodec) {
  check_count((std::size_t{1} << 20) + 3, {1, 7, 512, 15, 16, 17, 100, std::size_t{1} << 22},
              GetParam(), stream());
}

TEST_P(CudaSign, TwoTo26ElementsMatchTheCpuCodec) {
  GZ_SKIP_ON_EMULATED_DEVICE("2^26 elements in three bucket sizes take minutes on the CPU");
  const std::size_t count = std::size_t{1} << 26;
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < count * 24) GTEST_SKIP() << "needs " << count * 24 << " bytes of device memory";
  check_count(count, {1, 7, 512}, GetParam(), stream());
}

// The sign codec draws no random numbers: a chunk with any context encodes like the CPU's.
TEST_P(CudaSign, ChunksWithAnElementOffsetMatchTheCpuCodec) {
  const std::vector<float> x = make_data(50001, Data::nonfinite, 7);
  EncodeContext ctx;
  ctx.seed = 77;
  ctx.step = 3;
  ctx.tensor_id = 9;
  for (std::uint64_t offset : {std::uint64_t{3}, std::uint64_t{512 * 37}, (std::uint64_t{1} << 34) + 5}) {
    ctx.element_offset = offset;
    for (std::size_t bucket : {std::size_t{7}, std::size_t{512}}) {
      SCOPED_TRACE("offset=" + std::to_string(offset) + " bucket=" + std::to_string(bucket));
      check_against_cpu(x, bucket, ctx, GetParam(), stream());
      if (HasFatalFailure()) return;
    }
  }
}

// A payload at an odd address (inside a message after a header of any size).
TEST_P(CudaSign, UnalignedPayloadsEncodeAndDecode) {
  const std::size_t count = 1001;
  const std::vector<float> x = make_data(count, Data::nonfinite, 9);
  for (std::size_t bucket : {std::size_t{7}, std::size_t{100}}) {
    SCOPED_TRACE("bucket=" + std::to_string(bucket));
    const auto codec = sign_codec(bucket);
    std::vector<std::byte> message(codec->max_encoded_bytes(count));
    codec->encode(host_view(x.data(), count), message, EncodeContext{});
    const std::size_t payload_bytes = message.size() - kWireHeaderBytes;
    DeviceArray<float> d_in(x);
    DeviceArray<std::byte> d_buffer(payload_bytes + 3);
    std::byte* const d_payload = d_buffer.get() + 3;
    cuda::sign_encode(d_in.get(), count, bucket, d_payload, nullptr, nullptr, stream(), GetParam());
    DeviceArray<float> d_out(count);
    DeviceArray<int> d_status(1);
    cuda::sign_decode(d_payload, count, bucket, d_out.get(), false, d_status.get(), stream(),
                      GetParam());
    sync(stream());
    const std::vector<std::byte> buffer = d_buffer.download();
    EXPECT_EQ(first_byte_difference(buffer.data() + 3, message.data() + kWireHeaderBytes, payload_bytes),
              kNoDifference);
    EXPECT_EQ(d_status.download()[0], cuda::kSignStatusOk);
    std::vector<float> cpu_out(count);
    codec->decode(message, host_view(cpu_out.data(), count));
    EXPECT_EQ(first_float_difference(d_out.download(), cpu_out, count, false), kNoDifference);
  }
}

// The fast kernels' shapes (compressors/sign/sign_fast_layout.h): long buckets staged chunk by chunk
// (4097, 10000, 2^16 + 5), the longest resident ones (4095, 4096), buckets of one lane group
// and fewer (16, 3), over many blocks, on data whose scales depend on the summation order.
TEST_P(CudaSign, FastKernelShapesMatchTheCpuCodec) {
  for (Data data : {Data::wide_range, Data::nonfinite}) {
    const std::vector<float> x = make_data(200003, data, 14);
    for (std::size_t bucket : {std::size_t{3}, std::size_t{16}, std::size_t{4095}, std::size_t{4096},
                               std::size_t{4097}, std::size_t{10000}, (std::size_t{1} << 16) + 5}) {
      SCOPED_TRACE("bucket=" + std::to_string(bucket) + " data=" + data_name(data));
      check_against_cpu(x, bucket, EncodeContext{}, GetParam(), stream());
      if (HasFatalFailure()) return;
    }
  }
}

// Inputs and outputs one float past a 16-byte boundary (no vector loads or stores), payloads
// at every offset from a word boundary (byte, 16-bit and 32-bit stores and loads).
TEST_P(CudaSign, UnalignedInputsOutputsAndPayloadsMatchTheCpuCodec) {
  const std::size_t count = 20003;
  const std::vector<float> x = make_data(count, Data::finite_specials, 15);
  for (std::size_t bucket : {std::size_t{7}, std::size_t{512}, std::size_t{5000}}) {
    const auto codec = sign_codec(bucket);
    std::vector<std::byte> message(codec->max_encoded_bytes(count));
    codec->encode(host_view(x.data(), count), message, EncodeContext{});
    SCOPED_TRACE("bucket=" + std::to_string(bucket));
    gpu_test::check_unaligned_round_trip(
        *codec, x, message, cuda::kSignStatusOk, stream(),
        [&](const float* d_in, std::byte* d_payload) {
          cuda::sign_encode(d_in, count, bucket, d_payload, nullptr, nullptr, stream(), GetParam());
        },
        [&](const std::byte* d_payload, float* d_out, int* d_status) {
          cuda::sign_decode(d_payload, count, bucket, d_out, false, d_status, stream(), GetParam());
        });
  }
}

// Scales may hold any bits (both decoders accept them): negative, -0, NaNs of any payload.
TEST_P(CudaSign, AnyScaleBitsDecodeLikeTheCpu) {
  const std::size_t count = 1003;
  const std::size_t bucket = 10;
  const std::vector<float> x = gaussian(count, 12);
  const auto codec = sign_codec(bucket);
  std::vector<std::byte> message(codec->max_encoded_bytes(count));
  codec->encode(host_view(x.data(), count), message, EncodeContext{});
  const std::uint32_t odd_scales[] = {0x80000000u, 0xBF800000u, 0xFFC01234u, 0x7F800001u,
                                      0xFF800000u, 0x00000001u, 0x7FFFFFFFu};
  for (std::size_t k = 0; k < std::size(odd_scales); ++k) {
    std::memcpy(message.data() + kWireHeaderBytes + 4 * (k * 13), &odd_scales[k], 4);
  }
  check_decode(message, count, bucket, GetParam(), stream());
}

TEST_P(CudaSign, NonzeroUnusedBitsSetTheStatusAndWriteNothing) {
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1001}, std::size_t{4099}}) {
    for (unsigned bit = static_cast<unsigned>(count % 8); bit < 8; ++bit) {
      SCOPED_TRACE("count=" + std::to_string(count) + " bit=" + std::to_string(bit));
      const std::size_t bucket = 7;
      const auto codec = sign_codec(bucket);
      const std::vector<float> x = gaussian(count, 13);
      std::vector<std::byte> message(codec->max_encoded_bytes(count));
      codec->encode(host_view(x.data(), count), message, EncodeContext{});
      message.back() |= std::byte{static_cast<unsigned char>(1u << bit)};
      std::vector<float> cpu_out(count, 1.0f);
      try {
        codec->decode(message, host_view(cpu_out.data(), count));
        ADD_FAILURE() << "the CPU codec accepted the message";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::malformed_message) << e.what();
      }
      DeviceArray<std::byte> d_payload(
          std::vector<std::byte>(message.begin() + kWireHeaderBytes, message.end()));
      const std::vector<float> sentinel(count, -12345.0f);
      DeviceArray<int> d_status(1);
      for (bool accumulate : {false, true}) {
        DeviceArray<float> d_out(sentinel);
        cuda::sign_decode(d_payload.get(), count, bucket, d_out.get(), accumulate, d_status.get(),
                          stream(), GetParam());
        sync(stream());
        EXPECT_EQ(d_status.download()[0], cuda::kSignStatusUnusedBits) << "accumulate=" << accumulate;
        EXPECT_EQ(first_float_difference(d_out.download(), sentinel, count, false), kNoDifference)
            << "accumulate=" << accumulate << ": the output was written";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaSign,
                         ::testing::Values(KernelVariant::reference, KernelVariant::fast), variant_name);

}  // namespace
}  // namespace gradzip
