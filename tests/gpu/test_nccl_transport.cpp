// The NCCL transport (collectives/transport/nccl/) with one rank: NCCL refuses two ranks on
// one GPU, so this checks every operation end to end against exact expected bytes on a
// single device (send/receive to self, the padded all-gather, the all-to-all, the reductions,
// the splits, the bootstrap over a host transport) and the argument checks. Multi-rank
// behaviour needs a multi-GPU machine.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/transport/deadline.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"
#include "gpu_test_support.h"
#include "kernels/cuda/device_runtime.h"

#if defined(GRADZIP_HAVE_NCCL)
#include "collectives/transport/nccl/nccl_library.h"
#endif

namespace gradzip::collectives {
namespace {

using gpu_test::DeviceBytes;
using gpu_test::DeviceTest;

// Runs `call`; it must throw gradzip::Error with `code` and a message containing every part.
template <typename Call>
void expect_error(Call&& call, ErrorCode code, std::initializer_list<const char*> parts) {
  try {
    call();
    ADD_FAILURE() << "no exception";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    for (const char* part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "\"" << part << "\" not in: " << error.what();
    }
  }
}

#if defined(GRADZIP_HAVE_NCCL)

// Distinct bytes per (seed, index), so a message in the wrong buffer shows.
std::vector<std::byte> pattern(std::size_t bytes, unsigned seed) {
  std::vector<std::byte> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    data[i] = static_cast<std::byte>((i * 31 + seed * 101 + 7) & 0xFF);
  }
  return data;
}

// A device buffer holding `host` (at least one byte is allocated).
std::unique_ptr<DeviceBytes> on_device(const std::vector<std::byte>& host) {
  auto device = std::make_unique<DeviceBytes>(host.size());
  gpu_test::to_device(device->get(), host.data(), host.size());
  return device;
}

// A device buffer of `bytes` bytes, each `fill`. The memset runs on the legacy stream and may
// still be running when cudaMemset returns; the transport works on a non-blocking stream of
// its own, which does not wait for it: finish it here.
std::unique_ptr<DeviceBytes> filled(std::size_t bytes, unsigned char fill) {
  auto device = std::make_unique<DeviceBytes>(bytes);
  EXPECT_EQ(cudaMemset(device->get(), fill, bytes == 0 ? 1 : bytes), cudaSuccess);
  gpu_test::finish_legacy_stream();
  return device;
}

std::vector<std::byte> download(const DeviceBytes& device, std::size_t bytes) {
  return gpu_test::from_device<std::byte>(static_cast<const void*>(device.get()), bytes);
}

std::span<const std::byte> bytes_at(const DeviceBytes& device, std::size_t bytes) {
  return {device.get(), bytes};
}
std::span<std::byte> writable_bytes_at(const DeviceBytes& device, std::size_t bytes) {
  return {device.get(), bytes};
}

// A one-rank NCCL communicator made here (ncclCommInitAll) and adopted by the transport.
class NcclTransportTest : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    const int devices[1] = {0};
    const ncclResult_t status = nccl_api().ncclCommInitAll(&comm_, 1, devices);
    ASSERT_EQ(status, ncclSuccess) << nccl_api().ncclGetErrorString(status);
    transport_ = adopt_nccl_communicator(comm_);
  }
  void TearDown() override {
    transport_.reset();
    if (comm_ != nullptr) {
      EXPECT_EQ(nccl_api().ncclCommDestroy(comm_), ncclSuccess);
    }
  }
  Transport& transport() { return *transport_; }

 private:
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<Transport> transport_;
};

TEST_F(NcclTransportTest, DescribesItself) {
  EXPECT_TRUE(nccl_transport_built());
  EXPECT_EQ(transport().rank(), 0);
  EXPECT_EQ(transport().size(), 1);
  EXPECT_EQ(transport().describe(), "nccl rank 0 of 1 on cuda:0");
  EXPECT_TRUE(transport().concurrent_use_supported());
}

