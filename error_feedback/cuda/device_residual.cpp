// error_feedback/device_residual.h with device paths.
#include "error_feedback/device_residual.h"

#include "kernels/device_api.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "compressors/cuda/device_support.h"
#include "gradzip/error.h"

namespace gradzip::error_feedback {

using namespace compressors::device;  // compressors/cuda/device_support.h

namespace {
constexpr const char* kOp = "error feedback: device residual";
}  // namespace

DeviceResidual::DeviceResidual(std::size_t count, int device, bool zeroed)
    : count_(count), device_(device) {
  const std::string op = kOp;
  const DeviceScope scope(device, op);
  const std::size_t bytes = checked_product(count == 0 ? 1 : count, sizeof(float), op);
  data_ = static_cast<float*>(cuda::device_allocate(
      bytes, device, static_cast<cudaStream_t>(work_stream()), op, "allocating the residual"));
  if (!zeroed) return;
  check_runtime(cudaMemsetAsync(data_, 0, bytes, static_cast<cudaStream_t>(work_stream())), op,
                "zeroing the residual");
}

DeviceResidual::~DeviceResidual() {
  const kernels::cuda::CurrentCudaDevice current(device_);
  cuda::device_release(data_, (count_ == 0 ? 1 : count_) * sizeof(float), device_,
                       static_cast<cudaStream_t>(work_stream()));
}

namespace {

// Two pinned host blocks and an event for each: the staging of a residual's copy between device
// and host memory (checkpoints, reads by the host). Pinned memory is what the copy engine moves
// at full link speed without the driver's own staging; with two blocks, the copy engine fills
// (or drains) one while the host copies the other, so the transfer and the host copy overlap.
class PinnedStaging {
 public:
  PinnedStaging(std::size_t block_bytes, int device, const std::string& op)
      : block_bytes_(block_bytes), op_(op) {
    const DeviceScope scope(device, op);
    for (int b = 0; b < 2; ++b) {
      check_runtime(cudaEventCreateWithFlags(&events_[b], cudaEventDisableTiming), op,
                    "creating a staging event");
    }
    data_ = static_cast<std::byte*>(cuda::pinned_allocate(2 * block_bytes, op));
  }
  ~PinnedStaging() {
    cuda::pinned_release(data_);
    for (cudaEvent_t event : events_)
      if (event != nullptr) cudaEventDestroy(event);
  }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  std::byte* block(std::size_t b) const noexcept { return data_ + (b % 2) * block_bytes_; }
  // Marks the work queued on the work stream so far as what block b waits for.
  void record(std::size_t b) {
    check_runtime(cudaEventRecord(events_[b % 2], static_cast<cudaStream_t>(work_stream())), op_,
                  "recording a staging event");
  }
  void wait(std::size_t b) const {
    cuda::synchronize_event(events_[b % 2], op_, "a residual copy through pinned staging");
  }

 private:
  std::size_t block_bytes_;
  std::string op_;
  std::byte* data_ = nullptr;
  std::array<cudaEvent_t, 2> events_{};
};

}  // namespace

void DeviceResidual::download(std::span<float> out, std::size_t staging_bytes) const {
  const std::string op = kOp;
  GZ_REQUIRE(out.size() == count_, ErrorCode::internal, op, ": ", out.size(),
             " host elements for a residual of ", count_);
  GZ_REQUIRE(staging_bytes >= sizeof(float), ErrorCode::invalid_argument, op,
             ": a staging block of ", staging_bytes, " bytes holds no value");
  if (count_ == 0) return;
  const DeviceScope scope(device_, op);
  const std::size_t bytes = count_ * sizeof(float);
  const std::size_t block = std::min(bytes, staging_bytes / sizeof(float) * sizeof(float));
  const std::size_t blocks = (bytes + block - 1) / block;
  PinnedStaging staging(block, device_, op);
  const auto* from = reinterpret_cast<const std::byte*>(data_);
  auto* to = reinterpret_cast<std::byte*>(out.data());
  const auto queue = [&](std::size_t b) {  // block b: device -> pinned, after the queued work
    const std::size_t size = std::min(block, bytes - b * block);
    check_runtime(cudaMemcpyAsync(staging.block(b), from + b * block, size, cudaMemcpyDeviceToHost,
                                  static_cast<cudaStream_t>(work_stream())),
                  op, "copying the residual to pinned staging");
    staging.record(b);
  };
  queue(0);
  for (std::size_t b = 0; b < blocks; ++b) {
    // Block b + 1 goes into the other pinned block (emptied at step b - 1) while b is copied out.
    if (b + 1 < blocks) queue(b + 1);
    staging.wait(b);
    std::memcpy(to + b * block, staging.block(b), std::min(block, bytes - b * block));
  }
}

void DeviceResidual::upload(std::span<const float> in, std::size_t staging_bytes) {
  const std::string op = kOp;
  GZ_REQUIRE(in.size() == count_, ErrorCode::internal, op, ": ", in.size(),
             " host elements for a residual of ", count_);
  GZ_REQUIRE(staging_bytes >= sizeof(float), ErrorCode::invalid_argument, op,
             ": a staging block of ", staging_bytes, " bytes holds no value");
  if (count_ == 0) return;
  const DeviceScope scope(device_, op);
  const std::size_t bytes = count_ * sizeof(float);
  const std::size_t block = std::min(bytes, staging_bytes / sizeof(float) * sizeof(float));
  const std::size_t blocks = (bytes + block - 1) / block;
  PinnedStaging staging(block, device_, op);
  const auto* from = reinterpret_cast<const std::byte*>(in.data());
  auto* to = reinterpret_cast<std::byte*>(data_);
  for (std::size_t b = 0; b < blocks; ++b) {
    // The pinned block b last held block b - 2, whose copy to the device must have finished.
    if (b >= 2) staging.wait(b);
    const std::size_t size = std::min(block, bytes - b * block);
    std::memcpy(staging.block(b), from + b * block, size);
    check_runtime(cudaMemcpyAsync(to + b * block, staging.block(b), size, cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(work_stream())),
                  op, "copying the residual from pinned staging");
    staging.record(b);
  }
  // The staging memory goes (and `in` may go) once this returns: the last copy's event covers
  // every earlier one (one stream, in order).
  staging.wait(blocks - 1);
}

void DeviceResidual::copy_from(const DeviceResidual& other) {
  const std::string op = kOp;
  GZ_REQUIRE(other.count_ == count_ && other.device_ == device_, ErrorCode::internal, op,
             ": a copy of ", other.count_, " elements on cuda:", other.device_, " into ", count_,
             " on cuda:", device_);
  if (count_ == 0) return;
  const DeviceScope scope(device_, op);
  check_runtime(cudaMemcpyAsync(data_, other.data_, count_ * sizeof(float), cudaMemcpyDeviceToDevice,
                                static_cast<cudaStream_t>(work_stream())),
                op, "copying the residual on the device");
}

}  // namespace gradzip::error_feedback
