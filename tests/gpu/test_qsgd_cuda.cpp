// The CUDA qsgd kernels (compressors/qsgd/cuda/qsgd_kernels.h) against the CPU codec on the same inputs,
// every device check for both kernel variants (KernelVariant::reference and ::fast, the
// parameter of the CudaQsgd tests): byte-identical payloads (after the 32-byte header) for
// counts {0, 1, 7, 2^20+3, 2^26}, bits {1, 2, 3, 4, 8} and buckets {1, 7, 512} (plus 255, 256
// and one bucket larger than the tensor below 2^26), on N(0,1) data, on data with zeros,
// denormals, tiny and huge values, and on data with Inf/NaN in some buckets; the fast kernels'
// shapes (segments sharing a code byte, long buckets swept twice, every bit width); chunks with
// element_offset != 0; payloads, inputs and outputs at unaligned addresses; decode and
// decode-accumulate equal to the CPU codec's decode / decode_add; malformed payloads set the
// status and leave the output untouched. The size function is checked without a device;
// everything else skips, saying why, when no device is present.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <algorithm>
#include <cfloat>
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
#include "compressors/qsgd/cuda/qsgd_kernels.h"
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
class CudaQsgd : public StreamTest, public ::testing::WithParamInterface<KernelVariant> {};

std::string variant_name(const ::testing::TestParamInfo<KernelVariant>& info) {
  return info.param == KernelVariant::fast ? "fast" : "reference";
}

