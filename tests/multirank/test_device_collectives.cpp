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
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/communicator_state.h"
#include "collectives/device_memory.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/codec.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"
#include "kernels/cuda/cast_cuda.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

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
// equal on every rank; the same payload and index bytes sent (segmented or not, a message's
// payload is the same), and with `same_messages` the same header bytes too (both sides cut
// the chunks into the same segments: the ring, which pipelines over NCCL as over MPI).
void expect_device_equals_host(const std::string& spec, std::size_t count, const char* expect_in_note,
                               bool same_messages = false) {
  SCOPED_TRACE(spec + ", " + std::to_string(count) + " elements");
  Communicator host_side = Communicator::world();
  Communicator device_side = device_communicator();
  const int rank = testing::world_rank();
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const std::vector<float> input = gaussian_contribution(count, rank, 700 + call);
    std::vector<float> host = input;
    const CollectiveStats host_stats =
        host_side.allreduce(host_view(host.data(), count), "g", spec, ReduceOp::average);
    DeviceFloats device(input);
    const CollectiveStats stats = device_side.allreduce(device.view(), "g", spec, ReduceOp::average);
    EXPECT_EQ(stats.sent_payload_bytes, host_stats.sent_payload_bytes);
    EXPECT_EQ(stats.sent_index_bytes, host_stats.sent_index_bytes);
    if (same_messages) {
      EXPECT_EQ(stats.sent_header_bytes, host_stats.sent_header_bytes);
    }
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
      expect_device_equals_host(spec, count, "over NCCL", /*same_messages=*/true);
  }
}

TEST(DeviceCollectives, SraOverNcclEqualsTheHostSra) {
  SKIP_WITHOUT_DEVICE();
  for (const char* codec : kCodecs) {
    const std::string spec = std::string(codec) + (std::strchr(codec, ':') ? "," : ":") + "algo=sra,min_bytes=0";
    expect_device_equals_host(spec, 50021, "over NCCL", /*same_messages=*/true);
  }
  // Large enough that both sides cut the chunks into 64 KiB segments (the pipelined SRA: over
  // NCCL one group per exchange): the same messages, bytes and bits.
  for (const char* spec : {"qsgd:bits=4,algo=sra,min_bytes=0", "sign:ef=on,algo=sra,min_bytes=0",
                           "terngrad:algo=sra,min_bytes=0", "fp16:algo=sra,min_bytes=0"})
    expect_device_equals_host(spec, std::size_t{1} << 20, "over NCCL", /*same_messages=*/true);
}

TEST(DeviceCollectives, SparseAllreduceOverNcclEqualsTheHostOne) {
  SKIP_WITHOUT_DEVICE();
  for (const char* spec : {"topk:ratio=0.01,algo=sparse,min_bytes=0",
                           "topk:ratio=0.02,values=fp16,algo=sparse,min_bytes=0",
                           "topk:ratio=0.01,ef=off,algo=sparse,min_bytes=0"}) {
    expect_device_equals_host(spec, 70001, "over NCCL");
  }
}

// Random-k's shared-index path on device memory: the k values summed by the ring over NCCL in the
// message itself (f32), or through f32 scratch (values=fp16).
TEST(DeviceCollectives, RandkSharedIndexPathOverNcclEqualsTheHostOne) {
  SKIP_WITHOUT_DEVICE();
  for (const char* spec : {"randk:ratio=0.01,min_bytes=0", "randk:ratio=0.05,values=fp16,min_bytes=0",
                           "randk:ratio=0.02,ef=on,min_bytes=0"}) {
    expect_device_equals_host(spec, 70001, "over NCCL", /*same_messages=*/true);
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

// ---- malformed messages in a stream-ordered call ----------------------------------------

// Over the NCCL transport, rank `victim` has the first byte (the wire magic) of one received
// message overwritten on the device, in stream order after it arrived and before it is decoded:
// the first point-to-point receive, or the first other rank's block of an alltoallv or
// allgatherv.
class DeviceCorruptingTransport final : public testing::ReceiveWatchingTransport {
 public:
  DeviceCorruptingTransport(collectives::Transport& inner, int victim)
      : ReceiveWatchingTransport(inner), victim_(victim) {}
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    inner().alltoallv(send, send_counts, recv, recv_counts);
    std::size_t offset = 0;
    for (std::size_t r = 0; r < recv_counts.size(); offset += recv_counts[r++]) {
      if (recv_counts[r] > 0) return corrupt(recv.data() + offset);
    }
  }
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override {
    inner().allgatherv(mine, all, counts);
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); offset += counts[r++]) {
      if (static_cast<int>(r) != rank() && counts[r] > 0) return corrupt(all.data() + offset);
    }
  }

 private:
  void corrupt(std::byte* d_message) {
    if (rank() != victim_ || corrupted_) return;
    corrupted_ = true;
    // On the work stream (the legacy default stream), which the transport's wait or collective
    // has just ordered after the transfer.
    ASSERT_EQ(cudaMemsetAsync(d_message, 0, 1, nullptr), cudaSuccess);
  }
  void received(std::span<std::byte> buffer, std::size_t /*bytes*/) override { corrupt(buffer.data()); }

  int victim_;
  bool corrupted_ = false;
};

