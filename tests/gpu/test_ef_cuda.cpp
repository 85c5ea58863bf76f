// The CUDA error-feedback kernels give the CPU ErrorFeedbackCodec's bits over several steps:
// the fused fp16 / bf16 update (payload bytes and residual), the same update built from
// ef_compensate, the cast kernels and ef_update (in place), and ef_compensate / ef_update around
// the CPU top-k codec. The fused element function is checked against the CPU codec here without
// a device; the device tests skip, saying why, when no device is present.
#include <gtest/gtest.h>
#include <unistd.h>
#include "kernels/device_api.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compressors/wire_format.h"
#include "collectives/device_memory.h"
#include "error_feedback/device_residual.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/ef_cuda.h"
#include "compressors/qsgd/cuda/qsgd_kernels.h"
#include "compressors/sign/cuda/sign_kernels.h"
#include "gpu_test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using error_feedback::ErrorFeedbackCodec;
using error_feedback::ResidualStore;
namespace cuda = kernels::cuda;
using namespace gpu_test;

constexpr std::size_t kCounts[] = {0, 1, 7, (std::size_t{1} << 20) + 3, std::size_t{1} << 26};
constexpr int kSteps = 3;

// kCounts without 2^26 on the emulated device (printed): that count exercises the kernels' grid
// strides, which the emulated device replaces by CPU twins, and costs tens of seconds there.
std::vector<std::size_t> counts_here() {
  std::vector<std::size_t> counts;
  for (std::size_t n : kCounts) {
    if (on_emulated_device() && n > (std::size_t{1} << 24)) {
      std::printf("on the emulated device: count %zu left out (a kernel-scale count; it runs on a GPU)\n", n);
      continue;
    }
    counts.push_back(n);
  }
  return counts;
}

// Deterministic finite gradients: mostly magnitudes 2^-10 .. 2^10 (f16 and bf16 both round,
// f16 also into its subnormals), some zeros of either sign and some f32 subnormals. Small
// enough that no step overflows f16, so every residual stays finite.
std::vector<float> gradient(std::size_t n, std::uint64_t seed) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = mix(seed * 0x100000001B3ull + i);
    const std::uint32_t kind = static_cast<std::uint32_t>(r & 63);
    const std::uint32_t sign = static_cast<std::uint32_t>((r >> 6) & 1) << 31;
    const std::uint32_t mantissa = static_cast<std::uint32_t>(r >> 8) & 0x7FFFFFu;
    std::uint32_t bits;
    if (kind == 0) bits = sign;
    else if (kind == 1) bits = sign | mantissa;
    else if (kind == 2) bits = sign | (103u << 23) | mantissa;  // around f16's subnormals
    else bits = sign | ((117u + static_cast<std::uint32_t>((r >> 40) % 21)) << 23) | mantissa;
    values[i] = kernels::bits_float(bits);
  }
  return values;
}