std::unique_ptr<Codec> qsgd_codec(int bits, std::size_t bucket) {
  return make_codec("qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket));
}

EncodeContext context(std::uint64_t element_offset = 0) {
  EncodeContext ctx;
  ctx.seed = 0x5EED5EED12345678ull;
  ctx.step = 11;
  ctx.tensor_id = 42;
  ctx.element_offset = element_offset;
  return ctx;
}

cuda::QsgdEncodeParams params_of(const EncodeContext& ctx) {
  cuda::QsgdEncodeParams params;
  params.seed = ctx.seed;
  params.step = ctx.step;
  params.tensor_id = ctx.tensor_id;
  params.element_offset = ctx.element_offset;
  return params;
}

// ---- the round trip against the CPU codec ------------------------------------------------------

// Encodes x with the CPU codec and with the kernels; checks the payloads byte for byte, then
// decodes the CPU's message on the device, plainly and accumulating, against decode/decode_add.
void check_against_cpu(const std::vector<float>& x, int bits, std::size_t bucket,
                       const EncodeContext& ctx, KernelVariant variant, void* stream) {
  const std::size_t count = x.size();
  const auto codec = qsgd_codec(bits, bucket);
  std::vector<std::byte> message(codec->max_encoded_bytes(count));
  ASSERT_EQ(codec->encode(host_view(x.data(), count), message, ctx), message.size());
  const std::size_t payload_bytes = message.size() - kWireHeaderBytes;
  ASSERT_EQ(cuda::qsgd_payload_bytes(count, bits, bucket), payload_bytes);

  // Encode.
  DeviceArray<float> d_in(x);
  DeviceArray<std::byte> d_payload(payload_bytes);
  ASSERT_EQ(cudaMemset(d_payload.get(), 0xA5, std::max<std::size_t>(payload_bytes, 1)), cudaSuccess);
  std::size_t workspace = 12345;
  cuda::qsgd_encode(d_in.get(), count, bits, bucket, params_of(ctx), d_payload.get(), nullptr,
                    &workspace, stream, variant);
  EXPECT_EQ(workspace, 0u);
  cuda::qsgd_encode(d_in.get(), count, bits, bucket, params_of(ctx), d_payload.get(), nullptr,
                    nullptr, stream, variant);
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
  const std::vector<std::byte> gpu_payload = d_payload.download();
  const std::byte* cpu_payload = message.data() + kWireHeaderBytes;
  const std::size_t diff = first_byte_difference(gpu_payload.data(), cpu_payload, payload_bytes);
  const std::size_t scale_bytes = 4 * ((count + bucket - 1) / bucket);
  ASSERT_EQ(diff, kNoDifference)
      << "payload byte " << diff << " (" << (diff < scale_bytes ? "scale of bucket " : "code byte ")
      << (diff < scale_bytes ? diff / 4 : diff - scale_bytes) << "): gpu 0x" << std::hex
      << std::to_integer<int>(gpu_payload[diff]) << ", cpu 0x" << std::to_integer<int>(cpu_payload[diff]);

  // Decode the CPU's payload.
  const auto decode = [&](const std::byte* d_cpu, float* d_out, bool accumulate, int* d_status) {
    cuda::qsgd_decode(d_cpu, count, bits, bucket, d_out, accumulate, d_status, stream, variant);
  };
  check_decode_against_cpu(*codec, message, count, cuda::kQsgdStatusOk, stream, decode);
}

constexpr int kBits[] = {1, 2, 3, 4, 8};
constexpr Data kData[] = {Data::gaussian, Data::finite_specials, Data::nonfinite};

void check_count(std::size_t count, const std::vector<std::size_t>& buckets, KernelVariant variant,
                 void* stream) {
  for (Data data : kData) {
    const std::vector<float> x = make_data(count, data, 1000 + count);
    for (int bits : kBits) {
      for (std::size_t bucket : buckets) {
        SCOPED_TRACE("count=" + std::to_string(count) + " bits=" + std::to_string(bits) +
                     " bucket=" + std::to_string(bucket) + " data=" + data_name(data));
        check_against_cpu(x, bits, bucket, context(), variant, stream);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// ---- tests -------------------------------------------------------------------------------------

// Host-side: needs no device.
TEST(CudaQsgdHost, PayloadBytesEqualTheCpuCodecs) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                            std::size_t{513}, (std::size_t{1} << 20) + 3, std::size_t{1} << 26,
                            (std::size_t{1} << 31) + 5}) {
    for (int bits = 1; bits <= 8; ++bits) {
      for (std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{512}, std::size_t{1} << 31}) {
        EXPECT_EQ(cuda::qsgd_payload_bytes(count, bits, bucket),
                  qsgd_codec(bits, bucket)->max_encoded_bytes(count) - kWireHeaderBytes)
            << count << " " << bits << " " << bucket;
      }
    }
  }
}

TEST(CudaQsgdHost, BadShapesThrowBeforeTouchingTheDevice) {
  const auto expect_invalid = [](auto call) {
    try {
      call();
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    }
  };
  expect_invalid([] { cuda::qsgd_payload_bytes(10, 0, 4); });
  expect_invalid([] { cuda::qsgd_payload_bytes(10, 9, 4); });
  expect_invalid([] { cuda::qsgd_payload_bytes(10, 4, 0); });
  expect_invalid([] { cuda::qsgd_payload_bytes(cuda::kQsgdCudaMaxCount + 1, 4, 4); });
  expect_invalid([] {
    cuda::qsgd_encode(nullptr, 10, 9, 4, {}, nullptr, nullptr, nullptr, nullptr);
  });
  expect_invalid([] { cuda::qsgd_decode(nullptr, 10, 4, 0, nullptr, false, nullptr, nullptr); });
  // The workspace query launches nothing and needs no device.
  std::size_t workspace = 99;
  cuda::qsgd_encode(nullptr, 10, 4, 4, {}, nullptr, nullptr, &workspace, nullptr);
  EXPECT_EQ(workspace, 0u);
}

TEST_P(CudaQsgd, SmallCountsMatchTheCpuCodec) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
    check_count(count, {1, 7, 512, 3, 256}, GetParam(), stream());
    if (HasFatalFailure()) return;
  }
}

TEST_P(CudaQsgd, MillionElementsMatchTheCpuCodec) {
  check_count((std::size_t{1} << 20) + 3, {1, 7, 512, 255, 256, std::size_t{1} << 22}, GetParam(),
              stream());
}

