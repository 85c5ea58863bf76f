// SpecCache (collectives/spec_cache.h).
#include "collectives/spec_cache.h"

namespace gradzip::collectives {

const SpecCache::Parsed& SpecCache::parse(std::string_view text) {
  if (const auto found = parsed_.find(text); found != parsed_.end()) return found->second;
  CompressionSpec spec = CompressionSpec::parse(text);  // throws before the cache changes
  std::string canonical = spec.to_string();
  if (parsed_.size() >= kMaxCachedTexts) parsed_.clear();
  return parsed_.emplace(std::string(text), Parsed{std::move(spec), std::move(canonical)})
      .first->second;
}

const std::string& SpecCache::canonical_text(const CompressionSpec& spec) {
  // Equal specs print the same text.
  if (last_text_.empty() || spec != last_spec_) {
    last_text_ = spec.to_string();
    last_spec_ = spec;
  }
  return last_text_;
}

}  // namespace gradzip::collectives
