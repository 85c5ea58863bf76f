// The codecs one Communicator's calls use (internal to collectives/): made once per canonical
// spec string and kept, at most kMaxCachedCodecs (the cache starts over when full). A call with
// the spec of the call before it (the common case: one spec per bucket) skips formatting it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

class CodecCache {
 public:
  static constexpr std::size_t kMaxCachedCodecs = 64;

  // The codec of `spec` (make_codec), valid until the cache next starts over.
  const Codec& codec_for(const CompressionSpec& spec);

 private:
  std::map<std::string, std::unique_ptr<Codec>, std::less<>> codecs_;
  // The last answer and the spec it was for (null: none since the cache started over).
  const Codec* last_codec_ = nullptr;
  CompressionSpec last_spec_;
};

}  // namespace gradzip::collectives
