// error_feedback/device_residual.h in a build without device paths: every call says so.
#include "error_feedback/device_residual.h"

#include "gradzip/error.h"

namespace gradzip::error_feedback {

DeviceResidual::DeviceResidual(std::size_t count, int device, bool /*zeroed*/)
    : count_(count), device_(device) {
  GZ_THROW(ErrorCode::unsupported, "error feedback: a residual of ", count,
           " elements on CUDA device ", device,
           "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
}
DeviceResidual::~DeviceResidual() = default;
void DeviceResidual::download(std::span<float> /*out*/, std::size_t /*staging_bytes*/) const {}
void DeviceResidual::upload(std::span<const float> /*in*/, std::size_t /*staging_bytes*/) {}
void DeviceResidual::copy_from(const DeviceResidual& /*other*/) {}

}  // namespace gradzip::error_feedback
