// The Reducer on CUDA tensors (one rank over SelfTransport: the GPU machine has no MPI): the
// gradients are written on a non-blocking stream of the test's own that is held back 50 ms
// before the writes (gpu_test::DelayedProducer), and marked ready right after they are queued,
// long before they happen: a Reducer that did not order its reads after that stream's work
// (mark_ready's event) would reduce the previous step's values. After wait() every tensor holds
// exactly the bytes a host Reducer with the same options leaves in host copies of the same
// gradients, over NCCL and staged, for dense, compressed, error-feedback and PowerSGD groups,
// f16 tensors included, for several steps.
#include "kernels/device_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/transport/self_transport.h"
#include "gpu_test_support.h"
#include "gradzip/reducer.h"
#include "kernels/cpu/convert.h"

namespace gradzip {
namespace {

using gpu_test::DeviceArray;

struct TensorSpec {
  std::string name;
  std::size_t count;
  DType dtype;
  std::vector<std::size_t> shape;
};

const std::vector<TensorSpec> kModel = {
    {"embed.weight", 3000 * 64, DType::f32, {3000, 64}},
    {"layer1.weight", 256 * 300, DType::f32, {256, 300}},
    {"layer1.bias", 256, DType::f32, {256}},
    {"layer2.weight", 40000, DType::f16, {200, 200}},
    {"head.weight", 1000 * 10, DType::f32, {1000, 10}},
};

// Gradient values of tensor t at step s, as the tensor's dtype's bytes.
std::vector<std::byte> gradient_bytes(const TensorSpec& tensor, std::size_t t, int step) {
  const std::vector<float> values = gpu_test::gaussian(tensor.count, 100 * t + static_cast<std::uint64_t>(step));
  std::vector<std::byte> bytes(tensor.count * dtype_size(tensor.dtype));
  if (tensor.dtype == DType::f32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {
    kernels::cpu::f32_to_f16(values.data(), reinterpret_cast<std::uint16_t*>(bytes.data()), tensor.count);
  }
  return bytes;
}

Communicator self_communicator(CudaPath path) {
  CommunicatorOptions options;
  options.cuda_path = path;
  return collectives::make_communicator(std::make_unique<collectives::SelfTransport>(), options);
}

class ReducerCudaTest : public gpu_test::DeviceTest {};

// How long the producer stream sleeps before each step's gradient writes.
constexpr int kProducerDelayMs = 50;

TEST_F(ReducerCudaTest, DeviceTensorsEndWithTheHostReducersBytes) {
  const std::vector<std::string> specs = {
      "none", "fp16", "topk:ratio=0.05,ef=on", "qsgd:bits=4; dims<=1->none",
      "sign:ef=on; name=head.*->fp16", "powersgd:rank=2"};
  for (CudaPath path : {CudaPath::automatic, CudaPath::staged}) {
    for (const std::string& spec : specs) {
      SCOPED_TRACE(spec + (path == CudaPath::staged ? " (staged)" : " (automatic)"));
      Communicator host_comm = self_communicator(CudaPath::staged);
      Communicator device_comm = self_communicator(path);
      ReducerOptions options;
      options.spec = spec;
      options.chunk_bytes = 64 << 10;  // several chunks per group, on both lanes
      options.first_bucket_bytes = 128 << 10;
      options.bucket_bytes = 512 << 10;
      gpu_test::DelayedProducer producer;
      options.cuda_stream = producer.stream();
      Reducer host_reducer(host_comm, options);
      Reducer device_reducer(device_comm, options);

      // The host tensors' buffers are registered with host_reducer.add below and must stay the
      // same objects for its whole life: each step's values are written INTO them (std::copy),
      // never assigned over them (a move assignment would free the registered buffer).
      std::vector<std::vector<std::byte>> host_tensors;
      std::vector<std::unique_ptr<gpu_test::DeviceBytes>> device_tensors;
      host_tensors.reserve(kModel.size());
      device_tensors.reserve(kModel.size());
      for (const TensorSpec& tensor : kModel) {
        const std::size_t bytes = tensor.count * dtype_size(tensor.dtype);
        host_tensors.emplace_back(bytes);
        device_tensors.push_back(std::make_unique<gpu_test::DeviceBytes>(bytes));
        host_reducer.add(tensor.name, TensorView{host_tensors.back().data(), tensor.count, tensor.dtype, Device{}},
                         tensor.shape);
        device_reducer.add(tensor.name,
                           TensorView{device_tensors.back()->get(), tensor.count, tensor.dtype,
                                      Device{DeviceKind::cuda, 0}},
                           tensor.shape);
      }
      for (int step = 0; step < 3; ++step) {
        // The step's gradients, uploaded to staging buffers now (synchronously) ...
        std::vector<std::unique_ptr<gpu_test::DeviceBytes>> staged;
        for (std::size_t t = 0; t < kModel.size(); ++t) {
          const std::vector<std::byte> gradient = gradient_bytes(kModel[t], t, step);
          staged.push_back(std::make_unique<gpu_test::DeviceBytes>(gradient.size()));
          gpu_test::to_device(staged.back()->get(), gradient.data(), gradient.size());
        }
        // ... then backward, last layer first: each gradient copied into its tensor on the held
        // producer stream and marked ready at once (the copies run 50 ms later).
        producer.hold(kProducerDelayMs);
        for (std::size_t t = kModel.size(); t-- > 0;) {
          const std::vector<std::byte> gradient = gradient_bytes(kModel[t], t, step);
          std::copy(gradient.begin(), gradient.end(), host_tensors[t].begin());  // in place
          host_reducer.mark_ready(kModel[t].name);
          producer.copy(device_tensors[t]->get(), staged[t]->get(), host_tensors[t].size());
          device_reducer.mark_ready(kModel[t].name);
        }
        host_reducer.wait();
        device_reducer.wait();
        for (std::size_t t = 0; t < kModel.size(); ++t) {
          const auto got = gpu_test::from_device<std::byte>(device_tensors[t]->get(), host_tensors[t].size());
          ASSERT_TRUE(gpu_test::same_bytes(host_tensors[t].data(), got))
              << kModel[t].name << " at step " << step;
        }
        host_reducer.step();
        device_reducer.step();
      }
    }
  }
}

}  // namespace
}  // namespace gradzip
