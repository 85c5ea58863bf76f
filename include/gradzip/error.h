// gradzip's exception type. Every failure inside gradzip surfaces as a gradzip::Error
// whose message names the operation, the sizes involved and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradzip {

enum class ErrorCode {
  invalid_argument,   // a caller passed a bad size, pointer or option
  invalid_spec,       // a compression spec string could not be parsed
  malformed_message,  // an encoded buffer failed validation
  size_mismatch,      // a tensor changed size, or ranks disagree on a size
  io_error,           // a file could not be read or written
  unsupported,        // a valid request this build cannot serve
  internal,           // a broken invariant inside gradzip: a bug
  timeout,            // a blocking wait passed its deadline (CommunicatorOptions::timeout_seconds)
  nonfinite,          // non-finite input under nonfinite=error
};

const char* error_code_name(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {

template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

[[noreturn]] void throw_error(ErrorCode code, const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace gradzip

// Throws gradzip::Error with the message built from the remaining arguments and the call site.
#define GZ_THROW(code, ...) \
  ::gradzip::detail::throw_error((code), __FILE__, __LINE__, ::gradzip::detail::concat(__VA_ARGS__))

// Throws unless `cond` holds.
#define GZ_REQUIRE(cond, code, ...)   \
  do {                                \
    if (!(cond)) GZ_THROW(code, __VA_ARGS__); \
  } while (0)
