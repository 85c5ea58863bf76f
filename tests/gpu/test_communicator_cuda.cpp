// The Communicator on CUDA tensors (one rank over SelfTransport: the GPU machine has no MPI):
// every collective on a device tensor leaves exactly the bytes the same collective leaves on a
// host copy of it, f16 / bf16 included, and says it was staged. Host memory passed as a CUDA
// tensor is refused before any copy.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/transport/self_transport.h"
#include "gpu_test_support.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace gradzip {
namespace {

using gpu_test::DeviceArray;

Communicator self_communicator() {
  return collectives::make_communicator(std::make_unique<collectives::SelfTransport>());
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
      std::vector<float> want = input;
      host_side.allreduce(host_view(want.data(), count), "g", spec, ReduceOp::average);
      DeviceArray<float> d_tensor(input);
      const CollectiveStats stats = device_side.allreduce(
          TensorView{d_tensor.get(), count, DType::f32, Device{DeviceKind::cuda, 0}}, "g", spec,
          ReduceOp::average);
      EXPECT_NE(stats.note.find("staged through host memory"), std::string::npos) << stats.note;
      const std::vector<float> got = d_tensor.download();
      ASSERT_EQ(std::memcmp(got.data(), want.data(), count * sizeof(float)), 0) << "call " << call;
    }
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
