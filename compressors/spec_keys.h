// What a codec's row needs to define its spec keys (CodecDescriptor::keys): the key type and the
// value parsers every key uses, so that each key's parser, printer and error text sit with its
// codec while the messages read the same for every key ("bad value 'x' for key 'bits';
// expected an integer in [1, 8]"), and the keys several codecs share (bucket=; the selection
// keys of top-k and random-k). compression_spec.cpp parses the shared keys with the same
// functions.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
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

// "key=value" with the shortest decimal that reads back as `value`.
std::string print_number(std::string_view key, double value);

// The keys of the codecs that select k entries (top-k, random-k): ratio=R or k=N (whichever
// decides is written: k when given, else the ratio), values=fp32|fp16, ramp=S.
inline constexpr CodecKey kRatioKey{
    "ratio",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.ratio = parse_spec_ratio(text, "ratio", value);
    },
    [](const CompressionSpec& spec) {
      return spec.k == 0 ? print_number("ratio", spec.ratio) : std::string();
    }};
inline constexpr CodecKey kCountKey{
    "k",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.k = parse_spec_unsigned(text, "k", value, 1, UINT64_MAX);
    },
    [](const CompressionSpec& spec) {
      return spec.k != 0 ? detail::concat("k=", spec.k) : std::string();
    }};
inline constexpr CodecKey kValuesKey{
    "values",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.values = parse_spec_choice<DType>(text, "values", value,
                                             {{"fp32", DType::f32}, {"fp16", DType::f16}});
    },
    [](const CompressionSpec& spec) {
      return std::string(spec.values == DType::f16 ? "values=fp16" : "values=fp32");
    }};
inline constexpr CodecKey kRampKey{
    "ramp",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.ramp =
          static_cast<std::uint32_t>(parse_spec_unsigned(text, "ramp", value, 0, UINT32_MAX));
    },
    [](const CompressionSpec& spec) { return detail::concat("ramp=", spec.ramp); }};

// The rule between the selection keys: ratio or k, not both; when k is given, the ratio keeps
// its default (the canonical form). A CodecDescriptor::check_spec.
void check_selection_spec(CompressionSpec& spec, std::string_view text,
                          const std::set<std::string_view>& given);

}  // namespace gradzip::compressors