// The halves of a payload (little-endian u16s at `payload`) equal `got`, one for one.
::testing::AssertionResult same_halves(const std::byte* payload, const std::vector<std::uint16_t>& got) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint16_t want = 0;
    std::memcpy(&want, payload + i * sizeof want, sizeof want);
    if (want != got[i]) {
      return ::testing::AssertionFailure() << "element " << i << ": want 0x" << std::hex << want
                                           << ", got 0x" << got[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// One rank's CPU error feedback over tensor "t".
struct CpuFeedback {
  explicit CpuFeedback(const char* spec)
      : store(1, 0, ResizePolicy::error),
        codec(std::shared_ptr<const Codec>(make_codec(spec)), store) {}
  std::vector<std::byte> encode(const std::vector<float>& g, std::uint32_t step) {
    std::vector<std::byte> message(codec.max_encoded_bytes(g.size()));
    message.resize(codec.encode("t", host_view(g.data(), g.size()), message,
                                EncodeContext{3, step, 0, 0}));
    return message;
  }
  std::span<const float> residual() const {
    return static_cast<const ResidualStore&>(store).residual("t");
  }
  ResidualStore store;
  ErrorFeedbackCodec codec;
};

// ---- host-side check (no device needed) ----------------------------------------------------

// ef_cast_element, step after step, gives the CPU fp16 / bf16 codec's payload and residual.
TEST(EfCudaHost, CastElementMatchesTheCpuCodec) {
  constexpr std::size_t n = 100003;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    CpuFeedback cpu(bf16 ? "bf16" : "fp16");
    std::vector<float> residual(n, 0.0f);
    std::vector<std::uint16_t> halves(n);
    for (int step = 0; step < 5; ++step) {
      const std::vector<float> g = gradient(n, 10 + step);
      const std::vector<std::byte> message = cpu.encode(g, static_cast<std::uint32_t>(step));
      for (std::size_t i = 0; i < n; ++i) halves[i] = kernels::ef_cast_element(g[i], residual[i], bf16);
      ASSERT_TRUE(same_halves(message.data() + kWireHeaderBytes, halves)) << "step " << step;
      ASSERT_TRUE(same_bits(cpu.residual(), residual)) << "step " << step;
    }
  }
}

// ---- device tests --------------------------------------------------------------------------

class CudaEf : public DeviceTest {};

// Device memory of `count` elements of T, zeroed, freed on scope exit.
template <typename T>
class DeviceArray : public gpu_test::DeviceArray<T> {
 public:
  explicit DeviceArray(std::size_t count) : gpu_test::DeviceArray<T>(count) { this->zero(); }
};

// Over kSteps steps: ef_cast_fused, and ef_compensate (in place) + cast + widen + ef_update,
// give the CPU codec's payload bytes and residual bits, with 16-byte aligned arrays (vector
// path) and arrays one element off (element path).
TEST_F(CudaEf, CastUpdatesMatchTheCpuCodec) {
  for (const std::size_t n : counts_here()) {
    for (const bool bf16 : {false, true}) {
      for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp16") + ", n = " + std::to_string(n) +
                     ", offset = " + std::to_string(offset));
        CpuFeedback cpu(bf16 ? "bf16" : "fp16");
        DeviceArray<float> fused_g(n + 1), fused_e(n + 1), split_g(n + 1), split_e(n + 1),
            split_decoded(n + 1);
        DeviceArray<std::uint16_t> fused_h(n + 1), split_h(n + 1);
        for (int step = 0; step < kSteps; ++step) {
          SCOPED_TRACE("step " + std::to_string(step));
          const std::vector<float> g = gradient(n, 100 * n + step);
          const std::vector<std::byte> message = cpu.encode(g, static_cast<std::uint32_t>(step));
          const std::byte* payload = message.data() + kWireHeaderBytes;

          to_device(fused_g.get() + offset, g);
          cuda::ef_cast_fused(fused_g.get() + offset, fused_e.get() + offset,
                              fused_h.get() + offset, bf16, n, nullptr);

          to_device(split_g.get() + offset, g);
          float* c = split_g.get() + offset;  // g + e replaces g
          cuda::ef_compensate(c, split_e.get() + offset, c, n, nullptr);
          std::uint16_t* h = split_h.get() + offset;
          float* decoded = split_decoded.get() + offset;
          if (bf16) {
            cuda::f32_to_bf16(c, h, n, nullptr);
            cuda::bf16_to_f32(h, decoded, n, nullptr);
          } else {
            cuda::f32_to_f16(c, h, n, nullptr);
            cuda::f16_to_f32(h, decoded, n, nullptr);
          }
          cuda::ef_update(c, decoded, split_e.get() + offset, n, nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

          ASSERT_TRUE(same_halves(payload, from_device(fused_h.get() + offset, n))) << "fused";
          ASSERT_TRUE(same_bits(cpu.residual(), from_device(fused_e.get() + offset, n))) << "fused";
          ASSERT_TRUE(same_halves(payload, from_device(h, n))) << "split";
          ASSERT_TRUE(same_bits(cpu.residual(), from_device(split_e.get() + offset, n))) << "split";
        }
      }
    }
  }
}

// A fused encode that declines: it returns false and leaves the residual as it was.
template <typename Call>
void expect_declined(const DeviceArray<float>& d_e, Call&& call) {
  const std::vector<float> untouched = d_e.download();
  EXPECT_FALSE(call());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(same_bits(untouched, d_e.download())) << "a declined call wrote the residual";
}

