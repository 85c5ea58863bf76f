// The collectives on CUDA tensors at several ranks, run by ctest on the emulated device
// (GRADZIP_DEVICE=emulated, kernels/emulated/): the NCCL routes of the ring, the SRA and the
// sparse all-reduce, the compressed all-gather and reduce-scatter, and the Reducer's lanes (one
// NCCL communicator each) must leave, for every codec and algorithm, exactly the bytes the same
// collective leaves on host copies of the same tensors, identical on every rank, residuals
// included (three calls, so error feedback carries over). On a GPU machine with MPI the same
// executable runs on the real device (without GRADZIP_DEVICE).
#include <gtest/gtest.h>

#include "kernels/device_api.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/reducer.h"
#include "kernels/cuda/cast_cuda.h"
#include "tests/multirank/multirank_support.h"

namespace gradzip {
namespace {

using testing::gaussian_contribution;
using testing::identical_on_all_ranks;

// Skips (saying why) without a device: a CUDA build on a machine without a GPU, unless
// GRADZIP_DEVICE=emulated.
#define SKIP_WITHOUT_DEVICE()                                                                 \
  do {                                                                                        \
    const char* reason = nullptr;                                                             \
    if (kernels::cuda::device_count(&reason) == 0)                                            \
      GTEST_SKIP() << "no CUDA device (" << (reason ? reason : "none found")                  \
                   << "); set GRADZIP_DEVICE=emulated to run on the emulated device";         \
  } while (false)

// Device memory holding `values`, freed on scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& values) : count_(values.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<std::size_t>(count_, 1) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, values.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  TensorView view() const { return TensorView{data_, count_, DType::f32, Device{DeviceKind::cuda, 0}}; }
  std::vector<float> download() const {
    std::vector<float> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  float* data_ = nullptr;
  std::size_t count_ = 0;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// An uncompressed call ("mpi": the transport's own all-reduce) sums in the transport's order:
// MPI's on the host, NCCL's on the device, so the bits may differ from 3 ranks on. Both are the
// average of the ranks' gaussian_contribution(count, r, seed): each within (P - 1) u sum|x_r / P|
// of the exact value (u = 2^-24), so within twice that of each other; a result that is zero,
// negated or from other data is far outside it.
void expect_equal_up_to_summation_order(const std::vector<float>& got, const std::vector<float>& host,
                                        std::uint64_t seed) {
  const int ranks = testing::world_size();
  ASSERT_EQ(got.size(), host.size());
  std::vector<double> magnitude(got.size(), 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> x = gaussian_contribution(got.size(), r, seed);
    for (std::size_t i = 0; i < x.size(); ++i) magnitude[i] += std::fabs(static_cast<double>(x[i]) / ranks);
  }
  const double u = std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = 2.0 * (ranks - 1) * u * magnitude[i];
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - host[i]), bound)
        << "element " << i << ": device " << got[i] << ", host " << host[i];
  }
}

Communicator device_communicator() {
  CommunicatorOptions options;
  options.cuda_path = CudaPath::automatic;  // NCCL where the algorithm runs on device memory
  return Communicator::world(options);
}

// One spec's all-reduce on a host tensor and on a device copy, three calls: equal bytes, and
// equal on every rank.
void expect_device_equals_host(const std::string& spec, std::size_t count, const char* expect_in_note) {
  SCOPED_TRACE(spec + ", " + std::to_string(count) + " elements");
  Communicator host_side = Communicator::world();
  Communicator device_side = device_communicator();
  const int rank = testing::world_rank();
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const std::vector<float> input = gaussian_contribution(count, rank, 700 + call);
    std::vector<float> host = input;
    host_side.allreduce(host_view(host.data(), count), "g", spec, ReduceOp::average);
    DeviceFloats device(input);
    const CollectiveStats stats = device_side.allreduce(device.view(), "g", spec, ReduceOp::average);
    if (expect_in_note != nullptr) {
      EXPECT_NE(stats.note.find(expect_in_note), std::string::npos) << stats.note;
    }
    const std::vector<float> got = device.download();
    ASSERT_TRUE(same_bits(got, host)) << "device result differs from the host result";
    ASSERT_TRUE(identical_on_all_ranks(std::span<const float>(got)));
  }
}

