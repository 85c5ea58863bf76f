// Every GRADZIP_* environment variable, its default and its doc line, in one table.
// Values are read once, on first use, and cached; the README lists the same table.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace gradzip::kernels {

struct Tunable {
  std::string_view name;           // e.g. "GRADZIP_CPU_ISA"
  std::string_view default_value;  // what applies when the variable is unset
  std::string_view doc;
};

// The table, in README order.
std::span<const Tunable> tunables() noexcept;

// The variable's value from the environment (read once per process), or its default.
// Throws gradzip::Error(invalid_argument) for a name not in the table.
const std::string& tunable_value(std::string_view name);

// A variable's text as a number: the whole text a finite decimal or scientific double ("2.5",
// "1e3"; no sign but '-', no spaces), else nullopt.
std::optional<double> parse_finite_number(std::string_view text);
// A variable's text as an unsigned decimal integer (the whole text digits only, in range), else
// nullopt.
std::optional<std::uint64_t> parse_unsigned_integer(std::string_view text);

}  // namespace gradzip::kernels
