// A build without CUDA: codecs refuse CUDA tensors, saying why.
#include "compressors/device_codec.h"

#include "gradzip/error.h"

namespace gradzip::compressors {

bool device_codecs_built() noexcept { return false; }

std::size_t device_encode(const Codec& codec, ConstTensorView in, std::span<std::byte> /*out*/,
                          const EncodeContext& /*ctx*/) {
  GZ_THROW(ErrorCode::unsupported, codec_kind_name(codec.spec().codec),
           ".encode: the tensor is on CUDA device ",
           in.device.index, "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
}

void device_decode(const Codec& codec, std::span<const std::byte> /*in*/, TensorView out,
                   bool accumulate) {
  GZ_THROW(ErrorCode::unsupported, codec_kind_name(codec.spec().codec),
           accumulate ? ".decode_add" : ".decode",
           ": the tensor is on CUDA device ", out.device.index,
           "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
}

void device_decode_own(const Codec& codec, std::span<const std::byte> in, TensorView out,
                         const EncodeContext& /*ctx*/) {
  device_decode(codec, in, out, false);
}

std::optional<std::size_t> device_encode_with_feedback(const Codec& /*codec*/, ConstTensorView /*g*/,
                                                       float* /*d_residual*/,
                                                       std::span<std::byte> /*out*/,
                                                       const EncodeContext& /*ctx*/) {
  return std::nullopt;
}

void require_device_tensor(ConstTensorView view, std::string_view op) {
  GZ_THROW(ErrorCode::unsupported, op, ": the tensor is on CUDA device ", view.device.index,
           "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
}

}  // namespace gradzip::compressors