const char* const kCodecs[] = {"none",          "fp16",          "bf16",
                               "qsgd:bits=4",   "qsgd:bits=2,ef=on", "sign",
                               "sign:ef=off",   "terngrad",      "topk:ratio=0.01",
                               "topk:ratio=0.05,values=fp16"};

TEST(DeviceCollectives, RingOverNcclEqualsTheHostRing) {
  SKIP_WITHOUT_DEVICE();
  for (const char* codec : kCodecs) {
    const std::string spec = std::string(codec) + (std::strchr(codec, ':') ? "," : ":") + "algo=ring,min_bytes=0";
    for (std::size_t count : {std::size_t{8192}, std::size_t{50021}, std::size_t{1} << 20})
      expect_device_equals_host(spec, count, "over NCCL");
  }
}

TEST(DeviceCollectives, SraOverNcclEqualsTheHostSra) {
  SKIP_WITHOUT_DEVICE();
  for (const char* codec : kCodecs) {
    const std::string spec = std::string(codec) + (std::strchr(codec, ':') ? "," : ":") + "algo=sra,min_bytes=0";
    expect_device_equals_host(spec, 50021, "over NCCL");
  }
}

TEST(DeviceCollectives, SparseAllreduceOverNcclEqualsTheHostOne) {
  SKIP_WITHOUT_DEVICE();
  for (const char* spec : {"topk:ratio=0.01,algo=sparse,min_bytes=0",
                           "topk:ratio=0.02,values=fp16,algo=sparse,min_bytes=0",
                           "topk:ratio=0.01,ef=off,algo=sparse,min_bytes=0"}) {
    expect_device_equals_host(spec, 70001, "over NCCL");
  }
}

// algo=auto on CUDA tensors chooses without the cost model (host tensors consult it), so the
// host side runs, with algo= set, the algorithm the device call reports.
TEST(DeviceCollectives, AutoAndSmallCountsEqualTheHostRunningTheSameAlgorithm) {
  SKIP_WITHOUT_DEVICE();
  const int rank = testing::world_rank();
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
    for (const char* spec : {"none", "fp16:min_bytes=0", "qsgd:bits=4,min_bytes=0",
                             "sign:min_bytes=0", "topk:ratio=0.1,min_bytes=0"}) {
      SCOPED_TRACE(std::string(spec) + ", " + std::to_string(count) + " elements");
      Communicator host_side = Communicator::world();
      Communicator device_side = device_communicator();
      for (int call = 0; call < 3; ++call) {
        const std::vector<float> input = gaussian_contribution(count, rank, 800 + call);
        DeviceFloats device(input);
        const CollectiveStats stats = device_side.allreduce(device.view(), "g", spec, ReduceOp::average);
        CompressionSpec host_spec = CompressionSpec::parse(spec);
        for (Algorithm algorithm : {Algorithm::ring, Algorithm::sra, Algorithm::sparse})
          if (stats.algorithm == algorithm_name(algorithm)) host_spec.algo = algorithm;
        std::vector<float> host = input;
        host_side.allreduce(host_view(host.data(), count), "g", host_spec, ReduceOp::average);
        const std::vector<float> got = device.download();
        if (stats.algorithm == "mpi") {
          expect_equal_up_to_summation_order(got, host, 800 + call);
        } else {
          ASSERT_TRUE(same_bits(got, host))
              << "call " << call << ": the device ran " << stats.algorithm << ", the host "
              << host_spec.to_string();
        }
        ASSERT_TRUE(identical_on_all_ranks(std::span<const float>(got)));
      }
    }
  }
}

TEST(DeviceCollectives, AllgatherAndReduceScatterEqualTheHost) {
  SKIP_WITHOUT_DEVICE();
  const std::size_t count = 30011;
  const int rank = testing::world_rank();
  for (const char* spec : {"none", "fp16", "qsgd:bits=4", "sign:ef=on"}) {
    SCOPED_TRACE(spec);
    Communicator host_side = Communicator::world();
    Communicator device_side = device_communicator();
    for (int call = 0; call < 2; ++call) {
      const std::vector<float> input = gaussian_contribution(count, rank, 900 + call);
      std::vector<float> host = input;
      host_side.allgather(host_view(host.data(), count), "a", CompressionSpec::parse(spec));
      DeviceFloats device(input);
      device_side.allgather(device.view(), "a", CompressionSpec::parse(spec));
      ASSERT_TRUE(same_bits(device.download(), host)) << "all-gather, call " << call;

      std::vector<float> host_rs = input;
      host_side.reduce_scatter(host_view(host_rs.data(), count), "r", CompressionSpec::parse(spec),
                               ReduceOp::sum);
      DeviceFloats device_rs(input);
      device_side.reduce_scatter(device_rs.view(), "r", CompressionSpec::parse(spec), ReduceOp::sum);
      ASSERT_TRUE(same_bits(device_rs.download(), host_rs)) << "reduce-scatter, call " << call;
    }
  }
}

