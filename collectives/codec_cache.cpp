// CodecCache (collectives/codec_cache.h).
#include "collectives/codec_cache.h"

namespace gradzip::collectives {

const Codec& CodecCache::codec_for(const CompressionSpec& spec) {
  const std::string key = spec.to_string();
  if (const auto found = codecs_.find(key); found != codecs_.end()) return *found->second;
  if (codecs_.size() >= kMaxCachedCodecs) codecs_.clear();
  return *codecs_.emplace(key, make_codec(spec)).first->second;
}

}  // namespace gradzip::collectives