// Several messages to self, every receive and send posted before one wait: messages between
// a pair of ranks match in posting order (NCCL has no tags), a zero-byte message completes
// without NCCL, and a large one arrives whole.
TEST_F(NcclTransportTest, SendToSelfMatchesInPostingOrder) {
  const std::vector<std::size_t> sizes = {64, 64, 0, (1u << 20) + 3, 1};
  const std::vector<int> tags = {5, 5, 6, 7, 8};
  std::vector<std::vector<std::byte>> messages;
  std::vector<std::unique_ptr<DeviceBytes>> sources, targets;
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    messages.push_back(pattern(sizes[m], static_cast<unsigned>(m)));
    sources.push_back(on_device(messages.back()));
    targets.push_back(filled(sizes[m], 0xEE));
  }
  std::vector<Transport::Request> receives, sends;
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    receives.push_back(transport().irecv(0, tags[m], writable_bytes_at(*targets[m], sizes[m])));
  }
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    sends.push_back(transport().isend(0, tags[m], bytes_at(*sources[m], sizes[m])));
  }
  // The second receive first: its wait launches the whole batch.
  EXPECT_EQ(transport().wait(receives[1]), sizes[1]);
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    if (m != 1) {
      EXPECT_EQ(transport().wait(receives[m]), sizes[m]) << "message " << m;
    }
    EXPECT_EQ(transport().wait(sends[m]), sizes[m]) << "message " << m;
  }
  for (std::size_t m = 0; m < sizes.size(); ++m) {
    EXPECT_EQ(download(*targets[m], sizes[m]), messages[m]) << "message " << m;
  }
}

// The ring step "post receive, post send, wait receive, wait send", repeated (events are
// reused), the last rounds with idle waits.
TEST_F(NcclTransportTest, RingStepsRepeat) {
  constexpr std::size_t kBytes = 4099;
  for (unsigned round = 0; round < 6; ++round) {
    transport().set_idle_waits(round >= 3);
    const std::vector<std::byte> message = pattern(kBytes, 40 + round);
    const auto source = on_device(message);
    const auto target = filled(kBytes, 0);
    const Transport::Request receive = transport().irecv(0, 1, writable_bytes_at(*target, kBytes));
    const Transport::Request send = transport().isend(0, 1, bytes_at(*source, kBytes));
    EXPECT_EQ(transport().wait(receive), kBytes);
    EXPECT_EQ(transport().wait(send), kBytes);
    EXPECT_EQ(download(*target, kBytes), message) << "round " << round;
  }
}

// Posted point-to-point operations are launched by the next collective too, in posting order.
TEST_F(NcclTransportTest, CollectiveLaunchesPostedMessages) {
  constexpr std::size_t kBytes = 300;
  const std::vector<std::byte> message = pattern(kBytes, 3);
  const auto source = on_device(message);
  const auto target = filled(kBytes, 0);
  const Transport::Request receive = transport().irecv(0, 0, writable_bytes_at(*target, kBytes));
  const Transport::Request send = transport().isend(0, 0, bytes_at(*source, kBytes));
  transport().barrier();
  EXPECT_EQ(download(*target, kBytes), message);
  EXPECT_EQ(transport().wait(send), kBytes);
  EXPECT_EQ(transport().wait(receive), kBytes);
}

TEST_F(NcclTransportTest, WaitRejectsUnknownRequests) {
  expect_error([&] { transport().wait(Transport::Request{}); }, ErrorCode::invalid_argument,
               {"wait", "not pending"});
  const auto target = filled(8, 0);
  const auto source = filled(8, 1);
  const Transport::Request receive = transport().irecv(0, 0, writable_bytes_at(*target, 8));
  const Transport::Request send = transport().isend(0, 0, bytes_at(*source, 8));
  EXPECT_EQ(transport().wait(receive), 8u);
  EXPECT_EQ(transport().wait(send), 8u);
  expect_error([&] { transport().wait(send); }, ErrorCode::invalid_argument, {"not pending"});
  expect_error([&] { transport().isend(1, 0, bytes_at(*source, 8)); },
               ErrorCode::invalid_argument, {"isend", "peer 1"});
}

