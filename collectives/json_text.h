// JSON text pieces shared by the writers of stats and timelines: a quoted string and a number.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace gradzip::collectives {

// `text` as a JSON string literal, quotes included (", \ and control characters escaped).
inline std::string json_quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// `value` with `significant` digits (%g); non-finite values as 0 (JSON has no NaN or Inf).
inline std::string json_number(double value, int significant = 9) {
  char text[40];
  std::snprintf(text, sizeof text, "%.*g", significant, std::isfinite(value) ? value : 0.0);
  return text;
}

}  // namespace gradzip::collectives
