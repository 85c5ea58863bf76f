// Parser and printer of compression spec strings (grammar in include/gradzip/compression_spec.h).
// Codec names, their keys (each key's parser and printer) and rules come from the codecs' rows
// (compressors/codec_descriptor.h); the shared keys' parsers and printers are here.
#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "compressors/codec_descriptor.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"

namespace gradzip {
namespace {

using compressors::CodecDescriptor;
using compressors::codec_descriptors;
using compressors::parse_spec_choice;  // the shared keys parse as the codecs' keys do
using compressors::parse_spec_unsigned;

constexpr std::array<std::string_view, 10> kSharedKeys = {
    "ef",   "ef_resize",      "algo",      "warmup",   "min_bytes",
    "seed", "ranks_per_node", "nonfinite", "fallback", "segment"};

std::string accepted_codecs() {
  std::vector<std::string_view> names;
  for (const CodecDescriptor& row : codec_descriptors()) names.push_back(row.name);
  return compressors::join_names(names);
}

std::string accepted_keys(const CodecDescriptor& entry) {
  std::vector<std::string_view> keys;
  for (const compressors::CodecKey& key : entry.keys) keys.push_back(key.name);
  keys.insert(keys.end(), kSharedKeys.begin(), kSharedKeys.end());
  return compressors::join_names(keys);
}

// The row's key named `name`, or null.
const compressors::CodecKey* find_key(const CodecDescriptor& entry, std::string_view name) {
  for (const compressors::CodecKey& key : entry.keys)
    if (key.name == name) return &key;
  return nullptr;
}

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// The algo= values and their names (gradzip/algorithm_list.h): what the parser accepts.
#define GRADZIP_ALGORITHM_CHOICE(value, name) \
  std::pair<std::string_view, Algorithm>{name, Algorithm::value},
constexpr std::array kAlgorithmNames{GRADZIP_ALGORITHMS(GRADZIP_ALGORITHM_CHOICE)};
#undef GRADZIP_ALGORITHM_CHOICE

}  // namespace

std::string_view codec_kind_name(CodecKind kind) noexcept {
  for (const CodecDescriptor& row : codec_descriptors())
    if (row.kind == kind) return row.name;
  return "unknown";
}

std::string_view fallback_policy_name(FallbackPolicy policy) noexcept {
  switch (policy) {
    case FallbackPolicy::off: return "off";
    case FallbackPolicy::dense: return "dense";
  }
  return "unknown";
}

std::string_view nonfinite_policy_name(NonfinitePolicy policy) noexcept {
  switch (policy) {
    case NonfinitePolicy::propagate: return "propagate";
    case NonfinitePolicy::error: return "error";
    case NonfinitePolicy::skip: return "skip";
  }
  return "unknown";
}

CompressionSpec CompressionSpec::parse(std::string_view text) {
  const std::string_view spec = trim(text);
  GZ_REQUIRE(!spec.empty(), ErrorCode::invalid_spec,
             "compression spec is empty; expected a codec name, one of: ", accepted_codecs());

  const std::size_t colon = spec.find(':');
  const std::string_view codec_name = trim(spec.substr(0, colon));
  const CodecDescriptor* entry = compressors::find_codec_descriptor(codec_name);
  GZ_REQUIRE(entry != nullptr, ErrorCode::invalid_spec, "compression spec '", spec,
             "': unknown codec '", codec_name, "'; accepted codecs: ", accepted_codecs());

  CompressionSpec result;
  result.codec = entry->kind;
  result.error_feedback = entry->error_feedback_default;
  if (colon == std::string_view::npos) return result;

  std::set<std::string_view> seen;
  std::string_view rest = spec.substr(colon + 1);
  GZ_REQUIRE(!trim(rest).empty(), ErrorCode::invalid_spec, "compression spec '", spec,
             "': nothing after ':'; expected key=value options, accepted keys: ",
             accepted_keys(*entry));
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view option = trim(rest.substr(0, comma));
    const std::size_t equals = option.find('=');
    GZ_REQUIRE(equals != std::string_view::npos && equals > 0, ErrorCode::invalid_spec,
               "compression spec '", spec, "': option '", option,
               "' is not key=value; accepted keys: ", accepted_keys(*entry));
    const std::string_view key = trim(option.substr(0, equals));
    const std::string_view value = trim(option.substr(equals + 1));

    const compressors::CodecKey* codec_key = find_key(*entry, key);
    const bool shared_key = std::find(kSharedKeys.begin(), kSharedKeys.end(), key) != kSharedKeys.end();
    GZ_REQUIRE(codec_key != nullptr || shared_key, ErrorCode::invalid_spec, "compression spec '", spec,
               "': unknown key '", key, "' for codec '", entry->name,
               "'; accepted keys: ", accepted_keys(*entry));
    GZ_REQUIRE(seen.insert(key).second, ErrorCode::invalid_spec, "compression spec '", spec,
               "': key '", key, "' given twice");

    if (codec_key != nullptr) {
      codec_key->parse(result, value, spec);
    } else if (key == "ef") {
      result.error_feedback = parse_spec_choice<bool>(spec, key, value, {{"on", true}, {"off", false}});
    } else if (key == "ef_resize") {
      result.ef_resize = parse_spec_choice<ResizePolicy>(
          spec, key, value, {{"error", ResizePolicy::error}, {"reset", ResizePolicy::reset}});
    } else if (key == "algo") {
      // "allgather" is the sparse all-reduce's former name, still accepted.
      result.algo = parse_spec_choice<Algorithm>(spec, key, value == "allgather" ? "sparse" : value,
                                                 kAlgorithmNames);
    } else if (key == "warmup") {
      result.warmup = static_cast<std::uint32_t>(parse_spec_unsigned(spec, key, value, 0, UINT32_MAX));
    } else if (key == "min_bytes") {
      result.min_bytes = parse_spec_unsigned(spec, key, value, 0, UINT64_MAX);
    } else if (key == "seed") {
      result.seed = parse_spec_unsigned(spec, key, value, 0, UINT64_MAX);
    } else if (key == "ranks_per_node") {
      result.ranks_per_node =
          static_cast<std::uint32_t>(parse_spec_unsigned(spec, key, value, 0, 1u << 20));
    } else if (key == "nonfinite") {
      result.nonfinite = parse_spec_choice<NonfinitePolicy>(spec, key, value,
                                                       {{"propagate", NonfinitePolicy::propagate},
                                                        {"error", NonfinitePolicy::error},
                                                        {"skip", NonfinitePolicy::skip}});
    } else if (key == "fallback") {
      result.fallback = parse_spec_choice<FallbackPolicy>(
          spec, key, value, {{"off", FallbackPolicy::off}, {"dense", FallbackPolicy::dense}});
    } else if (key == "segment") {
      result.segment_bytes = parse_spec_unsigned(spec, key, value, 0, UINT64_MAX);
    } else {
      GZ_THROW(ErrorCode::internal, "compression spec: key '", key, "' accepted but not handled");
    }

    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (entry->check_spec != nullptr) entry->check_spec(result, spec, seen);
  // fallback=dense is a choice algo=auto's cost model makes; an explicit algorithm is the
  // user's, and PowerSGD runs in the Reducer, where no single collective chooses.
  GZ_REQUIRE(result.fallback == FallbackPolicy::off || result.algo == Algorithm::auto_select,
             ErrorCode::invalid_spec, "compression spec '", spec, "': fallback=dense needs algo=auto "
             "(the cost model chooses between the compressed and the dense path); algo=",
             algorithm_name(result.algo), " always runs that algorithm");
  GZ_REQUIRE(result.fallback == FallbackPolicy::off || result.codec != CodecKind::powersgd,
             ErrorCode::invalid_spec, "compression spec '", spec,
             "': fallback=dense is a collective's choice and powersgd runs in the Reducer, not "
             "in a single collective");
  return result;
}

std::string CompressionSpec::to_string() const {
  const CodecDescriptor& entry = compressors::codec_descriptor(codec);
  std::string out(entry.name);
  std::vector<std::string> options;
  for (const compressors::CodecKey& key : entry.keys) {
    std::string option = key.print(*this);
    if (!option.empty()) options.push_back(std::move(option));
  }
  options.push_back(error_feedback ? "ef=on" : "ef=off");
  options.push_back(ef_resize == ResizePolicy::reset ? "ef_resize=reset" : "ef_resize=error");
  options.push_back(detail::concat("algo=", algorithm_name(algo)));
  options.push_back(detail::concat("warmup=", warmup));
  options.push_back(detail::concat("min_bytes=", min_bytes));
  options.push_back(detail::concat("seed=", seed));
  options.push_back(detail::concat("ranks_per_node=", ranks_per_node));
  options.push_back(detail::concat("nonfinite=", nonfinite_policy_name(nonfinite)));
  // Written only when on, so that every spec without it keeps the canonical string (and the
  // call-check fingerprint and checkpoint entries made from it) it had before the key existed.
  if (fallback == FallbackPolicy::dense) options.push_back("fallback=dense");
  // The same for segment: the default is not written.
  if (segment_bytes != kDefaultSegmentBytes) options.push_back(detail::concat("segment=", segment_bytes));
  for (std::size_t i = 0; i < options.size(); ++i) out += (i == 0 ? ":" : ",") + options[i];
  return out;
}

std::size_t CompressionSpec::k_for(std::size_t n) const noexcept {
  if (n == 0) return 0;
  if (k > 0) return std::min(k, n);
  const double wanted = std::ceil(ratio * static_cast<double>(n));
  if (!(wanted >= 1.0)) return 1;
  if (wanted >= static_cast<double>(n)) return n;
  return static_cast<std::size_t>(wanted);
}

}  // namespace gradzip