// One rank: the output is `mine`, but it still goes through the padded scratch and the
// stripping copies; bytes past the total stay untouched. Sizes that grow and shrink the
// scratch, and an empty block.
TEST_F(NcclTransportTest, AllgathervStripsThePadding) {
  for (const std::size_t bytes : {std::size_t{13}, std::size_t{100003}, std::size_t{5},
                                  std::size_t{0}}) {
    const std::vector<std::byte> mine = pattern(bytes, static_cast<unsigned>(bytes));
    const auto source = on_device(mine);
    const auto output = filled(bytes + 4, 0xEE);
    const std::vector<std::size_t> counts(static_cast<std::size_t>(transport().size()), bytes);
    transport().allgatherv(bytes_at(*source, bytes), writable_bytes_at(*output, bytes + 4), counts);
    std::vector<std::byte> expected = mine;
    expected.insert(expected.end(), 4, std::byte{0xEE});
    EXPECT_EQ(download(*output, bytes + 4), expected) << bytes << " bytes";
  }
}

TEST_F(NcclTransportTest, AllgathervChecksItsArguments) {
  const auto source = filled(8, 1);
  const auto output = filled(16, 0);
  const std::vector<std::size_t> two = {8, 8};
  expect_error([&] { transport().allgatherv(bytes_at(*source, 8), writable_bytes_at(*output, 16), two); },
               ErrorCode::invalid_argument, {"allgatherv", "2 counts for 1 ranks"});
  const std::vector<std::size_t> seven = {7};
  expect_error([&] { transport().allgatherv(bytes_at(*source, 8), writable_bytes_at(*output, 16), seven); },
               ErrorCode::invalid_argument, {"allgatherv", "8 bytes of mine for a count of 7"});
  const std::vector<std::size_t> eight = {8};
  expect_error([&] { transport().allgatherv(bytes_at(*source, 8), writable_bytes_at(*output, 4), eight); },
               ErrorCode::invalid_argument, {"allgatherv", "output of 4 bytes for 8"});
}

TEST_F(NcclTransportTest, AlltoallvToSelf) {
  constexpr std::size_t kBytes = 77;
  const std::vector<std::byte> message = pattern(kBytes, 9);
  const auto send = on_device(message);
  const auto receive = filled(kBytes + 2, 0xEE);
  const std::vector<std::size_t> counts = {kBytes};
  transport().alltoallv(bytes_at(*send, kBytes), counts, writable_bytes_at(*receive, kBytes + 2),
                        counts);
  std::vector<std::byte> expected = message;
  expected.insert(expected.end(), 2, std::byte{0xEE});
  EXPECT_EQ(download(*receive, kBytes + 2), expected);
  const std::vector<std::size_t> none = {0};
  transport().alltoallv({}, none, {}, none);  // nothing to move: no NCCL call, no error
}

TEST_F(NcclTransportTest, AllgatherU64OfHostValues) {
  const std::vector<std::uint64_t> mine = {1, (std::uint64_t{1} << 40) + 3, UINT64_MAX};
  const std::size_t ranks = static_cast<std::size_t>(transport().size());
  std::vector<std::uint64_t> all(mine.size() * ranks, 0);
  transport().allgather_u64(mine, all);
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(all[r * mine.size() + i], mine[i]);
  }
  std::vector<std::uint64_t> wrong(mine.size() * ranks + 1);
  expect_error([&] { transport().allgather_u64(mine, wrong); }, ErrorCode::invalid_argument,
               {"allgather_u64", "output holds 4 values"});
}

// Small integers: every rank contributes the same values, so the sum is exact.
TEST_F(NcclTransportTest, AllreduceF32SumIsExact) {
  constexpr std::size_t kCount = 1000;
  std::vector<float> values(kCount);
  for (std::size_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(static_cast<int>(i % 17) - 8);
  gpu_test::DeviceArray<float> data(values);
  transport().allreduce_f32_sum(std::span<float>(data.get(), kCount));
  std::vector<float> expected(kCount);
  for (std::size_t i = 0; i < kCount; ++i) expected[i] = values[i] * static_cast<float>(transport().size());
  const std::vector<float> got = data.download();
  EXPECT_TRUE(gpu_test::same_bits(expected, got));
  transport().allreduce_f32_sum({});  // empty: nothing to do
}

TEST_F(NcclTransportTest, Barrier) {
  transport().barrier();
  transport().barrier();
}

TEST_F(NcclTransportTest, SplitsOwnTheirCommunicators) {
  std::unique_ptr<Transport> group = transport().split(0, 0);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->describe(), "nccl rank 0 of 1 on cuda:0");
  gpu_test::DeviceArray<float> data(std::vector<float>{1.0f, -2.0f, 3.0f});
  group->allreduce_f32_sum(std::span<float>(data.get(), 3));
  EXPECT_EQ(data.download(), (std::vector<float>{1.0f, -2.0f, 3.0f}));

  std::unique_ptr<Transport> node = transport().split_by_node();
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->rank(), 0);
  EXPECT_EQ(node->size(), 1);
  node->barrier();
  expect_error([&] { transport().split(-1, 0); }, ErrorCode::invalid_argument,
               {"split", "color -1"});
}