// sign_encode_with_feedback gives the CPU ErrorFeedbackCodec's sign payload and residual, step
// after step, where sign_fuses_feedback allows it (whole staged segments ending on sign-byte
// boundaries), with the arrays aligned (vector staging) and one element off (element staging),
// also for a bucket whose sum overflows (the scale's rescue over c); and declines, launching
// nothing, for the other shapes.
TEST_F(CudaEf, SignFusedFeedbackMatchesTheCpuOrDeclines) {
  struct Shape {
    std::size_t count;
    std::size_t bucket;
    bool fuses;
  };
  const Shape shapes[] = {{10000, 512, true}, {12288, 64, true}, {5003, 8, true}, {1, 512, true},
                          {4100, 4096, true}, {9000, 3, false}, {10000, 5000, false}};
  for (const Shape& shape : shapes) {
    const std::size_t n = shape.count;
    EXPECT_EQ(cuda::sign_fuses_feedback(n, shape.bucket), shape.fuses)
        << n << " elements, bucket " << shape.bucket;
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      const std::string spec = "sign:bucket=" + std::to_string(shape.bucket);
      SCOPED_TRACE(spec + ", n = " + std::to_string(n) + ", offset = " + std::to_string(offset));
      CpuFeedback cpu(spec.c_str());
      DeviceArray<float> d_g(n + 1), d_e(n + 1);
      DeviceArray<std::byte> d_payload(cuda::sign_payload_bytes(n, shape.bucket) + 1);
      if (!shape.fuses) {
        expect_declined(d_e, [&] {
          return cuda::sign_encode_with_feedback(d_g.get(), d_e.get(), n, shape.bucket,
                                                 d_payload.get(), nullptr);
        });
        continue;
      }
      for (int step = 0; step < kSteps; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        std::vector<float> g = gradient(n, 31 * n + step);
        if (step == 1 && n > shape.bucket) {
          // A bucket whose |x| sum overflows f32: the scale is rescued over c.
          for (std::size_t i = 0; i < shape.bucket; ++i) g[i] = (i % 2 ? -3.0e38f : 3.0e38f);
        }
        const std::vector<std::byte> message = cpu.encode(g, static_cast<std::uint32_t>(step));
        to_device(d_g.get() + offset, g);
        ASSERT_TRUE(cuda::sign_encode_with_feedback(d_g.get() + offset, d_e.get() + offset, n,
                                                    shape.bucket, d_payload.get() + offset, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::size_t payload_bytes = message.size() - kWireHeaderBytes;
        ASSERT_EQ(payload_bytes, cuda::sign_payload_bytes(n, shape.bucket));
        const std::vector<std::byte> payload = from_device(d_payload.get() + offset, payload_bytes);
        ASSERT_TRUE(same_bytes(message.data() + kWireHeaderBytes, payload));
        ASSERT_TRUE(same_bits(cpu.residual(), from_device(d_e.get() + offset, n)));
      }
    }
  }
}

// qsgd_encode_with_feedback gives the CPU ErrorFeedbackCodec's qsgd payload and residual, step
// after step (the random stream keyed by the step), where qsgd_fuses_feedback allows it
// (resident segments of whole runs owning whole code bytes), aligned and one element off; and
// declines, launching nothing, for the other shapes.
TEST_F(CudaEf, QsgdFusedFeedbackMatchesTheCpuOrDeclines) {
  struct Shape {
    std::size_t count;
    int bits;
    std::size_t bucket;
    bool fuses;
  };
  const Shape shapes[] = {{10000, 4, 512, true},  {12288, 8, 64, true},   {4099, 2, 512, true},
                          {1, 4, 512, true},      {3001, 3, 1001, false}, {10000, 4, 9000, false}};
  for (const Shape& shape : shapes) {
    const std::size_t n = shape.count;
    EXPECT_EQ(cuda::qsgd_fuses_feedback(n, shape.bits, shape.bucket), shape.fuses)
        << n << " elements, bits " << shape.bits << ", bucket " << shape.bucket;
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      const std::string spec =
          "qsgd:bits=" + std::to_string(shape.bits) + ",bucket=" + std::to_string(shape.bucket);
      SCOPED_TRACE(spec + ", n = " + std::to_string(n) + ", offset = " + std::to_string(offset));
      CpuFeedback cpu(spec.c_str());
      DeviceArray<float> d_g(n + 1), d_e(n + 1);
      DeviceArray<std::byte> d_payload(cuda::qsgd_payload_bytes(n, shape.bits, shape.bucket) + 1);
      if (!shape.fuses) {
        expect_declined(d_e, [&] {
          return cuda::qsgd_encode_with_feedback(d_g.get(), d_e.get(), n, shape.bits, shape.bucket,
                                                 cuda::QsgdEncodeParams{}, d_payload.get(), nullptr);
        });
        continue;
      }
      for (int step = 0; step < kSteps; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const std::vector<float> g = gradient(n, 37 * n + step);
        const std::vector<std::byte> message = cpu.encode(g, static_cast<std::uint32_t>(step));
        to_device(d_g.get() + offset, g);
        // CpuFeedback encodes with EncodeContext{3, step, 0, 0}.
        const cuda::QsgdEncodeParams params{3, static_cast<std::uint32_t>(step), 0, 0};
        ASSERT_TRUE(cuda::qsgd_encode_with_feedback(d_g.get() + offset, d_e.get() + offset, n,
                                                    shape.bits, shape.bucket, params,
                                                    d_payload.get() + offset, nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::size_t payload_bytes = message.size() - kWireHeaderBytes;
        ASSERT_EQ(payload_bytes, cuda::qsgd_payload_bytes(n, shape.bits, shape.bucket));
        const std::vector<std::byte> payload = from_device(d_payload.get() + offset, payload_bytes);
        ASSERT_TRUE(same_bytes(message.data() + kWireHeaderBytes, payload));
        ASSERT_TRUE(same_bits(cpu.residual(), from_device(d_e.get() + offset, n)));
      }
    }
  }
}

// ef_compensate and ef_update around a codec without a fused kernel (top-k, on the host here):
// c is the CPU's g + e, the codec's message from the GPU's c is the CPU feedback's message,
// and the residual after ef_update is the CPU's, step after step.
TEST_F(CudaEf, CompensateAndUpdateAroundTopkMatchTheCpu) {
  for (const std::size_t n : counts_here()) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const char* spec = "topk:ratio=0.01";
    CpuFeedback cpu(spec);
    const auto topk = make_codec(spec);
    DeviceArray<float> d_g(n), d_e(n), d_c(n), d_decoded(n);
    std::vector<float> previous_residual(n, 0.0f);
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const std::vector<float> g = gradient(n, 7 * n + step);
      const std::vector<std::byte> message = cpu.encode(g, static_cast<std::uint32_t>(step));

      to_device(d_g.get(), g);
      cuda::ef_compensate(d_g.get(), d_e.get(), d_c.get(), n, nullptr);
      const std::vector<float> c = from_device(d_c.get(), n);
      std::vector<float> want_c(n);
      for (std::size_t i = 0; i < n; ++i) want_c[i] = g[i] + previous_residual[i];
      ASSERT_TRUE(same_bits(want_c, c));

      std::vector<std::byte> gpu_message(topk->max_encoded_bytes(n));
      gpu_message.resize(topk->encode(host_view(c.data(), n), gpu_message,
                                      EncodeContext{3, static_cast<std::uint32_t>(step), 0, 0}));
      ASSERT_EQ(gpu_message, message);
      std::vector<float> decoded(n);
      topk->decode(gpu_message, host_view(decoded.data(), n));
      to_device(d_decoded.get(), decoded);
      cuda::ef_update(d_c.get(), d_decoded.get(), d_e.get(), n, nullptr);
      const std::vector<float> residual = from_device(d_e.get(), n);
      ASSERT_TRUE(same_bits(cpu.residual(), residual));
      previous_residual = residual;
    }
  }
}

