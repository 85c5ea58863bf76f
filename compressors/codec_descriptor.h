// The compressors layer's one row per codec (codec_descriptor.cpp): its spec name and keys, its
// error-feedback default, the codec byte of its messages and the factory of its host codec.
// The spec parser (compression_spec.cpp), make_codec (registry.cpp), the wire format's codec
// names (wire_format.cpp) and the CUDA routing (cuda/device_codec.cpp, whose rows are keyed by
// the codec byte) read it; none of them switches over CodecKind.
//
// The collectives keep a second row per codec (collectives/codec_table.cpp: the algorithms that
// run it and the traits they branch on), because compressors/ may not import collectives/.
// Adding a codec: its enum value (gradzip/compression_spec.h), its wire id (wire_format.h),
// one row here, one in collectives/codec_table.cpp and, with CUDA kernels, one in
// cuda/device_codec.cpp (docs/architecture.md has the checklist).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"

namespace gradzip::compressors {

struct CodecDescriptor {
  CodecKind kind = CodecKind::none;
  std::string_view name;                   // the spec's codec name, e.g. "qsgd"
  std::span<const std::string_view> keys;  // its own spec keys, in to_string()'s order
  bool error_feedback_default = false;     // ef= when the spec does not say
  // An element codec: the codec byte of its messages and its host codec's factory (make_codec
  // adds the CUDA routing). A codec that compresses whole matrices inside the Reducer
  // (powersgd) has neither, and `why_no_element_codec` is make_codec's error text.
  std::optional<WireCodec> wire;
  std::unique_ptr<Codec> (*make_host)(const CompressionSpec& spec) = nullptr;
  // The largest |D(E(y))_i - y_i| of one encode and decode of values with |y_j| <= y_max (for
  // bucket codecs: the values of y_i's bucket), f32 rounding included: what the benchmarks'
  // error bounds are built from. Null for a codec without an element codec.
  double (*error_bound)(const CompressionSpec& spec, double y_max) = nullptr;
  std::string_view why_no_element_codec;
};

// Every row, in CodecKind order (the spec grammar's order).
std::span<const CodecDescriptor> codec_descriptors() noexcept;

// The row of `kind`; throws ErrorCode::internal for a value without one.
const CodecDescriptor& codec_descriptor(CodecKind kind);

// The row named `name`, or null.
const CodecDescriptor* find_codec_descriptor(std::string_view name) noexcept;

// The row whose messages carry the codec byte `wire_id`, or null (an unknown id on the wire).
const CodecDescriptor* find_wire_descriptor(std::uint8_t wire_id) noexcept;

}  // namespace gradzip::compressors
