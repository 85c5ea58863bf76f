// The CUDA sign kernels (kernels/cuda/sign_cuda.h) against the CPU codec on the same inputs:
// byte-identical payloads (after the 32-byte header) for counts {0, 1, 7, 2^20+3, 2^26} and
// buckets {1, 7, 512} (plus 15, 16, 17, 100 and one bucket larger than the tensor below 2^26),
// on N(0,1) data, on data of a wide dynamic range (where another summation order would give
// other scale bits), on data with zeros, denormals, tiny and huge values (sums overflowing to
// Inf), and on data with Inf/NaN in some buckets; decode and decode-accumulate equal to the CPU
// codec's decode / decode_add; a payload with a nonzero unused bit sets the status and leaves
// the output untouched. The size function is checked without a device; everything else skips,
// saying why, when no device is present.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

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
#include "kernels/cuda/sign_cuda.h"
#include "kernels/host_device.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::bits_float;
using kernels::float_bits;
namespace cuda = kernels::cuda;

constexpr std::size_t kNoDifference = std::numeric_limits<std::size_t>::max();

class CudaSign : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* reason = nullptr;
    if (cuda::device_count(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* stream() const { return static_cast<void*>(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

// A device array of n elements (at least one is allocated, so the pointer is never null).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr_); }

  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    ASSERT_LE(host.size(), n_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t n_;
};

// ---- data --------------------------------------------------------------------------------------

enum class Data { gaussian, wide_range, finite_specials, nonfinite };

const char* data_name(Data data) {
  switch (data) {
    case Data::gaussian: return "gaussian";
    case Data::wide_range: return "wide range";
    case Data::finite_specials: return "finite specials";
    case Data::nonfinite: return "inf/nan";
  }
  return "?";
}

std::vector<float> gaussian(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(count);
  for (float& v : x) v = dist(rng);
  return x;
}

// Fills x[begin, begin + n) (clipped to x) with make(i).
template <typename Make>
void fill_run(std::vector<float>& x, std::size_t begin, std::size_t n, Make make) {
  for (std::size_t i = begin; i < begin + n && i < x.size(); ++i) x[i] = make(i);
}

// N(0,1) data, with zeros, denormals, tiny and huge values (finite_specials), and also +-Inf
// and NaNs of several payloads (nonfinite): isolated values spread over the tensor, and runs
// covering whole buckets of every tested size.
std::vector<float> make_data(std::size_t count, Data data, std::uint64_t seed) {
  std::vector<float> x = gaussian(count, seed);
  if (data == Data::gaussian) return x;
  if (data == Data::wide_range) {
    // N(0,1) times 2^k, k uniform in [-24, 24]: sums that round differently in another order.
    std::mt19937_64 rng(seed ^ 0x5157ull);
    std::uniform_int_distribution<int> exponent(-24, 24);
    for (float& v : x) v = std::ldexp(v, exponent(rng));
    return x;
  }
  std::vector<float> specials = {0.0f,
                                 -0.0f,
                                 std::numeric_limits<float>::denorm_min(),
                                 -bits_float(0x00012345u),
                                 bits_float(0x007FFFFFu),
                                 1e-30f,
                                 -3e-25f,
                                 FLT_MAX,
                                 -FLT_MAX,
                                 3e38f,
                                 FLT_MIN,
                                 -2.5f};
  if (data == Data::nonfinite) {
    const std::vector<float> nonfinite = {std::numeric_limits<float>::infinity(),
                                          -std::numeric_limits<float>::infinity(),
                                          bits_float(0x7FC00000u),
                                          bits_float(0xFFC00000u),
                                          bits_float(0x7FC01234u),
                                          bits_float(0x7F800001u),   // signalling
                                          bits_float(0xFFFFFFFFu)};
    specials.insert(specials.end(), nonfinite.begin(), nonfinite.end());
  }
  if (count <= 64) {
    // Every third element (the first too) special; with Inf/NaN, starting at the first of them.
    const std::size_t first = data == Data::nonfinite ? 12 : 0;
    for (std::size_t i = 0; i < count; i += 3) x[i] = specials[(first + i / 3 * 5) % specials.size()];
    return x;
  }
  const std::size_t isolated = std::min<std::size_t>(count / 8, 64);
  for (std::size_t k = 0; k < isolated; ++k) {
    x[(k * 2654435761u + 17) % count] = specials[k % specials.size()];
  }
  std::mt19937_64 rng(seed ^ 0xABCDEFull);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x007FFFFFu);
  std::uniform_int_distribution<int> coin(0, 1);
  const auto sign = [&] { return coin(rng) != 0 ? 0x80000000u : 0u; };
  // Runs of 1200 elements: each covers at least two whole buckets of 512, 255, 256, 7 and 1.
  fill_run(x, 1024, 1200, [&](std::size_t) { return bits_float(sign() | mantissa(rng)); });  // denormals
  fill_run(x, 3072, 1200, [&](std::size_t) { return bits_float(sign()); });                  // +-0
  fill_run(x, 5120, 1200, [&](std::size_t i) {                                               // huge
    return bits_float(sign() | 0x7E800000u | mantissa(rng)) * (i % 3 == 0 ? 1.0f : 1.9f);  // < 3.3e38
  });
  fill_run(x, 7168, 1200, [&](std::size_t) { return bits_float(sign() | 0x0C000000u | mantissa(rng)); });  // ~1e-31
  if (data == Data::nonfinite) {
    fill_run(x, 9216, 1200, [&](std::size_t i) {  // NaN buckets
      return i % 5 == 0 ? bits_float(0x7FC00000u | (static_cast<std::uint32_t>(i) & 0xFFFFu)) : 1.0f;
    });
    fill_run(x, 11264, 1200, [&](std::size_t i) {  // Inf buckets
      return i % 7 == 0 ? std::numeric_limits<float>::infinity() * (i % 2 == 0 ? 1.0f : -1.0f) : -2.0f;
    });
    x[count - 1] = std::numeric_limits<float>::quiet_NaN();  // the last, maybe short, bucket
  }
  return x;
}

// ---- comparisons -------------------------------------------------------------------------------

std::size_t first_byte_difference(const std::byte* a, const std::byte* b, std::size_t n) {
  if (n == 0 || std::memcmp(a, b, n) == 0) return kNoDifference;
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return kNoDifference;
}

// The first index whose bits differ; with nan_equal, any two NaNs count as equal.
std::size_t first_float_difference(const std::vector<float>& a, const std::vector<float>& b,
                                   std::size_t n, bool nan_equal) {
  for (std::size_t i = 0; i < n; ++i) {
    if (float_bits(a[i]) == float_bits(b[i])) continue;
    if (nan_equal && a[i] != a[i] && b[i] != b[i]) continue;
    return i;
  }
  return kNoDifference;
}

std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// ---- the round trip against the CPU codec ------------------------------------------------------

std::unique_ptr<Codec> sign_codec(std::size_t bucket) {
  return make_codec("sign:bucket=" + std::to_string(bucket));
}

void sync(void* stream) {
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
}

// Decodes `message` (the CPU codec's) on the device, plainly and accumulating, against the CPU
// codec's decode / decode_add.
void check_decode(const std::vector<std::byte>& message, std::size_t count, std::size_t bucket,
                  void* stream) {
  const auto codec = sign_codec(bucket);
  const std::vector<std::byte> payload(message.begin() + kWireHeaderBytes, message.end());
  DeviceArray<std::byte> d_payload(payload);
  DeviceArray<int> d_status(1);
  ASSERT_EQ(cudaMemset(d_status.get(), 0x7F, sizeof(int)), cudaSuccess);  // the decoder resets it

  std::vector<float> cpu_out(count, 0.0f);
  codec->decode(message, host_view(cpu_out.data(), count));
  DeviceArray<float> d_out(count);
  ASSERT_EQ(cudaMemset(d_out.get(), 0xEE, std::max<std::size_t>(count, 1) * sizeof(float)), cudaSuccess);
  cuda::sign_decode(d_payload.get(), count, bucket, d_out.get(), false, d_status.get(), stream);
  sync(stream);
  EXPECT_EQ(d_status.download()[0], cuda::kSignStatusOk);
  const std::vector<float> gpu_out = d_out.download();
  const std::size_t decode_diff = first_float_difference(gpu_out, cpu_out, count, false);
  ASSERT_EQ(decode_diff, kNoDifference)
      << "decode of element " << decode_diff << ": gpu " << hex(float_bits(gpu_out[decode_diff]))
      << ", cpu " << hex(float_bits(cpu_out[decode_diff]));

  // One f32 add per element on both sides: the same bits, up to NaN payloads (which CPUs and
  // GPUs pick differently).
  std::vector<float> cpu_acc = gaussian(count, 99);
  DeviceArray<float> d_acc(cpu_acc);
  codec->decode_add(message, cpu_acc.data(), count);
  cuda::sign_decode(d_payload.get(), count, bucket, d_acc.get(), true, d_status.get(), stream);
  sync(stream);
  EXPECT_EQ(d_status.download()[0], cuda::kSignStatusOk);
  const std::vector<float> gpu_acc = d_acc.download();
  const std::size_t acc_diff = first_float_difference(gpu_acc, cpu_acc, count, true);
  ASSERT_EQ(acc_diff, kNoDifference)
      << "decode-accumulate of element " << acc_diff << ": gpu " << hex(float_bits(gpu_acc[acc_diff]))
      << ", cpu " << hex(float_bits(cpu_acc[acc_diff]));
}

// Encodes x with the CPU codec and with the kernels, checks the payloads byte for byte, then
// the decoders.
void check_against_cpu(const std::vector<float>& x, std::size_t bucket, const EncodeContext& ctx,
                       void* stream) {
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
  cuda::sign_encode(d_in.get(), count, bucket, d_payload.get(), nullptr, &workspace, stream);
  EXPECT_EQ(workspace, 0u);
  cuda::sign_encode(d_in.get(), count, bucket, d_payload.get(), nullptr, nullptr, stream);
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
  check_decode(message, count, bucket, stream);
}

constexpr Data kData[] = {Data::gaussian, Data::wide_range, Data::finite_specials, Data::nonfinite};

void check_count(std::size_t count, const std::vector<std::size_t>& buckets, void* stream) {
  for (Data data : kData) {
    const std::vector<float> x = make_data(count, data, 2000 + count);
    for (std::size_t bucket : buckets) {
      SCOPED_TRACE("count=" + std::to_string(count) + " bucket=" + std::to_string(bucket) +
                   " data=" + data_name(data));
      check_against_cpu(x, bucket, EncodeContext{}, stream);
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

TEST_F(CudaSign, SmallCountsMatchTheCpuCodec) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
    check_count(count, {1, 7, 512, 15, 16, 17}, stream());
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaSign, MillionElementsMatchTheCpuCodec) {
  check_count((std::size_t{1} << 20) + 3, {1, 7, 512, 15, 16, 17, 100, std::size_t{1} << 22},
              stream());
}

TEST_F(CudaSign, TwoTo26ElementsMatchTheCpuCodec) {
  const std::size_t count = std::size_t{1} << 26;
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < count * 24) GTEST_SKIP() << "needs " << count * 24 << " bytes of device memory";
  check_count(count, {1, 7, 512}, stream());
}

// The sign codec draws no random numbers: a chunk with any context encodes like the CPU's.
TEST_F(CudaSign, ChunksWithAnElementOffsetMatchTheCpuCodec) {
  const std::vector<float> x = make_data(50001, Data::nonfinite, 7);
  EncodeContext ctx;
  ctx.seed = 77;
  ctx.step = 3;
  ctx.tensor_id = 9;
  for (std::uint64_t offset : {std::uint64_t{3}, std::uint64_t{512 * 37}, (std::uint64_t{1} << 34) + 5}) {
    ctx.element_offset = offset;
    for (std::size_t bucket : {std::size_t{7}, std::size_t{512}}) {
      SCOPED_TRACE("offset=" + std::to_string(offset) + " bucket=" + std::to_string(bucket));
      check_against_cpu(x, bucket, ctx, stream());
      if (HasFatalFailure()) return;
    }
  }
}

// A payload at an odd address (inside a message after a header of any size).
TEST_F(CudaSign, UnalignedPayloadsEncodeAndDecode) {
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
    cuda::sign_encode(d_in.get(), count, bucket, d_payload, nullptr, nullptr, stream());
    DeviceArray<float> d_out(count);
    DeviceArray<int> d_status(1);
    cuda::sign_decode(d_payload, count, bucket, d_out.get(), false, d_status.get(), stream());
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

// Scales may hold any bits (both decoders accept them): negative, -0, NaNs of any payload.
TEST_F(CudaSign, AnyScaleBitsDecodeLikeTheCpu) {
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
  check_decode(message, count, bucket, stream());
}

TEST_F(CudaSign, NonzeroUnusedBitsSetTheStatusAndWriteNothing) {
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
                          stream());
        sync(stream());
        EXPECT_EQ(d_status.download()[0], cuda::kSignStatusUnusedBits) << "accumulate=" << accumulate;
        EXPECT_EQ(first_float_difference(d_out.download(), sentinel, count, false), kNoDifference)
            << "accumulate=" << accumulate << ": the output was written";
      }
    }
  }
}

}  // namespace
}  // namespace gradzip