TEST_P(CudaQsgd, TwoTo26ElementsMatchTheCpuCodec) {
  GZ_SKIP_ON_EMULATED_DEVICE("2^26 elements in three bucket sizes take minutes on the CPU");
  const std::size_t count = std::size_t{1} << 26;
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  // Input, payload (<= 2.25 x 4 bytes per element at bucket 1, bits 8) and two outputs.
  if (free_bytes < count * 24) GTEST_SKIP() << "needs " << count * 24 << " bytes of device memory";
  check_count(count, {1, 7, 512}, GetParam(), stream());
}

// Chunks of a tensor: element i of the chunk draws the word of element element_offset + i.
TEST_P(CudaQsgd, ChunksWithAnElementOffsetMatchTheCpuCodec) {
  const std::vector<float> x = make_data(50001, Data::nonfinite, 7);
  for (std::uint64_t offset : {std::uint64_t{1}, std::uint64_t{3}, std::uint64_t{512 * 37},
                               std::uint64_t{1000003}, (std::uint64_t{1} << 34) + 5}) {
    for (int bits : kBits) {
      for (std::size_t bucket : {std::size_t{7}, std::size_t{512}}) {
        SCOPED_TRACE("offset=" + std::to_string(offset) + " bits=" + std::to_string(bits) +
                     " bucket=" + std::to_string(bucket));
        check_against_cpu(x, bits, bucket, context(offset), GetParam(), stream());
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Another seed, step and tensor id (the high key word and the counter words all matter).
TEST_P(CudaQsgd, OtherKeysMatchTheCpuCodec) {
  const std::vector<float> x = make_data(4099, Data::gaussian, 8);
  EncodeContext ctx;
  ctx.seed = 0xFEDCBA9876543210ull;
  ctx.step = 0xFFFFFFF0u;
  ctx.tensor_id = 0x80000001u;
  ctx.element_offset = 0xFFFFFFFFull * 4 - 2;  // the block counter crosses 2^32
  for (int bits : kBits) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    check_against_cpu(x, bits, 64, ctx, GetParam(), stream());
    if (HasFatalFailure()) return;
  }
}

// A payload at an odd address (inside a message after a header of any size).
TEST_P(CudaQsgd, UnalignedPayloadsEncodeAndDecode) {
  const std::size_t count = 1001;
  const std::vector<float> x = make_data(count, Data::nonfinite, 9);
  for (int bits : kBits) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    const auto codec = qsgd_codec(bits, 7);
    std::vector<std::byte> message(codec->max_encoded_bytes(count));
    codec->encode(host_view(x.data(), count), message, context());
    const std::size_t payload_bytes = message.size() - kWireHeaderBytes;
    DeviceArray<float> d_in(x);
    DeviceArray<std::byte> d_buffer(payload_bytes + 3);
    std::byte* const d_payload = d_buffer.get() + 3;
    cuda::qsgd_encode(d_in.get(), count, bits, 7, params_of(context()), d_payload, nullptr, nullptr,
                      stream(), GetParam());
    DeviceArray<float> d_out(count);
    DeviceArray<int> d_status(1);
    cuda::qsgd_decode(d_payload, count, bits, 7, d_out.get(), false, d_status.get(), stream(),
                      GetParam());
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream())), cudaSuccess);
    const std::vector<std::byte> buffer = d_buffer.download();
    EXPECT_EQ(first_byte_difference(buffer.data() + 3, message.data() + kWireHeaderBytes, payload_bytes),
              kNoDifference);
    EXPECT_EQ(d_status.download()[0], cuda::kQsgdStatusOk);
    std::vector<float> cpu_out(count);
    codec->decode(message, host_view(cpu_out.data(), count));
    EXPECT_EQ(first_float_difference(d_out.download(), cpu_out, count, false), kNoDifference);
  }
}

