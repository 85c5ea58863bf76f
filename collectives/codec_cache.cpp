// CodecCache (collectives/codec_cache.h).
#include "collectives/codec_cache.h"

namespace gradzip::collectives {

const Codec& CodecCache::codec_for(const CompressionSpec& spec) {
  // Equal specs print the same canonical string, so the last answer is the map's answer too.
  if (last_codec_ != nullptr && spec == last_spec_) return *last_codec_;
  const std::string key = spec.to_string();
  const auto found = codecs_.find(key);
  if (found != codecs_.end()) {
    last_codec_ = found->second.get();
  } else {
    last_codec_ = nullptr;  // make_codec may throw after the clear
    if (codecs_.size() >= kMaxCachedCodecs) codecs_.clear();
    last_codec_ = codecs_.emplace(key, make_codec(spec)).first->second.get();
  }
  last_spec_ = spec;
  return *last_codec_;
}

}  // namespace gradzip::collectives
