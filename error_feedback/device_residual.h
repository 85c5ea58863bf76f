// A residual's values in the memory of one CUDA device: where error feedback on CUDA tensors
// keeps them (error_feedback/residual_store.h, ResidualStore::device_residual), so that an
// encode reads and writes them on the device and the host sees them only when it asks (a
// checkpoint, residual(name)). Built from error_feedback/cuda/ with device paths; the no_cuda/
// stand-in throws ErrorCode::unsupported.
#pragma once

#include <cstddef>
#include <span>

namespace gradzip::error_feedback {

class DeviceResidual {
 public:
  // `count` zeros in the memory of CUDA device `device`, from the calling thread's block cache
  // (kernels/cuda/device_runtime.h), zeroed in order on the thread's work stream (the stream
  // every later encode of this thread runs on).
  // With `zeroed` false the values are left as the allocation found them (for a copy that
  // overwrites them all: copy_from).
  DeviceResidual(std::size_t count, int device, bool zeroed = true);
  ~DeviceResidual();
  DeviceResidual(const DeviceResidual&) = delete;
  DeviceResidual& operator=(const DeviceResidual&) = delete;

  float* data() const noexcept { return data_; }
  std::size_t count() const noexcept { return count_; }
  int device() const noexcept { return device_; }

  // The values into / from host memory (out.size() == in.size() == count()), after the work
  // already queued on the thread's work stream, and finished before returning. They move
  // through two pinned host blocks of at most `staging_bytes` each (rounded down to whole
  // values; at least one value), so the copy engine transfers one block while the host copies
  // the other: pageable memory would be staged by the driver, synchronously, block by block.
  static constexpr std::size_t kStagingBytes = std::size_t{8} << 20;
  void download(std::span<float> out, std::size_t staging_bytes = kStagingBytes) const;
  void upload(std::span<const float> in, std::size_t staging_bytes = kStagingBytes);
  // this = other's values (same count and device), queued on the thread's work stream after the
  // work already there; nothing waits.
  void copy_from(const DeviceResidual& other);

 private:
  float* data_ = nullptr;
  std::size_t count_ = 0;
  int device_ = 0;
};

}  // namespace gradzip::error_feedback
