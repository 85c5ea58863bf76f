// Error feedback on CUDA tensors: error_feedback/device_feedback.h. The same element
// operations as the host decorator (kernels/ef_math.h through kernels/cuda/ef_cuda.h), on the
// residual slice in device memory (ResidualStore::device_residual): no copy to or from the host.
#include "error_feedback/device_feedback.h"

#include "kernels/device_api.h"

#include <optional>
#include <string>

#include "compressors/cuda/device_support.h"
#include "compressors/device_codec.h"
#include "gradzip/error.h"
#include "kernels/cuda/ef_cuda.h"

namespace gradzip::error_feedback {

using namespace compressors::device;  // compressors/cuda/device_support.h

std::size_t device_feedback_encode(const Codec& codec, ConstTensorView chunk,
                                   float* d_residual, std::span<std::byte> out,
                                   const EncodeContext& ctx, std::span<float> decoded) {
  const std::string op = "ef.encode (" + std::string(codec_kind_name(codec.spec().codec)) + ")";
  const std::size_t count = chunk.count;
  GZ_REQUIRE(d_residual != nullptr || count == 0, ErrorCode::internal, op,
             ": no residual for a chunk of ", count, " elements");
  GZ_REQUIRE(chunk.data != nullptr || count == 0, ErrorCode::invalid_argument, op,
             ": null data pointer for ", count, " elements");
  const DeviceScope scope(chunk.device.index, op);
  if (count > 0) cuda::require_device_pointer(chunk.data, chunk.device.index, op, "the input tensor");
  if (!decoded.empty()) cuda::require_device_pointer(decoded.data(), chunk.device.index, op, "the decoded output");

  // Casts, sign, qsgd and terngrad fuse it into one pass, top-k and random-k update in place
  // (compressors/device_codec.h); the other codecs and shapes take the four passes below.
  if (decoded.empty() && count > 0) {
    if (const std::optional<std::size_t> bytes =
            compressors::device_encode_with_feedback(codec, chunk, d_residual, out, ctx))
      return *bytes;
  }

  // c = g + e and (unless the caller takes it) D(message), each `count` floats.
  const std::size_t floats = checked_product(count, decoded.empty() ? 2 : 1, op);
  DeviceScratch work(checked_product(floats, sizeof(float), op), op);
  float* const d_compensated = work.as<float>();
  float* const d_decoded = decoded.empty() ? d_compensated + count : decoded.data();
  const F32Input gradient(chunk, op);
  cuda::ef_compensate(gradient.data(), d_residual, d_compensated, count, work_stream());

  const Device device = chunk.device;
  const std::size_t bytes =
      codec.encode(ConstTensorView(d_compensated, count, DType::f32, device), out, ctx);
  compressors::device_decode_own(codec, out.first(bytes), TensorView{d_decoded, count, DType::f32, device},
                                 ctx);
  // The residual changes only here, after the encode and the decode succeeded.
  cuda::ef_update(d_compensated, d_decoded, d_residual, count, work_stream());
  finish(op);
  return bytes;
}

}  // namespace gradzip::error_feedback