// The fast kernels' shapes (compressors/qsgd/qsgd_fast_layout.h): buckets whose segments share a code
// byte (1001: segments of 4 buckets), long buckets swept twice (4095, 4097, 10000), short ones
// (3), at every bit width, over many blocks, at element offsets in two positions of a Philox block.
TEST_P(CudaQsgd, FastKernelShapesMatchTheCpuCodec) {
  const std::vector<float> x = make_data(70001, Data::nonfinite, 10);
  for (std::size_t bucket : {std::size_t{3}, std::size_t{1001}, std::size_t{4095}, std::size_t{4097},
                             std::size_t{10000}}) {
    for (int bits = 1; bits <= 8; ++bits) {
      for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{2}}) {
        SCOPED_TRACE("bucket=" + std::to_string(bucket) + " bits=" + std::to_string(bits) +
                     " offset=" + std::to_string(offset));
        check_against_cpu(x, bits, bucket, context(offset), GetParam(), stream());
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Inputs and outputs one float past a 16-byte boundary (no vector loads or stores), payloads
// at every offset from a word boundary (byte, 16-bit and 32-bit stores and loads).
TEST_P(CudaQsgd, UnalignedInputsOutputsAndPayloadsMatchTheCpuCodec) {
  const std::size_t count = 20003;
  const std::vector<float> x = make_data(count, Data::finite_specials, 11);
  for (int bits : {1, 3, 4, 8}) {
    const auto codec = qsgd_codec(bits, 512);
    std::vector<std::byte> message(codec->max_encoded_bytes(count));
    codec->encode(host_view(x.data(), count), message, context());
    SCOPED_TRACE("bits=" + std::to_string(bits));
    gpu_test::check_unaligned_round_trip(
        *codec, x, message, cuda::kQsgdStatusOk, stream(),
        [&](const float* d_in, std::byte* d_payload) {
          cuda::qsgd_encode(d_in, count, bits, 512, params_of(context()), d_payload, nullptr, nullptr,
                            stream(), GetParam());
        },
        [&](const std::byte* d_payload, float* d_out, int* d_status) {
          cuda::qsgd_decode(d_payload, count, bits, 512, d_out, false, d_status, stream(), GetParam());
        });
  }
}

// ---- malformed payloads ------------------------------------------------------------------------

void set_scale(std::vector<std::byte>& message, std::size_t bucket_index, std::uint32_t bits) {
  std::memcpy(message.data() + kWireHeaderBytes + 4 * bucket_index, &bits, 4);
}

void set_stream_bit(std::vector<std::byte>& message, std::size_t scale_bytes, std::size_t bit) {
  std::byte& byte = message[kWireHeaderBytes + scale_bytes + bit / 8];
  byte |= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
}

// The CPU codec refuses `message`; the kernels report `expected_status` and write nothing.
void expect_refused(const std::vector<std::byte>& message, std::size_t count, int bits,
                    std::size_t bucket, int expected_status, KernelVariant variant, void* stream) {
  const auto codec = qsgd_codec(bits, bucket);
  std::vector<float> cpu_out(count, 1.0f);
  try {
    codec->decode(message, host_view(cpu_out.data(), count));
    ADD_FAILURE() << "the CPU codec accepted the message";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::malformed_message) << e.what();
  }
  const std::vector<std::byte> payload(message.begin() + kWireHeaderBytes, message.end());
  DeviceArray<std::byte> d_payload(payload);
  const std::vector<float> sentinel(count, -12345.0f);
  DeviceArray<int> d_status(1);
  for (bool accumulate : {false, true}) {
    DeviceArray<float> d_out(sentinel);
    cuda::qsgd_decode(d_payload.get(), count, bits, bucket, d_out.get(), accumulate, d_status.get(),
                      stream, variant);
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
    EXPECT_EQ(d_status.download()[0], expected_status) << "accumulate=" << accumulate;
    EXPECT_EQ(first_float_difference(d_out.download(), sentinel, count, false), kNoDifference)
        << "accumulate=" << accumulate << ": the output was written";
  }
}

TEST_P(CudaQsgd, MalformedPayloadsSetTheStatusAndWriteNothing) {
  const std::size_t count = 1000;
  const std::size_t bucket = 7;
  std::vector<float> x = gaussian(count, 5);
  x[20] = std::numeric_limits<float>::quiet_NaN();   // bucket 2 = [14, 21): scale NaN
  x[100] = std::numeric_limits<float>::infinity();  // bucket 14 = [98, 105): scale +Inf
  for (int bits : kBits) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    const auto codec = qsgd_codec(bits, bucket);
    std::vector<std::byte> valid(codec->max_encoded_bytes(count));
    codec->encode(host_view(x.data(), count), valid, context());
    const std::size_t scale_bytes = 4 * ((count + bucket - 1) / bucket);
    const auto w = static_cast<std::size_t>(bits);
    struct Case {
      const char* name;
      std::vector<std::byte> message;
      int status;
    };
    std::vector<Case> cases;
    auto with = [&](const char* name, int status, auto edit) {
      std::vector<std::byte> message = valid;
      edit(message);
      cases.push_back(Case{name, std::move(message), status});
    };
    with("negative scale", cuda::kQsgdStatusBadScale, [](auto& m) { set_scale(m, 5, 0xBF800000u); });
    with("-0 scale", cuda::kQsgdStatusBadScale, [](auto& m) { set_scale(m, 0, 0x80000000u); });
    with("NaN scale of another payload", cuda::kQsgdStatusBadScale,
         [](auto& m) { set_scale(m, 142, 0x7FC00001u); });  // the last bucket
    with("negative NaN scale", cuda::kQsgdStatusBadScale, [](auto& m) { set_scale(m, 2, 0xFFC00000u); });
    with("code in a NaN bucket (top bit of element 15)", cuda::kQsgdStatusNonzeroCode,
         [&](auto& m) { set_stream_bit(m, scale_bytes, 15 * w + w - 1); });
    with("code in a NaN bucket (low bit of element 14)", cuda::kQsgdStatusNonzeroCode,
         [&](auto& m) { set_stream_bit(m, scale_bytes, 14 * w); });
    with("code in an Inf bucket (element 104)", cuda::kQsgdStatusNonzeroCode,
         [&](auto& m) { set_stream_bit(m, scale_bytes, 104 * w + w / 2); });
    with("code in a bucket made Inf", cuda::kQsgdStatusNonzeroCode, [&](auto& m) {
      set_scale(m, 30, 0x7F800000u);
      set_stream_bit(m, scale_bytes, 30 * 7 * w + 3 * w);
    });
    with("both offences: the larger status", cuda::kQsgdStatusBadScale, [&](auto& m) {
      set_stream_bit(m, scale_bytes, 15 * w);
      set_scale(m, 100, 0xC0000000u);
    });
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      expect_refused(c.message, count, bits, bucket, c.status, GetParam(), stream());
      if (HasFatalFailure()) return;
    }
  }
}

