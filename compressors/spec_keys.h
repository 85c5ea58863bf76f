// What a codec's row needs to define its spec keys (CodecDescriptor::keys): the key type and the
// value parsers every key uses, so that each key's parser, printer and error text sit with its
// codec while the messages read the same for every key ("bad value 'x' for key 'bits';
// expected an integer in [1, 8]"). compression_spec.cpp parses the shared keys with the same
// functions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradzip/compression_spec.h"
#include "gradzip/error.h"

namespace gradzip::compressors {

// One key of a codec's spec grammar.
struct CodecKey {
  std::string_view name;
  // Sets the key's field of `spec` from `value`; throws ErrorCode::invalid_spec naming `text`
  // (the whole spec string), the key and what it accepts.
  void (*parse)(CompressionSpec& spec, std::string_view value, std::string_view text) = nullptr;
  // The key's "key=value" in the canonical string (CompressionSpec::to_string), or an empty
  // string to leave it out (k when the ratio decides, ratio when k does).
  std::string (*print)(const CompressionSpec& spec) = nullptr;
};

// Throws ErrorCode::invalid_spec: "compression spec 'text': bad value 'value' for key 'key';
// expected <expected>".
[[noreturn]] void bad_spec_value(std::string_view text, std::string_view key,
                                 std::string_view value, std::string_view expected);

// An integer in [min, max], in decimal.
std::uint64_t parse_spec_unsigned(std::string_view text, std::string_view key,
                                  std::string_view value, std::uint64_t min, std::uint64_t max);

// A finite number in (0, 1].
double parse_spec_ratio(std::string_view text, std::string_view key, std::string_view value);

// "a, b, c".
std::string join_names(const std::vector<std::string_view>& names);

// The value of the choice named `value`; the error lists the names in order.
template <typename T, typename Choices = std::initializer_list<std::pair<std::string_view, T>>>
T parse_spec_choice(std::string_view text, std::string_view key, std::string_view value,
                    const Choices& choices) {
  std::vector<std::string_view> names;
  for (const auto& [name, result] : choices) {
    if (name == value) return result;
    names.push_back(name);
  }
  bad_spec_value(text, key, value, "one of: " + join_names(names));
}

// bucket=N, N in [1, 2^31]: the key of the codecs with one scale per bucket (qsgd, sign,
// terngrad).
inline constexpr CodecKey kBucketKey{
    "bucket",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.bucket = parse_spec_unsigned(text, "bucket", value, 1, std::uint64_t{1} << 31);
    },
    [](const CompressionSpec& spec) { return detail::concat("bucket=", spec.bucket); }};

}  // namespace gradzip::compressors
