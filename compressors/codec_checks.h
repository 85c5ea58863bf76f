// Argument checks every codec runs before touching memory.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "gradzip/error.h"
#include "gradzip/tensor_view.h"

namespace gradzip::compressors {

inline void require_host(const ConstTensorView& view, std::string_view op) {
  GZ_REQUIRE(view.device.kind == DeviceKind::cpu, ErrorCode::unsupported, op,
             ": the tensor is on a CUDA device; this codec object takes host memory (the codecs "
             "make_codec() returns take CUDA tensors too)");
  GZ_REQUIRE(view.data != nullptr || view.count == 0, ErrorCode::invalid_argument, op,
             ": null data pointer for ", view.count, " elements");
}

inline void require_accumulator(const float* acc, std::size_t count, std::string_view op) {
  GZ_REQUIRE(acc != nullptr || count == 0, ErrorCode::invalid_argument, op,
             ": null accumulator for ", count, " elements");
}

inline void require_capacity(std::span<const std::byte> out, std::size_t needed,
                             std::string_view op) {
  GZ_REQUIRE(out.size() >= needed, ErrorCode::invalid_argument, op, ": output buffer holds ",
             out.size(), " bytes, ", needed, " needed (max_encoded_bytes)");
}

}  // namespace gradzip::compressors