// The Reducer with device tensors: two lanes, each with its own NCCL communicator, several
// chunks per group, three steps; the host Reducer with the same options is the reference.
TEST(DeviceCollectives, ReducerLanesOverNcclEqualTheHostReducer) {
  SKIP_WITHOUT_DEVICE();
  const int rank = testing::world_rank();
  // name, shape. The Reducer sends one-dimensional tensors uncompressed (its default rule
  // dims<=1->none), so the bias sums in the transport's order, as "none" does.
  struct TensorSpec {
    std::string name;
    std::vector<std::size_t> shape;
    std::size_t count() const { return shape.size() == 1 ? shape[0] : shape[0] * shape[1]; }
  };
  const std::vector<TensorSpec> model = {
      {"embed", {400, 100}}, {"layer.weight", {300, 100}}, {"layer.bias", {300}}, {"head", {9001, 1}}};
  // min_bytes=0: every chunk compressed, so the results are exact (an uncompressed chunk
  // would sum in the transport's order, as "none" does: checked within its bound below). The
  // algorithm is named: algo=auto consults the cost model for host tensors only, so it may
  // choose differently on the two sides.
  for (const char* spec : {"none", "fp16:min_bytes=0,algo=ring",
                           "topk:ratio=0.05,ef=on,min_bytes=0,algo=sparse",
                           "sign:ef=on,min_bytes=0,algo=sra", "qsgd:bits=4,min_bytes=0,algo=sra"}) {
    SCOPED_TRACE(spec);
    const bool transport_sum = std::strcmp(spec, "none") == 0;
    Communicator host_comm = Communicator::world();
    Communicator device_comm = device_communicator();
    ReducerOptions options;
    options.spec = spec;
    options.chunk_bytes = 32 << 10;
    options.first_bucket_bytes = 64 << 10;
    options.bucket_bytes = 256 << 10;
    options.lanes = 2;
    Reducer host_reducer(host_comm, options);
    Reducer device_reducer(device_comm, options);
    std::vector<std::vector<float>> host_tensors;
    std::vector<std::unique_ptr<DeviceFloats>> device_tensors;
    host_tensors.reserve(model.size());
    for (const TensorSpec& tensor : model) {
      host_tensors.emplace_back(tensor.count(), 0.0f);
      device_tensors.push_back(std::make_unique<DeviceFloats>(host_tensors.back()));
      host_reducer.add(tensor.name, host_view(host_tensors.back().data(), tensor.count()), tensor.shape);
      device_reducer.add(tensor.name, device_tensors.back()->view(), tensor.shape);
    }
    for (int step = 0; step < 3; ++step) {
      for (std::size_t t = model.size(); t-- > 0;) {
        const std::vector<float> gradient =
            gaussian_contribution(model[t].count(), rank, 100 * t + static_cast<std::uint64_t>(step));
        std::copy(gradient.begin(), gradient.end(), host_tensors[t].begin());
        ASSERT_EQ(cudaMemcpy(device_tensors[t]->view().data, gradient.data(),
                             gradient.size() * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
        host_reducer.mark_ready(model[t].name);
        device_reducer.mark_ready(model[t].name);
      }
      host_reducer.wait();
      device_reducer.wait();
      for (std::size_t t = 0; t < model.size(); ++t) {
        const std::vector<float> got = device_tensors[t]->download();
        if (transport_sum || model[t].shape.size() == 1) {
          expect_equal_up_to_summation_order(got, host_tensors[t], 100 * t + static_cast<std::uint64_t>(step));
        } else {
          ASSERT_TRUE(same_bits(got, host_tensors[t])) << model[t].name << " at step " << step;
        }
        ASSERT_TRUE(identical_on_all_ranks(std::span<const float>(got)));
      }
      host_reducer.step();
      device_reducer.step();
    }
  }
}

}  // namespace
}  // namespace gradzip
