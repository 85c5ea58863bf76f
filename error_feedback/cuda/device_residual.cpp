// error_feedback/device_residual.h with device paths.
#include "error_feedback/device_residual.h"

#include "kernels/device_api.h"

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

void DeviceResidual::download(std::span<float> out) const {
  const std::string op = kOp;
  GZ_REQUIRE(out.size() == count_, ErrorCode::internal, op, ": ", out.size(),
             " host elements for a residual of ", count_);
  if (count_ == 0) return;
  const DeviceScope scope(device_, op);
  check_runtime(cudaMemcpyAsync(out.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(work_stream())),
                op, "copying the residual to the host");
  synchronize(op);
}

void DeviceResidual::upload(std::span<const float> in) {
  const std::string op = kOp;
  GZ_REQUIRE(in.size() == count_, ErrorCode::internal, op, ": ", in.size(),
             " host elements for a residual of ", count_);
  if (count_ == 0) return;
  const DeviceScope scope(device_, op);
  copy_to_device(data_, in.data(), count_ * sizeof(float), op);
  synchronize(op);  // `in` may go once this returns
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