// Host memory where device memory is required: a clear error naming the operation and the
// kind of memory, and the transport stays usable.
TEST_F(NcclTransportTest, HostMemoryIsRejected) {
  std::vector<std::byte> host(64, std::byte{1});
  expect_error([&] { transport().isend(0, 0, host); }, ErrorCode::invalid_argument,
               {"isend", "the send buffer", "pageable host memory", "device memory on cuda:0"});
  expect_error([&] { transport().irecv(0, 0, host); }, ErrorCode::invalid_argument,
               {"irecv", "the receive buffer", "pageable host memory"});
  const auto device = filled(64, 0);
  const std::vector<std::size_t> counts = {64};
  expect_error([&] { transport().allgatherv(host, writable_bytes_at(*device, 64), counts); },
               ErrorCode::invalid_argument, {"allgatherv", "mine", "pageable host memory"});
  expect_error([&] { transport().alltoallv(bytes_at(*device, 64), counts, host, counts); },
               ErrorCode::invalid_argument, {"alltoallv", "the receive buffer"});
  std::vector<float> floats(4, 1.0f);
  expect_error([&] { transport().allreduce_f32_sum(floats); }, ErrorCode::invalid_argument,
               {"allreduce_f32_sum", "pageable host memory"});

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  expect_error([&] { transport().isend(0, 0, std::span<const std::byte>(static_cast<std::byte*>(pinned), 64)); },
               ErrorCode::invalid_argument, {"isend", "pinned host memory"});
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);

  transport().barrier();  // still usable
}

