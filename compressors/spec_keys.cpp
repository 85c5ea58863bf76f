// The spec value parsers (compressors/spec_keys.h).
#include "compressors/spec_keys.h"

#include <charconv>
#include <cmath>

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

}  // namespace gradzip::compressors
