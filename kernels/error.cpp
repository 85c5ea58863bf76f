#include "gradzip/error.h"

#include <cstring>

#include "gradzip/version.h"

namespace gradzip {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::invalid_spec: return "invalid_spec";
    case ErrorCode::malformed_message: return "malformed_message";
    case ErrorCode::size_mismatch: return "size_mismatch";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::internal: return "internal";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::nonfinite: return "nonfinite";
  }
  return "unknown";
}

const char* version() noexcept { return "0.1.0"; }

namespace detail {

void throw_error(ErrorCode code, const char* file, int line, const std::string& message) {
  // Keep the path short: from the project's top-level folder on.
  const char* short_file = file;
  for (const char* folder : {"compressors/", "kernels/", "error_feedback/", "collectives/",
                             "pipeline/", "python/", "benchmarks/", "examples/", "tests/"}) {
    if (const char* found = std::strstr(file, folder)) {
      short_file = found;
      break;
    }
  }
  throw Error(code, concat("gradzip: ", message, " [", error_code_name(code), " at ", short_file,
                           ":", line, "]"));
}

}  // namespace detail
}  // namespace gradzip