// In a stream-ordered call nothing is read back while the call runs: a malformed message fails a
// device check, and the call's completion throws on every rank, the receiving rank naming the
// check and the others naming that rank. The communicator stays usable.
TEST(DeviceCollectives, AMalformedMessageInAStreamOrderedCallThrowsOnEveryRank) {
  SKIP_WITHOUT_DEVICE();
  const int ranks = testing::world_size(), rank = testing::world_rank();
  if (ranks == 1) GTEST_SKIP() << "a single rank receives nothing";
  collectives::MpiTransport bootstrap(MPI_COMM_WORLD);
  const std::unique_ptr<collectives::Transport> nccl = collectives::make_nccl_transport(bootstrap, 0);
  using Algorithm = void (*)(collectives::ReduceJob&);
  struct Case {
    const char* spec;
    Algorithm run;
  };
  const Case cases[] = {{"fp16", collectives::ring_allreduce},
                        {"qsgd:bits=4", collectives::sra_allreduce},
                        {"topk:ratio=0.05", collectives::sparse_allreduce},
                        {"sign", collectives::compressed_allgather}};
  const std::size_t count = 20011;
  for (const Case& c : cases) {
    for (int victim : {0, ranks - 1}) {
      SCOPED_TRACE(std::string(c.spec) + ", corrupted on rank " + std::to_string(victim));
      const auto codec = make_codec(c.spec);
      DeviceCorruptingTransport corrupting(*nccl, victim);
      DeviceFloats data(gaussian_contribution(count, rank, 60));
      CollectiveStats stats;
      collectives::ReduceJob job{corrupting, *codec,
                                 {static_cast<float*>(data.view().data), count},
                                 "grad", nullptr, EncodeContext{}, stats,
                                 Device{DeviceKind::cuda, 0}};
      job.sizes_known = true;
      try {
        collectives::OrderedDeviceCall call(corrupting, 0, "a test call");
        c.run(job);
        call.complete("a test call");
        ADD_FAILURE() << "the corrupted message was accepted";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::malformed_message) << error.what();
        const std::string text = error.what();
        if (rank == victim) {
          EXPECT_NE(text.find("message header is not the one"), std::string::npos) << text;
        } else {
          EXPECT_NE(text.find("rank " + std::to_string(victim)), std::string::npos) << text;
        }
      }
    }
  }
  // The transport is still in step on every rank: an uncompressed all-reduce is exact.
  Communicator device_side = device_communicator();
  std::vector<float> ones(4099, 1.0f);
  DeviceFloats device(ones);
  device_side.allreduce(device.view(), "after", "none:min_bytes=0,algo=ring");
  for (float value : device.download()) ASSERT_EQ(value, static_cast<float>(ranks));
}

// The residual store's contents as bits, by name (device residuals read through their mirror).
std::map<std::string, std::vector<std::uint32_t>> residual_bits(Communicator& comm) {
  const error_feedback::ResidualStore& store = collectives::state_of(comm).residuals();
  std::map<std::string, std::vector<std::uint32_t>> out;
  for (const std::string& name : store.names()) {
    const std::span<const float> values = store.residual(name);
    std::vector<std::uint32_t>& bits = out[name];
    for (const float value : values) {
      std::uint32_t word = 0;
      std::memcpy(&word, &value, sizeof word);
      bits.push_back(word);
    }
  }
  return out;
}