// Neither decoder checks the unused high bits of the last code byte (encode writes them 0).
TEST_P(CudaQsgd, UnusedCodeBitsAreIgnoredLikeOnTheCpu) {
  const std::size_t count = 1001;  // 1001 * bits is not a multiple of 8 for odd bits
  const std::vector<float> x = gaussian(count, 6);
  for (int bits : {1, 3}) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    const auto codec = qsgd_codec(bits, 512);
    std::vector<std::byte> message(codec->max_encoded_bytes(count));
    codec->encode(host_view(x.data(), count), message, context());
    message.back() |= std::byte{0x80};
    std::vector<float> cpu_out(count);
    codec->decode(message, host_view(cpu_out.data(), count));
    DeviceArray<std::byte> d_payload(
        std::vector<std::byte>(message.begin() + kWireHeaderBytes, message.end()));
    DeviceArray<float> d_out(count);
    DeviceArray<int> d_status(1);
    cuda::qsgd_decode(d_payload.get(), count, bits, 512, d_out.get(), false, d_status.get(), stream(),
                      GetParam());
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream())), cudaSuccess);
    EXPECT_EQ(d_status.download()[0], cuda::kQsgdStatusOk);
    EXPECT_EQ(first_float_difference(d_out.download(), cpu_out, count, false), kNoDifference);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaQsgd,
                         ::testing::Values(KernelVariant::reference, KernelVariant::fast), variant_name);

}  // namespace
}  // namespace gradzip