// The residual store's device residuals (ResidualStore::device_residual): values move to the
// device once and stay there across encodes, a read refreshes the host mirror without moving
// them, a host span brings them back for good, and fold_into, save and load see the device
// values. Values are checked exactly against what was written through the device pointer.
TEST_F(CudaEf, ResidualStoreMovesResidualsToTheDeviceAndBack) {
  ResidualStore store(1, 0, ResizePolicy::error);
  const std::size_t n = 1001;
  std::span<float> host = store.residual("w", n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) - 500.0f;
  float* d = store.device_residual("w", n, 0);
  ASSERT_TRUE(store.on_device("w"));
  EXPECT_EQ(store.device_residual("w", n, 0), d) << "a second request moved it again";
  EXPECT_EQ(from_device<float>(d, n), std::vector<float>(host.begin(), host.end()))
      << "the host values were not uploaded";

  // Written on the device (as an encode's ef_update does), read back through the mirror.
  std::vector<float> written(n);
  for (std::size_t i = 0; i < n; ++i) written[i] = 0.5f * static_cast<float>(i);
  to_device(d, written);
  const std::span<const float> mirror = std::as_const(store).residual("w");
  EXPECT_EQ(std::vector<float>(mirror.begin(), mirror.end()), written);
  EXPECT_TRUE(store.on_device("w")) << "a read moved the residual";

  // A fresh tensor's zeros need no upload; its device memory reads as zeros.
  float* fresh = store.device_residual("z", 7, 0);
  EXPECT_EQ(from_device<float>(fresh, 7), std::vector<float>(7, 0.0f));

  // fold_into sees device values: "w/part" placed at offset 10 of "w".
  store.register_tensor("w/part", 3);
  to_device(store.device_residual("w/part", 3, 0), std::vector<float>{1.0f, 2.0f, 4.0f});
  store.set_placement("w/part", "w", 10);
  EXPECT_EQ(store.fold_into("w", n), 1u);
  EXPECT_FALSE(store.on_device("w")) << "fold_into works on host memory";
  const std::span<float> folded = store.residual("w", n);
  EXPECT_EQ(folded[9], written[9]);
  EXPECT_EQ(folded[10], written[10] + 1.0f);
  EXPECT_EQ(folded[12], written[12] + 4.0f);

  // save() writes device values; load() into a store whose residual is on the device uploads.
  d = store.device_residual("w", n, 0);
  to_device(d, written);
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("gradzip-store-" + std::to_string(::getpid()));
  store.save(file);
  to_device(d, std::vector<float>(n, 9.0f));  // changed after the save
  store.load(file);
  std::filesystem::remove(file);
  EXPECT_EQ(from_device<float>(store.device_residual("w", n, 0), n), written);
}