// A stream-ordered call does not wait for the count of non-finite input: it runs on the
// device, and when its completion says that some rank's input held NaN / Inf (or, for a 16-bit
// wire type, values it would saturate), the call is undone and run again under the policy. The
// user sees what the host path gives, where the count comes first: for each codec and
// algorithm, the last rank puts a NaN (propagate, skip) or -Inf (error) at index 17 of the
// second of three calls, and the device communicator must match a host communicator fed the
// same data call for call, bit for bit: propagate's uncompressed sum (integer inputs: exact,
// the bad index NaN), skip's zeros, error's exception on every rank naming the rank with the
// tensor left as passed; the residuals unchanged by the bad call (bits), and the third call
// equal to the host's (the bad call left no trace).
TEST(DeviceCollectives, NonfiniteInputIsUndoneAndRunsItsPolicyAsOnTheHost) {
  SKIP_WITHOUT_DEVICE();
  const int ranks = testing::world_size(), rank = testing::world_rank();
  const char* const codecs[] = {"none", "fp16:ef=on", "bf16", "qsgd:bits=4,ef=on", "sign",
                                "topk:ratio=0.1", "randk:ratio=0.1", "terngrad:ef=on"};
  // Explicit algorithms: algo=auto may choose differently on host and device memory.
  const char* const algorithms[] = {"algo=ring", "algo=sra", "algo=sparse"};
  const char* const policies[] = {"propagate", "skip", "error"};
  constexpr std::size_t kCount = 4099;
  constexpr std::size_t kBad = 17;
  Communicator host_side = Communicator::world();
  Communicator device_side = device_communicator();
  int case_number = 0;
  for (const char* codec : codecs) {
    for (const char* algorithm : algorithms) {
      for (const char* policy : policies) {
        const std::string spec = std::string(codec) + (std::strchr(codec, ':') ? "," : ":") +
                                 algorithm + ",nonfinite=" + policy;
        const std::string name = "nonfinite." + std::to_string(case_number++);
        SCOPED_TRACE(spec);
        const bool error_policy = std::strcmp(policy, "error") == 0;
        const float bad = error_policy ? -INFINITY : NAN;
        for (int call = 0; call < 3; ++call) {
          SCOPED_TRACE("call " + std::to_string(call));
          std::vector<float> input = testing::integer_contribution(kCount, rank, 300 + call);
          if (call == 1 && rank == ranks - 1) input[kBad] = bad;
          std::vector<float> host = input;
          DeviceFloats device(input);
          const auto residuals_before = residual_bits(device_side);
          if (call == 1 && error_policy) {
            std::string host_message, device_message;
            EXPECT_EQ(testing::error_code_of(
                          [&] { host_side.allreduce(host_view(host.data(), kCount), name, spec); },
                          &host_message),
                      ErrorCode::nonfinite);
            EXPECT_EQ(testing::error_code_of(
                          [&] { device_side.allreduce(device.view(), name, spec); }, &device_message),
                      ErrorCode::nonfinite);
            EXPECT_EQ(device_message, host_message);
            EXPECT_NE(device_message.find("rank " + std::to_string(ranks - 1) +
                                          ": 1 non-finite element(s), the first at index 17"),
                      std::string::npos)
                << device_message;
            EXPECT_TRUE(same_bits(device.download(), input)) << "the tensor was not left as passed";
            EXPECT_EQ(residual_bits(device_side), residuals_before);
            continue;
          }
          const CollectiveStats host_stats =
              host_side.allreduce(host_view(host.data(), kCount), name, spec);
          const CollectiveStats device_stats = device_side.allreduce(device.view(), name, spec);
          const std::vector<float> got = device.download();
          EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(got)));
          EXPECT_EQ(device_stats.skipped, host_stats.skipped);
          if (call != 1) {
            EXPECT_TRUE(same_bits(got, host)) << "the device result differs from the host's";
            continue;
          }
          EXPECT_EQ(residual_bits(device_side), residuals_before);
          EXPECT_NE(device_stats.note.find("non-finite input on rank(s) " + std::to_string(ranks - 1)),
                    std::string::npos)
              << device_stats.note;
          for (std::size_t i = 0; i < kCount; ++i) {
            if (i == kBad && !host_stats.skipped) {
              ASSERT_TRUE(std::isnan(got[i])) << got[i];
              ASSERT_TRUE(std::isnan(host[i])) << host[i];
            } else {
              ASSERT_EQ(got[i], host[i]) << "element " << i;
            }
          }
          if (host_stats.skipped) {
            EXPECT_EQ(got, std::vector<float>(kCount, 0.0f));
          }
        }
      }
    }
  }
}

