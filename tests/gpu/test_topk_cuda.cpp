// The CUDA top-k selection writes the CPU codec's payload bytes: exact top-k byte for byte over
// counts {0, 1, 7, 2^20+3, 2^26}, k in {1, 1%, 50%, 100%}, Gaussian data with NaN / Inf / +-0 /
// subnormals, tie-heavy data and all-zero data, f32 and f16 values; approx byte for byte too
// (same sample, same acceptance rule), which makes it the exact top-m with
// ceil(k/2) <= m <= k, checked separately. Also: run-to-run determinism with a dirty
// workspace, unaligned payloads, the two-phase workspace query, and u64 indices above 2^32.
// Every case runs for both compaction variants (KernelVariant::fast, the one-pass look-back
// compactions, and KernelVariant::reference, the two-pass count / scan / write ones), each
// against the CPU codec. Skips, saying why, when no device is present.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "compressors/topk/topk_cpu.h"
#include "kernels/cuda/cast_cuda.h"
#include "compressors/topk/cuda/topk_kernels.h"
#include "compressors/topk/cuda/topk_plan.h"
#include "kernels/host_device.h"
#include "gpu_test_support.h"

namespace gradzip {
namespace {

using kernels::cuda::KernelVariant;
using kernels::cuda::TopkCudaOptions;

// Parameter: the compaction variant every selection of the case runs.
class CudaTopk : public gpu_test::DeviceTest, public ::testing::WithParamInterface<KernelVariant> {
 protected:
  // Default options for the variant under test.
  static TopkCudaOptions options_for_variant() {
    TopkCudaOptions options;
    options.variant = GetParam();
    return options;
  }
};

// Owning device allocation.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      const cudaError_t status = cudaMalloc(&data_, bytes);
      EXPECT_EQ(status, cudaSuccess) << "cudaMalloc of " << bytes << " bytes";
      if (status != cudaSuccess) data_ = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

struct Selection {
  std::uint64_t entries = 0;
  std::vector<std::byte> payload;  // entries * (index bytes + value bytes)
};

// The CPU codec's message for x, split into m and the payload bytes.
Selection cpu_encode(const std::vector<float>& x, std::uint64_t k, bool approx, bool half,
                     const EncodeContext& ctx = {}) {
  const std::string spec = "topk:k=" + std::to_string(k == 0 ? 1 : k) +
                           ",values=" + (half ? "fp16" : "fp32") + ",approx=" + (approx ? "on" : "off");
  const auto codec = make_codec(spec);
  EXPECT_EQ(codec->spec().k_for(x.size()), k) << spec;
  std::vector<std::byte> message(codec->max_encoded_bytes(x.size()));
  const std::size_t size = codec->encode(host_view(x.data(), x.size()), message, ctx);
  const auto header = compressors::read_header(std::span(message.data(), size), "test");
  Selection selection;
  selection.entries = header.large_param;
  selection.payload.assign(message.begin() + compressors::kWireHeaderBytes, message.begin() + size);
  return selection;
}

struct GpuRun {
  std::size_t payload_offset = 0;  // bytes the payload sits after a 256-aligned address
  bool dirty_workspace = false;    // fill the workspace with 0xFF bytes first
};

Selection gpu_select(const float* d_in, std::uint64_t n, std::uint64_t k,
                     const TopkCudaOptions& options, const GpuRun& run = {}) {
  std::size_t workspace_bytes = 0;
  kernels::cuda::topk_select(d_in, n, k, options, nullptr, nullptr, nullptr, &workspace_bytes,
                             nullptr);
  EXPECT_EQ(workspace_bytes, kernels::cuda::topk_workspace_bytes(n, k, options));
  // Never 0 (k == 0 and k == n included): a null workspace would make the call below a size query.
  EXPECT_GE(workspace_bytes, kernels::cuda::kTopkMinWorkspaceBytes);
  DeviceBuffer workspace(workspace_bytes);
  EXPECT_NE(workspace.get(), nullptr) << workspace_bytes << " bytes";
  if (run.dirty_workspace && workspace_bytes > 0) {
    EXPECT_EQ(cudaMemset(workspace.get(), 0xFF, workspace_bytes), cudaSuccess);
  }
  const std::size_t max_payload = kernels::cuda::topk_payload_bytes(n, k, options.half_values);
  DeviceBuffer payload(max_payload + run.payload_offset + 1);
  DeviceBuffer entries(sizeof(std::uint64_t));
  EXPECT_EQ(cudaMemset(entries.get(), 0xEE, sizeof(std::uint64_t)), cudaSuccess);
  kernels::cuda::topk_select(d_in, n, k, options, payload.get<std::byte>() + run.payload_offset,
                             entries.get<std::uint64_t>(), workspace.get(), &workspace_bytes,
                             nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Selection selection;
  EXPECT_EQ(cudaMemcpy(&selection.entries, entries.get(), sizeof(std::uint64_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_LE(selection.entries, k);
  if (selection.entries > k) return selection;
  selection.payload.resize(kernels::cuda::topk_payload_bytes(n, selection.entries, options.half_values));
  if (!selection.payload.empty()) {
    EXPECT_EQ(cudaMemcpy(selection.payload.data(), payload.get<std::byte>() + run.payload_offset,
                         selection.payload.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return selection;
}

Selection gpu_select(const std::vector<float>& x, std::uint64_t k, const TopkCudaOptions& options,
                     const GpuRun& run = {}) {
  DeviceBuffer input(x.size() * sizeof(float));
  if (!x.empty()) {
    EXPECT_EQ(cudaMemcpy(input.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  return gpu_select(input.get<float>(), x.size(), k, options, run);
}

enum class Data { gaussian, ties, zeros };

const char* data_name(Data data) {
  switch (data) {
    case Data::gaussian: return "gaussian";
    case Data::ties: return "ties";
    case Data::zeros: return "zeros";
  }
  return "?";
}

// Gaussian values with every kind of special sprinkled in; values from a small set (many equal
// magnitudes, both signs, -0); or +-0 only.
std::vector<float> make_data(Data data, std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  std::mt19937_64 random(seed);
  if (data == Data::gaussian) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(random);
    const float specials[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              kernels::bits_float(0x7FC00001u),  // NaN with a payload
                              kernels::bits_float(0xFFC12345u),  // negative NaN
                              kernels::bits_float(0x7F800001u),  // signalling NaN
                              -0.0f, 0.0f, kernels::bits_float(0x00000001u),
                              kernels::bits_float(0x80000003u), 65504.0f, 70000.0f, -1e-30f};
    for (std::size_t j = 0; j < std::size(specials) && n > 0; ++j)
      x[(j * 7919 + seed) % n] = specials[j];
  } else if (data == Data::ties) {
    const float set[] = {0.0f, -0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 2.0f, -2.0f, 0.25f};
    std::uniform_int_distribution<int> pick(0, static_cast<int>(std::size(set)) - 1);
    for (auto& v : x) v = set[pick(random)];
  } else {
    std::bernoulli_distribution negative(0.5);
    for (auto& v : x) v = negative(random) ? -0.0f : 0.0f;
  }
  return x;
}

std::vector<std::uint64_t> ks_for(std::uint64_t n) {
  if (n == 0) return {0};
  const auto ceil_ratio = [n](double ratio) {
    const auto k = static_cast<std::uint64_t>(std::ceil(ratio * static_cast<double>(n)));
    return k < 1 ? std::uint64_t{1} : (k > n ? n : k);
  };
  return {1, ceil_ratio(0.01), ceil_ratio(0.5), n};
}

void expect_same(const Selection& gpu, const Selection& cpu, const std::string& what) {
  ASSERT_EQ(gpu.entries, cpu.entries) << what;
  ASSERT_EQ(gpu.payload.size(), cpu.payload.size()) << what;
  if (gpu.payload != cpu.payload) {
    std::size_t first = 0;
    while (gpu.payload[first] == cpu.payload[first]) ++first;
    FAIL() << what << ": payloads differ first at byte " << first << " of " << gpu.payload.size();
  }
}

// Approx contract, independently of the CPU's approx: m in [ceil(k/2), k] and the entries are
// exactly the exact top-m (the CPU exact codec with k = m writes the same payload).
void expect_approx_contract(const std::vector<float>& x, std::uint64_t k, const Selection& gpu,
                            bool half, const std::string& what) {
  if (k == 0) {
    EXPECT_EQ(gpu.entries, 0u) << what;
    return;
  }
  ASSERT_GE(gpu.entries, k - k / 2) << what;
  ASSERT_LE(gpu.entries, k) << what;
  expect_same(gpu, cpu_encode(x, gpu.entries, false, half), what + " (as exact top-m)");
}

void check_count(KernelVariant variant, std::size_t n, std::initializer_list<Data> kinds,
                 std::initializer_list<bool> halves) {
  for (Data data : kinds) {
    const std::vector<float> x = make_data(data, n, 17 + n);
    DeviceBuffer input(x.size() * sizeof(float));
    if (n > 0) {
      ASSERT_EQ(cudaMemcpy(input.get(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    for (std::uint64_t k : ks_for(n)) {
      for (bool approx : {false, true}) {
        for (bool half : halves) {
          const EncodeContext ctx{12345, 7, 3, 0};
          TopkCudaOptions options;
          options.variant = variant;
          options.approx = approx;
          options.half_values = half;
          options.seed = ctx.seed;
          options.step = ctx.step;
          options.tensor_id = ctx.tensor_id;
          const std::string what = std::string(data_name(data)) + " n=" + std::to_string(n) +
                                   " k=" + std::to_string(k) + (approx ? " approx" : " exact") +
                                   (half ? " f16" : " f32");
          const Selection gpu = gpu_select(input.get<float>(), n, k, options);
          const Selection cpu = cpu_encode(x, k, approx, half, ctx);
          expect_same(gpu, cpu, what);
          if (!approx) {
            EXPECT_EQ(gpu.entries, k) << what;
          } else if (n <= (std::size_t{1} << 21)) {
            expect_approx_contract(x, k, gpu, half, what);
          }
        }
      }
    }
  }
}

TEST_P(CudaTopk, EmptyAndTinyTensorsMatchTheCpu) {
  check_count(GetParam(), 0, {Data::gaussian}, {false, true});
  check_count(GetParam(), 1, {Data::gaussian, Data::zeros}, {false, true});
  check_count(GetParam(), 7, {Data::gaussian, Data::ties, Data::zeros}, {false, true});
}

TEST_P(CudaTopk, MillionElementsMatchTheCpu) {
  check_count(GetParam(), (std::size_t{1} << 20) + 3, {Data::gaussian, Data::ties, Data::zeros},
              {false, true});
}

TEST_P(CudaTopk, SixtyFourMillionElementsMatchTheCpu) {
  GZ_SKIP_ON_EMULATED_DEVICE("2^26 elements in several selections take minutes on the CPU");
  check_count(GetParam(), std::size_t{1} << 26, {Data::gaussian, Data::ties}, {false});
  check_count(GetParam(), std::size_t{1} << 26, {Data::gaussian}, {true});
}

// Sizes around the sampling boundary, the tile size and odd counts.
TEST_P(CudaTopk, AssortedSizesMatchTheCpu) {
  for (std::size_t n : {2u, 3u, 100u, 4095u, 4096u, 4097u, 65535u, 65536u, 65537u, 70001u, 300007u}) {
    const std::vector<float> x = make_data(Data::gaussian, n, n);
    for (std::uint64_t k : {std::uint64_t{1}, std::uint64_t{2}, n / 3 + 1, n - 1}) {
      for (bool approx : {false, true}) {
        TopkCudaOptions options = options_for_variant();
        options.approx = approx;
        options.seed = 99;
        expect_same(gpu_select(x, k, options), cpu_encode(x, k, approx, false, EncodeContext{99}),
                    "n=" + std::to_string(n) + " k=" + std::to_string(k) + (approx ? " approx" : ""));
      }
    }
  }
}

// Approx over many sample keys: the GPU takes the CPU's choice each time, and the accepted
// path (m < k) is among them.
TEST_P(CudaTopk, ApproxFollowsTheCpuAcrossSeeds) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const std::vector<float> x = make_data(Data::gaussian, n, 5);
  DeviceBuffer input(n * sizeof(float));
  ASSERT_EQ(cudaMemcpy(input.get(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  int accepted = 0;
  for (std::uint64_t seed = 0; seed < 16; ++seed) {
    for (std::uint64_t k : {std::uint64_t{10486}, std::uint64_t{1000}}) {
      TopkCudaOptions options = options_for_variant();
      options.approx = true;
      options.seed = seed;
      options.step = 1;
      options.tensor_id = 2;
      const Selection gpu = gpu_select(input.get<float>(), n, k, options);
      const Selection cpu = cpu_encode(x, k, true, false, EncodeContext{seed, 1, 2, 0});
      const std::string what = "seed " + std::to_string(seed) + " k=" + std::to_string(k);
      expect_same(gpu, cpu, what);
      expect_approx_contract(x, k, gpu, false, what);
      if (gpu.entries < k) ++accepted;
    }
  }
  EXPECT_GT(accepted, 0) << "no seed exercised the accepted-candidates path";
}

TEST_P(CudaTopk, RunsAreDeterministicWhateverTheWorkspaceHolds) {
  const std::size_t n = (std::size_t{1} << 22) + 11;
  for (Data data : {Data::gaussian, Data::ties}) {
    const std::vector<float> x = make_data(data, n, 3);
    DeviceBuffer input(n * sizeof(float));
    ASSERT_EQ(cudaMemcpy(input.get(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    for (bool approx : {false, true}) {
      TopkCudaOptions options = options_for_variant();
      options.approx = approx;
      const std::uint64_t k = n / 100;
      const Selection first = gpu_select(input.get<float>(), n, k, options);
      for (int run = 0; run < 3; ++run) {
        expect_same(gpu_select(input.get<float>(), n, k, options, GpuRun{0, run % 2 == 0}), first,
                    std::string(data_name(data)) + " run " + std::to_string(run));
      }
    }
  }
}

TEST_P(CudaTopk, UnalignedPayloadsGetTheSameBytes) {
  const std::vector<float> x = make_data(Data::gaussian, 100003, 8);
  for (bool half : {false, true}) {
    for (std::uint64_t k : {std::uint64_t{1001}, std::uint64_t{100003}}) {
      TopkCudaOptions options = options_for_variant();
      options.half_values = half;
      const Selection cpu = cpu_encode(x, k, false, half);
      for (std::size_t offset : {1u, 2u, 3u, 5u}) {
        expect_same(gpu_select(x, k, options, GpuRun{offset, false}), cpu,
                    "offset " + std::to_string(offset) + " k=" + std::to_string(k));
      }
    }
  }
}

TEST_P(CudaTopk, RefusesBadArguments) {
  const TopkCudaOptions options = options_for_variant();
  std::size_t bytes = 0;
  EXPECT_THROW(kernels::cuda::topk_select(nullptr, 10, 11, options, nullptr, nullptr, nullptr,
                                          &bytes, nullptr),
               Error);
  EXPECT_THROW(kernels::cuda::topk_select(nullptr, 10, 5, options, nullptr, nullptr, nullptr,
                                          nullptr, nullptr),
               Error);
  const std::size_t needed = kernels::cuda::topk_workspace_bytes(1000000, 5000, options);
  ASSERT_GT(needed, 0u);
  DeviceBuffer workspace(needed);
  DeviceBuffer input(1000000 * sizeof(float));
  DeviceBuffer payload(kernels::cuda::topk_payload_bytes(1000000, 5000, false));
  std::size_t too_small = needed - 1;
  EXPECT_THROW(kernels::cuda::topk_select(input.get<float>(), 1000000, 5000, options,
                                          payload.get<std::byte>(), nullptr, workspace.get(),
                                          &too_small, nullptr),
               Error);
  std::size_t enough = needed;
  EXPECT_THROW(kernels::cuda::topk_select(input.get<float>(), 1000000, 5000, options,
                                          payload.get<std::byte>(), nullptr,
                                          workspace.get<std::byte>() + 8, &enough, nullptr),
               Error);
}

// More than 2^32 elements: u64 indices. Zeros with a few large values; k reaches into the
// zeros, so the lowest-index zeros fill up the selection. Expected payload built here.
TEST_P(CudaTopk, WideIndicesAboveTwoToThe32) {
  GZ_SKIP_ON_EMULATED_DEVICE("2^32 + 5 f32 elements need 16 GiB, more than a test may take of this machine's memory");
  const std::uint64_t n = (std::uint64_t{1} << 32) + 5;
  DeviceBuffer input(n * sizeof(float));
  ASSERT_NE(input.get(), nullptr);
  ASSERT_EQ(cudaMemset(input.get(), 0, n * sizeof(float)), cudaSuccess);
  const std::uint64_t big[] = {3, (std::uint64_t{1} << 32) - 1, std::uint64_t{1} << 32, n - 1};
  const float values[] = {5.0f, -7.0f, 6.0f, -8.0f};
  for (std::size_t j = 0; j < 4; ++j) {
    ASSERT_EQ(cudaMemcpy(input.get<float>() + big[j], &values[j], sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  const std::uint64_t k = 10;
  // The 4 large values plus the 6 lowest-index zeros (0, 1, 2, 4, 5, 6).
  const std::vector<std::uint64_t> indices = {0, 1, 2, 3, 4, 5, 6, (std::uint64_t{1} << 32) - 1, std::uint64_t{1} << 32, n - 1};
  const std::vector<float> expected_values = {0, 0, 0, 5.0f, 0, 0, 0, -7.0f, 6.0f, -8.0f};
  for (bool approx : {false, true}) {
    TopkCudaOptions options = options_for_variant();
    options.approx = approx;
    const Selection gpu = gpu_select(input.get<float>(), n, k, options);
    ASSERT_EQ(gpu.entries, k) << (approx ? "approx" : "exact");
    std::vector<std::byte> expected(k * 12);
    std::memcpy(expected.data(), indices.data(), k * 8);
    std::memcpy(expected.data() + k * 8, expected_values.data(), k * 4);
    expect_same(gpu, Selection{k, expected}, approx ? "approx" : "exact");
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, CudaTopk,
                         ::testing::Values(KernelVariant::fast, KernelVariant::reference),
                         [](const ::testing::TestParamInfo<KernelVariant>& info) {
                           return std::string(info.param == KernelVariant::fast ? "fast"
                                                                                : "reference");
                         });

}  // namespace
}  // namespace gradzip
