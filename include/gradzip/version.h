#pragma once

#define GRADZIP_VERSION_MAJOR 0
#define GRADZIP_VERSION_MINOR 1
#define GRADZIP_VERSION_PATCH 0

namespace gradzip {
// The library's version string, e.g. "0.1.0".
const char* version() noexcept;
}  // namespace gradzip
