// Placeholder until the codec lands: the factory refuses with a clear error.
#include "compressors/registry.h"
#include "gradzip/error.h"

namespace gradzip::compressors {

std::unique_ptr<Codec> make_cast_codec(const CompressionSpec& spec) {
  GZ_THROW(ErrorCode::unsupported, "make_codec: codec '", spec.to_string(), "' is not built yet");
}

}  // namespace gradzip::compressors