// A journal over device residuals: the values the first use saw come back by a device copy
// (queued on the work stream; the read below waits for it), the residual stays on the device,
// and a residual moved to the device inside the journal goes back to host memory.
TEST_F(CudaEf, AJournalUndoesDeviceResidualsOnTheDevice) {
  ResidualStore store(1, 0, ResizePolicy::error);
  const std::size_t n = 513;
  std::vector<float> original(n);
  for (std::size_t i = 0; i < n; ++i) original[i] = 0.125f * static_cast<float>(i) - 3.0f;
  float* d = store.device_residual("w", n, 0);
  to_device(d, original);
  std::span<float> host = store.residual("h", 5);
  for (std::size_t i = 0; i < 5; ++i) host[i] = static_cast<float>(i + 1);

  store.begin_journal();
  EXPECT_EQ(store.device_residual("w", n, 0), d);
  to_device(d, std::vector<float>(n, 42.0f));  // what an encode's update would write
  to_device(store.device_residual("h", 5, 0), std::vector<float>(5, -1.0f));
  store.device_residual("fresh", 9, 0);
  store.end_journal(/*undo=*/true);

  EXPECT_TRUE(store.on_device("w"));
  EXPECT_EQ(store.device_residual("w", n, 0), d);
  EXPECT_EQ(from_device<float>(d, n), original);
  EXPECT_FALSE(store.on_device("h")) << "h lived in host memory before the journal";
  const std::span<const float> h = std::as_const(store).residual("h");
  EXPECT_EQ(std::vector<float>(h.begin(), h.end()), (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_FALSE(store.contains("fresh"));
}

// Residuals move between device and host through two pinned blocks: every block size (one
// value, an odd count of values, a size that is not a whole number of values, more than the
// residual) gives the exact values both ways, and the bytes copied are the residual's.
TEST_F(CudaEf, ResidualsMoveThroughPinnedStagingExactly) {
  const std::size_t n = 10007;
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = std::ldexp(static_cast<float>(i) - 5000.5f, static_cast<int>(i % 40) - 20);
  for (const std::size_t staging : {std::size_t{4}, std::size_t{4 * 7 + 3}, std::size_t{4096},
                                    n * sizeof(float) - 4, std::size_t{1} << 20}) {
    SCOPED_TRACE("staging blocks of " + std::to_string(staging) + " bytes");
    error_feedback::DeviceResidual residual(n, 0);
    const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
    residual.upload(values, staging);
    EXPECT_EQ(from_device<float>(residual.data(), n), values);
    to_device(residual.data(), std::vector<float>(n, 0.0f));
    to_device(residual.data(), values);
    std::vector<float> back(n, -1.0f);
    const collectives::DeviceRuntimeCounts middle = collectives::device_runtime_counts();
    residual.download(back, staging);
    const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
    EXPECT_EQ(back, values);
    // Each direction copies the residual's bytes once (the runtime seam counts every copy
    // between host and device memory): the upload, then the test's read and two writes; then
    // the download.
    EXPECT_EQ(middle.host_device_bytes - before.host_device_bytes, 4 * n * sizeof(float));
    EXPECT_EQ(after.host_device_bytes - middle.host_device_bytes, n * sizeof(float));
  }
  error_feedback::DeviceResidual residual(3, 0);
  std::vector<float> three(3);
  EXPECT_THROW(residual.download(three, 3), gradzip::Error);  // a block that holds no value
}

}  // namespace
}  // namespace gradzip