// Finite values that fp16 would saturate in the sum (|x| > 65504 / P) send the call uncompressed
// in f32, on the device as on the host, also when only the completion of the stream-ordered
// call learns it; the same for a reduce-scatter and an all-gather with NaN input.
TEST(DeviceCollectives, WireRangeFallbackAndShardedCallsUndoneAsOnTheHost) {
  SKIP_WITHOUT_DEVICE();
  const int ranks = testing::world_size(), rank = testing::world_rank();
  constexpr std::size_t kCount = 3001;
  Communicator host_side = Communicator::world();
  Communicator device_side = device_communicator();
  {
    const std::string spec = "fp16:ef=on,algo=ring";
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE("fp16, call " + std::to_string(call));
      std::vector<float> input = testing::integer_contribution(kCount, rank, 900 + call);
      if (call == 1 && rank == 0) input[5] = 1.0e30f;
      std::vector<float> host = input;
      DeviceFloats device(input);
      const auto residuals_before = residual_bits(device_side);
      const CollectiveStats host_stats = host_side.allreduce(host_view(host.data(), kCount), "wide", spec);
      const CollectiveStats device_stats = device_side.allreduce(device.view(), "wide", spec);
      EXPECT_TRUE(same_bits(device.download(), host));
      if (call == 1) {
        EXPECT_NE(device_stats.note.find("beyond what"), std::string::npos) << device_stats.note;
        // The f32 sum: 1e30 plus small integers is 1e30 (fp16 would have saturated it).
        EXPECT_EQ(device.download()[5], 1.0e30f);
        EXPECT_EQ(residual_bits(device_side), residuals_before);
        EXPECT_EQ(device_stats.note.find("beyond what") != std::string::npos,
                  host_stats.note.find("beyond what") != std::string::npos);
      }
    }
  }
  for (const char* kind : {"reduce_scatter", "allgather"}) {
    const CompressionSpec spec = CompressionSpec::parse("qsgd:bits=4,ef=on");
    const std::string name = std::string("sharded.") + kind;
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE(std::string(kind) + ", call " + std::to_string(call));
      std::vector<float> input = testing::integer_contribution(kCount, rank, 950 + call);
      // The all-gather counts each rank's own shard: the last rank's first element.
      const std::size_t bad = std::strcmp(kind, "allgather") == 0
                                  ? collectives::shard_begin(kCount, ranks, ranks - 1)
                                  : 0;
      if (call == 1 && rank == ranks - 1) input[bad] = NAN;
      std::vector<float> host = input;
      DeviceFloats device(input);
      CollectiveStats host_stats, device_stats;
      if (std::strcmp(kind, "allgather") == 0) {
        host_stats = host_side.allgather(host_view(host.data(), kCount), name, spec);
        device_stats = device_side.allgather(device.view(), name, spec);
      } else {
        host_stats = host_side.reduce_scatter(host_view(host.data(), kCount), name, spec);
        device_stats = device_side.reduce_scatter(device.view(), name, spec);
      }
      const std::vector<float> got = device.download();
      const std::size_t begin = std::strcmp(kind, "allgather") == 0
                                    ? 0
                                    : collectives::shard_begin(kCount, ranks, rank);
      const std::size_t end = std::strcmp(kind, "allgather") == 0
                                  ? kCount
                                  : collectives::shard_begin(kCount, ranks, rank + 1);
      for (std::size_t i = begin; i < end; ++i) {
        if (std::isnan(host[i])) {
          ASSERT_TRUE(std::isnan(got[i])) << "element " << i << ": " << got[i];
        } else {
          ASSERT_EQ(got[i], host[i]) << "element " << i;
        }
      }
      if (call == 1) {
        EXPECT_NE(device_stats.note.find("non-finite input on rank(s) " + std::to_string(ranks - 1)),
                  std::string::npos)
            << device_stats.note;
      }
    }
  }
}

}  // namespace
}  // namespace gradzip
