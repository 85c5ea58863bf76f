#include "compressors/registry.h"

#include "gradzip/error.h"

namespace gradzip {

std::unique_ptr<Codec> make_codec(const CompressionSpec& spec) {
  switch (spec.codec) {
    case CodecKind::none: return compressors::make_none_codec(spec);
    case CodecKind::fp16:
    case CodecKind::bf16: return compressors::make_cast_codec(spec);
    case CodecKind::qsgd: return compressors::make_qsgd_codec(spec);
    case CodecKind::sign: return compressors::make_sign_codec(spec);
    case CodecKind::topk: return compressors::make_topk_codec(spec);
    case CodecKind::randk: return compressors::make_randk_codec(spec);
    case CodecKind::powersgd:
      GZ_THROW(ErrorCode::unsupported,
               "make_codec: powersgd compresses whole matrices inside the Reducer; it has no "
               "element codec (spec '", spec.to_string(), "')");
  }
  GZ_THROW(ErrorCode::internal, "make_codec: codec kind ", static_cast<int>(spec.codec),
           " has no factory");
}

std::unique_ptr<Codec> make_codec(std::string_view spec) {
  return make_codec(CompressionSpec::parse(spec));
}

}  // namespace gradzip
