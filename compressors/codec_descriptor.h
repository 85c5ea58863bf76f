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

#include <cstddef>
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
  // An estimate of cos(D(E(y)), y) for one encode and decode of y, computed from y alone (never
  // from the codec's output, so that a broken codec cannot lower its own floor): exact for sign
  // (its decode projects each bucket onto its sign vector) and exact top-k (the kept share of
  // |y|^2), a lower bound for the casts, the expectation for the stochastic codecs (qsgd and
  // terngrad add at most spacing^2 / 4 of variance per element; randk keeps k/n of |y|^2 on
  // average). 1 for an all-zero y. What the benchmarks' and tests' cosine floors
  // (allreduce_cosine_floor) are built from. Null for a codec without an element codec.
  double (*cosine_estimate)(const CompressionSpec& spec, std::span<const float> y) = nullptr;
  std::string_view why_no_element_codec;
};

// The least cosine similarity with the exact sum that a compressed all-reduce may show, given
// `single_cosine` (the smallest cosine_estimate of the ranks' inputs) and `compressions` (how many
// encodes the algorithm applies on an element's way to the result: P for the ring, 2 for SRA,
// 1 for the sparse all-reduce, random-k's and the tree): 0.5 c^2 / sqrt(S). Why: S uncorrelated
// errors, each (1 - c^2) / c^2 of the energy of the exact partial sum a stage compresses (never
// more than the whole sum's), leave cos >= 1 / sqrt(1 + S (1 - c^2) / c^2) >= c / sqrt(S); but a
// stage compresses what earlier stages delivered, their errors included, and for SRA's two
// stages that compounds to exactly c^2 (the owner's input has 1 / c^2 of the sum's energy). The
// floor takes c^2 / sqrt(S) for both effects and half of it for sampling noise and the biased
// codecs' correlated errors; measured cosines stay at least 2x above it (2.0 where c ~ 1 and
// one compression: casts, 4- and 8-bit qsgd on the tree; 2.5x or more for sign, top-k, random-k
// and 1- and 2-bit qsgd) over every codec, algorithm and 2 to 12 ranks (docs/results.md). It is
// a sanity floor, not a tight bound: it rejects an all-zero result (cosine 0) and a negated one
// (-1) whenever c > 0. Valid from kCosineMinElementsPerRank elements per rank (n / P) up: the
// algorithms' messages hold at least n / P elements, and over fewer a 1% sparse codec keeps too
// few entries per message for the cosine to be held to a floor (random-k at 1,025 elements over
// 5 ranks by halving/doubling, 3 entries a message, fell below).
double allreduce_cosine_floor(double single_cosine, int compressions) noexcept;
inline constexpr std::size_t kCosineMinElementsPerRank = 1024;

// cos(actual, exact) in f64 over spans of equal length (a longer one's tail is ignored): what
// allreduce_cosine_floor is compared against. A zero vector has no direction: 1 when both are
// zero, 0 when only one is (so an all-zero result fails any floor above 0).
double cosine_similarity(std::span<const float> actual, std::span<const double> exact) noexcept;

// Every row, in CodecKind order (the spec grammar's order).
std::span<const CodecDescriptor> codec_descriptors() noexcept;

// The row of `kind`; throws ErrorCode::internal for a value without one.
const CodecDescriptor& codec_descriptor(CodecKind kind);

// The row named `name`, or null.
const CodecDescriptor* find_codec_descriptor(std::string_view name) noexcept;

// The row whose messages carry the codec byte `wire_id`, or null (an unknown id on the wire).
const CodecDescriptor* find_wire_descriptor(std::uint8_t wire_id) noexcept;

}  // namespace gradzip::compressors
