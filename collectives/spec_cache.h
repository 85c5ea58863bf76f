// The specs one Communicator's calls name (internal to collectives/): a spec text is parsed and
// printed canonically once and kept, and a parsed spec is printed once while the same spec is
// asked for again, instead of both on every call (the call check and the stats carry the
// canonical text). At most kMaxCachedTexts texts are kept (the cache starts over when full); a
// text that does not parse is not kept. Like the rest of a Communicator's state, not for
// concurrent use.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

class SpecCache {
 public:
  static constexpr std::size_t kMaxCachedTexts = 64;

  struct Parsed {
    CompressionSpec spec;
    std::string canonical;  // spec.to_string()
  };

  // CompressionSpec::parse(text) and its canonical text; throws what parse throws. Valid until
  // the cache next starts over (the next call of parse).
  const Parsed& parse(std::string_view text);

  // spec.to_string(). Valid until the next call of canonical_text.
  const std::string& canonical_text(const CompressionSpec& spec);

 private:
  std::map<std::string, Parsed, std::less<>> parsed_;
  // The last spec canonical_text printed, and its text (empty: none yet).
  CompressionSpec last_spec_;
  std::string last_text_;
};

}  // namespace gradzip::collectives
