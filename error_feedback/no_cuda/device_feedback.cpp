// error_feedback/device_feedback.h in a build without CUDA: every call says so.
#include "error_feedback/device_feedback.h"

#include "gradzip/error.h"

namespace gradzip::error_feedback {

std::size_t device_feedback_encode(const Codec& codec, ConstTensorView chunk,
                                   float* /*d_residual*/, std::span<std::byte> /*out*/,
                                   const EncodeContext& /*ctx*/, std::span<float> /*decoded*/) {
  GZ_THROW(ErrorCode::unsupported, "ef.encode with ", codec_kind_name(codec.spec().codec),
           ": the tensor is on CUDA device ", chunk.device.index,
           "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
}

}  // namespace gradzip::error_feedback