// A one-rank host transport: only allgather_u64 (the bootstrap's id exchange) is used.
class LoopbackHost final : public Transport {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string describe() const override { return "loopback host rank 0 of 1"; }
  Request isend(int, int, std::span<const std::byte>) override { unused("isend"); }
  Request irecv(int, int, std::span<std::byte>) override { unused("irecv"); }
  std::size_t wait(Request) override { unused("wait"); }
  void allgatherv(std::span<const std::byte>, std::span<std::byte>,
                  std::span<const std::size_t>) override {
    unused("allgatherv");
  }
  void alltoallv(std::span<const std::byte>, std::span<const std::size_t>, std::span<std::byte>,
                 std::span<const std::size_t>) override {
    unused("alltoallv");
  }
  void allgather_u64(std::span<const std::uint64_t> mine, std::span<std::uint64_t> all) override {
    EXPECT_EQ(all.size(), mine.size());
    gathered.assign(mine.begin(), mine.end());
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  void allreduce_f32_sum(std::span<float>) override { unused("allreduce_f32_sum"); }
  void barrier() override { unused("barrier"); }
  std::unique_ptr<Transport> split(int, int) override { unused("split"); }
  std::unique_ptr<Transport> split_by_node() override { unused("split_by_node"); }

  std::vector<std::uint64_t> gathered;  // what the last allgather_u64 carried

 private:
  [[noreturn]] static void unused(const char* op) {
    GZ_THROW(ErrorCode::internal, "LoopbackHost::", op, " is not part of the bootstrap");
  }
};

TEST_F(NcclTransportTest, BootstrapOverAHostTransport) {
  LoopbackHost host;
  std::unique_ptr<Transport> made = make_nccl_transport(host, 0);
  ASSERT_NE(made, nullptr);
  // One exchange: a success flag and the 128-byte unique id.
  ASSERT_EQ(host.gathered.size(), 17u);
  EXPECT_EQ(host.gathered[0], 0u);
  EXPECT_EQ(made->describe(), "nccl rank 0 of 1 on cuda:0");
  gpu_test::DeviceArray<float> data(std::vector<float>{0.5f, 4.0f});
  made->allreduce_f32_sum(std::span<float>(data.get(), 2));
  EXPECT_EQ(data.download(), (std::vector<float>{0.5f, 4.0f}));
  const auto source = on_device(pattern(32, 1));
  const auto target = filled(32, 0);
  const Transport::Request receive = made->irecv(0, 0, writable_bytes_at(*target, 32));
  const Transport::Request send = made->isend(0, 0, bytes_at(*source, 32));
  EXPECT_EQ(made->wait(receive), 32u);
  EXPECT_EQ(made->wait(send), 32u);
  EXPECT_EQ(download(*target, 32), pattern(32, 1));
  // The caller's current device is left as it was.
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
}

// Stream order (Transport::begin_stream_order): wait() returns the posted size without waiting
// on the host, and the work stream's later work waits on the device for the transfer (a copy
// queued on the legacy stream right after the wait reads the received bytes); the one host
// wait is wait_for_stream.
TEST_F(NcclTransportTest, StreamOrderedWaitsReturnAtOnceAndTheCompletionWaits) {
  constexpr std::size_t kBytes = 4099;
  const std::vector<std::byte> message = pattern(kBytes, 77);
  const auto source = on_device(message);
  const auto target = filled(kBytes, 0);
  const auto copy = filled(kBytes, 0);
  transport().begin_stream_order(nullptr);  // the legacy default stream
  const kernels::cuda::DeviceRuntimeCounters before = kernels::cuda::device_runtime_counters();
  const Transport::Request receive = transport().irecv(0, 1, writable_bytes_at(*target, kBytes));
  const Transport::Request send = transport().isend(0, 1, bytes_at(*source, kBytes));
  EXPECT_EQ(transport().wait(receive), kBytes);
  EXPECT_EQ(transport().wait(send), kBytes);
  ASSERT_EQ(cudaMemcpyAsync(copy->get(), target->get(), kBytes, cudaMemcpyDeviceToDevice, nullptr),
            cudaSuccess);
  const kernels::cuda::DeviceRuntimeCounters queued = kernels::cuda::device_runtime_counters();
  EXPECT_EQ(queued.synchronizations, before.synchronizations) << "a wait blocked the host";
  transport().wait_for_stream("the test's completion");
  EXPECT_EQ(kernels::cuda::device_runtime_counters().synchronizations, queued.synchronizations + 1);
  transport().end_stream_order();
  EXPECT_EQ(download(*copy, kBytes), message);
}

// A transfer that never completes (a receive nobody sends to) does not hang a stream-ordered
// call: its wait returns at once and the completion times out within the deadline, throwing
// ErrorCode::timeout; the transport then refuses further calls.
TEST_F(NcclTransportTest, StreamOrderedCompletionTimesOutInsteadOfHanging) {
  LoopbackHost host;
  std::unique_ptr<Transport> owned = make_nccl_transport(host, 0);  // aborted on the timeout
  owned->set_deadline_policy(DeadlinePolicy{1.0, TimeoutAction::throw_error});
  const auto target = filled(64, 0);
  owned->begin_stream_order(nullptr);
  const Transport::Request receive = owned->irecv(0, 1, writable_bytes_at(*target, 64));
  EXPECT_EQ(owned->wait(receive), 64u);
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { owned->wait_for_stream("the test's completion"); }, ErrorCode::timeout,
               {"the test's completion"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  owned->end_stream_order();
  EXPECT_THROW(owned->barrier(), Error);
}

TEST_F(NcclTransportTest, BootstrapOnAMissingDeviceThrows) {
  LoopbackHost host;
  expect_error([&] { make_nccl_transport(host, 9999); }, ErrorCode::unsupported,
               {"make_nccl_transport", "cuda:9999", "cudaSetDevice(9999)"});
  // Every rank still took part in the exchange, with the failure flag set.
  ASSERT_EQ(host.gathered.size(), 17u);
  EXPECT_EQ(host.gathered[0], 1u);
  expect_error([&] { adopt_nccl_communicator(nullptr); }, ErrorCode::invalid_argument,
               {"adopt_nccl_communicator", "null"});
}

#else  // a CUDA build without NCCL: the stand-ins say so

TEST(NcclTransportMissing, EntryPointsSaySo) {
  EXPECT_FALSE(nccl_transport_built());
  expect_error([] { adopt_nccl_communicator(nullptr); }, ErrorCode::unsupported,
               {"built without NCCL"});
}

#endif

}  // namespace
}  // namespace gradzip::collectives
