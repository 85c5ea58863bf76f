// Header-only helpers shared by the tests/gpu/test_*.cpp executables: the fixtures that skip
// (saying why) without a CUDA device, device memory owners and copies, status readback, test
// data, and byte/bit comparisons with readable failure messages.
#pragma once

#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/host_device.h"

namespace gradzip::gpu_test {

using kernels::bits_float;
using kernels::float_bits;

// What the first_*_difference functions return when there is none.
inline constexpr std::size_t kNoDifference = std::numeric_limits<std::size_t>::max();

// ---- fixtures ----------------------------------------------------------------------------------

// Skips every test of the fixture, printing the reason, when no CUDA device is present.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* reason = nullptr;
    if (kernels::cuda::device_count(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  }
};

// True when the CUDA calls run on the emulated device (kernels/emulated/emulated_device.h):
// GRADZIP_DEVICE=emulated, or a build without the CUDA toolkit.
inline bool on_emulated_device() { return kernels::emulated::active(); }

// Skips a case whose point is a CUDA kernel's own arithmetic at a scale the emulated device
// cannot serve in a test's time or memory (there each kernel is its CPU twin, so the case would
// compare the CPU codec with itself). `why` says what the case needs.
#define GZ_SKIP_ON_EMULATED_DEVICE(why)                                                         \
  do {                                                                                          \
    if (::gradzip::gpu_test::on_emulated_device())                                              \
      GTEST_SKIP() << "on the emulated device: " << (why)                                       \
                   << " (a kernel-arithmetic case; it runs on a GPU)";                          \
  } while (false)

// DeviceTest with a stream of its own.
class StreamTest : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* stream() const { return static_cast<void*>(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

// A producer of data on a NON-BLOCKING stream (it does not wait for, nor make wait, the legacy
// default stream) whose work can be held back: hold(ms) queues a host function that sleeps, so
// everything queued after it on the stream runs at least `ms` later. What a test writes through
// it (device-to-device copies, which are truly asynchronous) is seen only by code that orders
// itself after the stream's work (an event wait): code that skipped it reads stale data while
// the stream sleeps, and the test's byte comparison fails.
class DelayedProducer {
 public:
  DelayedProducer() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  ~DelayedProducer() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  DelayedProducer(const DelayedProducer&) = delete;
  DelayedProducer& operator=(const DelayedProducer&) = delete;

  void* stream() const { return static_cast<void*>(stream_); }
  void hold(int milliseconds) {
    auto* delay = new int(milliseconds);
    ASSERT_EQ(cudaLaunchHostFunc(
                  stream_,
                  [](void* data) {
                    const int ms = *static_cast<int*>(data);
                    delete static_cast<int*>(data);
                    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
                  },
                  delay),
              cudaSuccess);
  }
  // to[0, bytes) = from[0, bytes) (both device memory), queued on the stream.
  void copy(void* to, const void* from, std::size_t bytes) {
    ASSERT_EQ(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

inline void sync(void* stream) {
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
}

// ---- device memory -----------------------------------------------------------------------------

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
  // Sets every byte of the allocation to 0.
  void zero() {
    EXPECT_EQ(cudaMemset(ptr_, 0, std::max<std::size_t>(n_, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // see finish_legacy_stream
  }
  void upload(const std::vector<T>& host) {
    ASSERT_LE(host.size(), n_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // see finish_legacy_stream
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

// Device memory of `bytes` bytes, freed on scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t bytes) {
    EXPECT_EQ(cudaMalloc(&pointer_, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(pointer_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  std::byte* get() const { return static_cast<std::byte*>(pointer_); }
  template <typename T>
  T* as() const { return static_cast<T*>(pointer_); }

 private:
  void* pointer_ = nullptr;
};

// A new device copy of `host` (the caller cudaFrees it).
template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // see finish_legacy_stream
  return device;
}

// Waits until everything queued on the legacy default stream has run. cudaMemcpy from pageable
// memory and cudaMemset may return before the device memory is written, and the transports
// and Reducer lanes read on non-blocking streams, which do not wait for the legacy stream:
// the helpers that write test data call this, so that no test races its own set-up.
inline void finish_legacy_stream() {
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

inline void to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes > 0) {
    ASSERT_EQ(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    finish_legacy_stream();
  }
}

template <typename T>
void to_device(T* device, const std::vector<T>& host) {
  to_device(static_cast<void*>(device), host.data(), host.size() * sizeof(T));
}

// `count` elements of T from device memory.
template <typename T>
std::vector<T> from_device(const void* device, std::size_t count) {
  std::vector<T> host(count);
  if (count > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return host;
}

template <typename T>
std::vector<T> from_device(const T* device, std::size_t count) {
  return from_device<T>(static_cast<const void*>(device), count);
}

// The decoder status a kernel left at d_status (-1 when the copy fails).
inline int status_of(const int* d_status) {
  int status = -1;
  EXPECT_EQ(cudaMemcpy(&status, d_status, sizeof status, cudaMemcpyDeviceToHost), cudaSuccess);
  return status;
}

// ---- test data ---------------------------------------------------------------------------------

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// ---- data --------------------------------------------------------------------------------------

enum class Data { gaussian, wide_range, finite_specials, nonfinite };

inline const char* data_name(Data data) {
  switch (data) {
    case Data::gaussian: return "gaussian";
    case Data::wide_range: return "wide range";
    case Data::finite_specials: return "finite specials";
    case Data::nonfinite: return "inf/nan";
  }
  return "?";
}

inline std::vector<float> gaussian(std::size_t count, std::uint64_t seed) {
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
inline std::vector<float> make_data(std::size_t count, Data data, std::uint64_t seed) {
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

inline std::size_t first_byte_difference(const std::byte* a, const std::byte* b, std::size_t n) {
  if (n == 0 || std::memcmp(a, b, n) == 0) return kNoDifference;
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return kNoDifference;
}

// The first index whose bits differ; with nan_equal, any two NaNs count as equal.
inline std::size_t first_float_difference(const std::vector<float>& a, const std::vector<float>& b,
                                   std::size_t n, bool nan_equal) {
  for (std::size_t i = 0; i < n; ++i) {
    if (float_bits(a[i]) == float_bits(b[i])) continue;
    if (nan_equal && a[i] != a[i] && b[i] != b[i]) continue;
    return i;
  }
  return kNoDifference;
}

// Equal bit for bit; otherwise says which element differs first.
inline ::testing::AssertionResult same_bits(std::span<const float> want, std::span<const float> got) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "sizes " << want.size() << " vs " << got.size();
  if (want.empty() || std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (float_bits(want[i]) != float_bits(got[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": want 0x" << std::hex << float_bits(want[i])
             << ", got 0x" << float_bits(got[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// `got` equals the bytes at `want`; otherwise says which byte differs first.
inline ::testing::AssertionResult same_bytes(const std::byte* want,
                                             const std::vector<std::byte>& got) {
  if (got.empty() || std::memcmp(want, got.data(), got.size()) == 0)
    return ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (want[i] != got[i]) {
      return ::testing::AssertionFailure() << "byte " << i << ": want "
                                           << std::to_integer<int>(want[i]) << ", got "
                                           << std::to_integer<int>(got[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}


// ---- decoders against the CPU codec ------------------------------------------------------------

// Decodes `message` (the CPU codec's, of `count` elements) on the device, plainly and
// accumulating, against codec.decode / decode_add: the same bits (any two NaNs equal when
// accumulating: CPUs and GPUs pick NaN payloads differently) and *d_status == ok_status.
// decode(d_payload, d_out, accumulate, d_status) launches the device decoder on `stream`.
template <typename Decode>
void check_decode_against_cpu(const Codec& codec, const std::vector<std::byte>& message,
                              std::size_t count, int ok_status, void* stream, Decode decode) {
  DeviceArray<std::byte> d_payload(
      std::vector<std::byte>(message.begin() + compressors::kWireHeaderBytes, message.end()));
  DeviceArray<int> d_status(1);
  ASSERT_EQ(cudaMemset(d_status.get(), 0x7F, sizeof(int)), cudaSuccess);  // the decoder resets it

  std::vector<float> cpu_out(count, 0.0f);
  codec.decode(message, host_view(cpu_out.data(), count));
  DeviceArray<float> d_out(count);
  ASSERT_EQ(cudaMemset(d_out.get(), 0xEE, std::max<std::size_t>(count, 1) * sizeof(float)),
            cudaSuccess);
  decode(d_payload.get(), d_out.get(), false, d_status.get());
  sync(stream);
  EXPECT_EQ(d_status.download()[0], ok_status);
  const std::vector<float> gpu_out = d_out.download();
  const std::size_t decode_diff = first_float_difference(gpu_out, cpu_out, count, false);
  ASSERT_EQ(decode_diff, kNoDifference)
      << "decode of element " << decode_diff << ": gpu " << hex(float_bits(gpu_out[decode_diff]))
      << ", cpu " << hex(float_bits(cpu_out[decode_diff]));

  // One f32 add per element on both sides.
  std::vector<float> cpu_acc = gaussian(count, 99);
  DeviceArray<float> d_acc(cpu_acc);
  codec.decode_add(message, cpu_acc.data(), count);
  decode(d_payload.get(), d_acc.get(), true, d_status.get());
  sync(stream);
  EXPECT_EQ(d_status.download()[0], ok_status);
  const std::vector<float> gpu_acc = d_acc.download();
  const std::size_t acc_diff = first_float_difference(gpu_acc, cpu_acc, count, true);
  ASSERT_EQ(acc_diff, kNoDifference)
      << "decode-accumulate of element " << acc_diff << ": gpu " << hex(float_bits(gpu_acc[acc_diff]))
      << ", cpu " << hex(float_bits(cpu_acc[acc_diff]));
}

// Encodes x (the input one float past a 16-byte boundary) into a payload at each offset 1, 2, 4
// and 8 from a word boundary and decodes it into an output one float past one: the payload must
// be `message`'s (the CPU codec's, after its header), *d_status == ok_status, and the decode the
// CPU decoder's bits. encode(d_in, d_payload) and decode(d_payload, d_out, d_status) launch the
// device kernels on `stream`.
template <typename Encode, typename Decode>
void check_unaligned_round_trip(const Codec& codec, const std::vector<float>& x,
                                const std::vector<std::byte>& message, int ok_status, void* stream,
                                Encode encode, Decode decode) {
  const std::size_t count = x.size();
  const std::size_t payload_bytes = message.size() - compressors::kWireHeaderBytes;
  std::vector<float> cpu_out(count);
  codec.decode(message, host_view(cpu_out.data(), count));
  std::vector<float> padded(count + 1, 0.0f);
  std::copy(x.begin(), x.end(), padded.begin() + 1);
  DeviceArray<float> d_in(padded);
  for (std::size_t offset : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
    SCOPED_TRACE("payload offset=" + std::to_string(offset));
    DeviceArray<std::byte> d_buffer(payload_bytes + offset);
    std::byte* const d_payload = d_buffer.get() + offset;
    encode(d_in.get() + 1, d_payload);
    DeviceArray<float> d_out(count + 1);
    DeviceArray<int> d_status(1);
    decode(d_payload, d_out.get() + 1, d_status.get());
    sync(stream);
    const std::vector<std::byte> buffer = d_buffer.download();
    EXPECT_EQ(first_byte_difference(buffer.data() + offset, message.data() + compressors::kWireHeaderBytes,
                                    payload_bytes),
              kNoDifference);
    EXPECT_EQ(d_status.download()[0], ok_status);
    const std::vector<float> out = d_out.download();
    EXPECT_EQ(first_float_difference(std::vector<float>(out.begin() + 1, out.end()), cpu_out, count, false),
              kNoDifference);
  }
}

}  // namespace gradzip::gpu_test
