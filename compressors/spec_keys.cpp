// The spec value parsers (compressors/spec_keys.h).
#include "compressors/spec_keys.h"

#include <charconv>
#include <cmath>
#include <set>
#include <string>

namespace gradzip::compressors {

void bad_spec_value(std::string_view text, std::string_view key, std::string_view value,
                    std::string_view expected) {
  GZ_THROW(ErrorCode::invalid_spec, "compression spec '", text, "': bad value '", value,
           "' for key '", key, "'; expected ", expected);
}

std::uint64_t parse_spec_unsigned(std::string_view text, std::string_view key,
                                  std::string_view value, std::uint64_t min, std::uint64_t max) {
  std::uint64_t result = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), result);
  if (error != std::errc() || end != value.data() + value.size() || result < min || result > max)
    bad_spec_value(text, key, value, detail::concat("an integer in [", min, ", ", max, "]"));
  return result;
}

double parse_spec_ratio(std::string_view text, std::string_view key, std::string_view value) {
  double result = 0.0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), result);
  if (error != std::errc() || end != value.data() + value.size() || !std::isfinite(result) ||
      !(result > 0.0) || result > 1.0)
    bad_spec_value(text, key, value, "a number in (0, 1]");
  return result;
}

std::string join_names(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::string print_number(std::string_view key, double value) {
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(key) + "=" + std::string(buffer, error == std::errc() ? end : buffer);
}

void check_selection_spec(CompressionSpec& spec, std::string_view text,
                          const std::set<std::string_view>& given) {
  GZ_REQUIRE(!(given.count("ratio") && given.count("k")), ErrorCode::invalid_spec,
             "compression spec '", text, "': give ratio or k, not both");
  if (given.count("k")) spec.ratio = 0.01;
}

}  // namespace gradzip::compressors
