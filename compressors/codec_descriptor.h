// A codec's row: everything the library knows about a codec besides its identity (its name,
// CodecKind and codec byte, which gradzip/codec_list.h gives once): its spec keys and their
// rules, its error-feedback default, the factory of its host codec, the traits the collectives
// branch on, and the error oracles the tests and benchmarks build their bounds from.
//
// Each codec defines its row as `<name>_codec_row` (declared below from the list) in its folder
// (compressors/<codec>/; fp16 and bf16 share compressors/cast/). The table (codec_descriptors(),
// codec_descriptor.cpp) copies each row and fills in its identity from the list, so a row never
// spells its own name or codec byte. The spec parser (compression_spec.cpp), make_codec
// (registry.cpp), the wire format's codec names (wire_format.cpp), the collectives' codec table
// (collectives/codec_table.cpp) and the CUDA routing (cuda/device_codec.cpp) read the table; none
// of them switches over CodecKind.
// docs/architecture.md has the add-a-codec checklist.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string_view>

#include "compressors/spec_keys.h"
#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/codec_list.h"

namespace gradzip::compressors {

// Which collective paths run a codec (collectives/codec_table.cpp maps each family to its
// algorithms and to what algo=auto runs).
enum class CollectivePaths : std::uint8_t {
  dense,              // every element travels (none, the casts): the ring by default, any flat
                      // algorithm
  bucket_quantiser,   // a scale per bucket and low-bit codes (qsgd, sign, terngrad): SRA by
                      // default; the ring and halving/doubling re-encode partial sums
  top_selection,      // the k largest entries (top-k): the sparse all-reduce by default
  shared_selection,   // k entries at indices every rank draws from the shared seed (random-k):
                      // its shared-index path only
  whole_matrix,       // compresses matrices inside the Reducer (powersgd): no collective runs it
};

struct CodecDescriptor {
  // Identity, filled in by the table from gradzip/codec_list.h (a row leaves these unset): the
  // kind, the spec's codec name, and the codec byte of its messages (none for a codec without
  // messages of its own).
  CodecKind kind = CodecKind::none;
  std::string_view name{};
  std::optional<WireCodec> wire{};

  // Its own spec keys, in to_string()'s order (the shared keys follow them).
  std::span<const CodecKey> keys{};
  // Rules between keys and the canonical form, run after every key is parsed: throws
  // ErrorCode::invalid_spec naming `text`; `given` holds the keys the string named. Null: none.
  void (*check_spec)(CompressionSpec& spec, std::string_view text,
                     const std::set<std::string_view>& given) = nullptr;
  bool error_feedback_default = false;     // ef= when the spec does not say
  // An element codec: its host codec's factory (make_codec adds the CUDA routing). A codec that
  // compresses whole matrices inside the Reducer (powersgd) has none, and `why_no_element_codec`
  // is make_codec's error text.
  std::unique_ptr<Codec> (*make_host)(const CompressionSpec& spec) = nullptr;
  std::string_view why_no_element_codec{};

  // Specs that between them cover the layouts its keys give its messages (every bucket / bits /
  // values / approx shape that changes the bytes): what the codec conformance suite, the fuzz
  // targets and their seed corpus, and the device tests sweep, in this order after the rows
  // before it (tests/fuzz/fuzz_specs.h; the seed corpus is indexed by that order, so a row's
  // list only grows at its end, and only the last codec's without rewriting the corpus). Empty
  // for a codec without an element codec.
  std::span<const std::string_view> example_specs{};

  // What the collectives read (collectives/codec_table.h).
  CollectivePaths paths = CollectivePaths::dense;
  // The 16-bit type its wire values narrow to (f32: none): fp16 and bf16 always; with
  // `values_key`, the values= key decides (top-k, random-k). The wire-range check guards
  // against saturation.
  DType wire_values = DType::f32;
  bool values_key = false;
  // Messages differ in size between ranks for the same count with approx=on (top-k).
  bool size_varies_with_approx = false;
  // Where a pipelined algorithm may cut a chunk of `spec` into segments
  // (collectives/segment_plan.h) so that the segments' messages carry, headers aside, exactly
  // the bytes of the chunk's one message and decode to the same values: every boundary a
  // multiple of the returned element count from the chunk's start. Null, or 0 returned: never
  // (an encode that looks at the whole chunk, as top-k's and random-k's selections do). The
  // common rules are below (segments_anywhere, segments_on_bit_code_buckets, ...).
  std::size_t (*segment_granularity)(const CompressionSpec& spec) noexcept = nullptr;

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
};

// Segment rules (CodecDescriptor::segment_granularity) that several codecs share. A bucket
// larger than the parser's bound (2^31, only set in code) is never cut: the lcm could overflow.
// Element by element (none and the casts): any boundary.
std::size_t segments_anywhere(const CompressionSpec& spec) noexcept;
// One scale per bucket and codes of at most 8 bits, bit-packed (qsgd, sign): whole buckets that
// end on a whole byte, lcm(bucket, 8) elements.
std::size_t segments_on_bit_code_buckets(const CompressionSpec& spec) noexcept;
// One scale per bucket and five ternary codes a byte (terngrad): lcm(bucket, 5) elements.
std::size_t segments_on_trit_code_buckets(const CompressionSpec& spec) noexcept;

// cos(y + e, y) >= sqrt(1 - d^2) whenever |e| <= d |y| with d < 1 (the sine of the angle is at
// most d); 0 for d >= 1. What the cosine estimates of codecs with a relative error bound use.
double cosine_of_relative_error(double relative) noexcept;

// The cosine estimate of unbiased stochastic rounding, per bucket of `bucket` elements, to the
// levels -scale + j * spacing (bits = 1: spacing 2 scale from -scale) or +-q * spacing
// (spacing = scale / s, s = 2^(bits - 1) - 1), scale = the bucket's max |y| (qsgd; terngrad is
// qsgd's 2-bit levels): a value a fraction f of the way between two levels gets variance
// f (1 - f) spacing^2, and the rounding errors are uncorrelated with y, so
// E |D(E(y))|^2 = |y|^2 + variance and cos ~ 1 / sqrt(1 + variance / |y|^2). 1 for an all-zero y.
double stochastic_levels_cosine(std::span<const float> y, std::size_t bucket, int bits);

// sum of y_i^2, in f64: what the cosine estimates of the casts and of top-k start from.
double squared_norm(std::span<const float> y) noexcept;

// The error bound of the selection codecs (top-k, random-k): a dropped element errs by
// |y| <= y_max, a kept one by 0 (f32 values) or by the f16 rounding (values=fp16, < y_max).
double selection_bound(const CompressionSpec& spec, double y_max) noexcept;

// f32's unit roundoff 2^-24: the relative error of one f32 rounding to nearest.
inline constexpr double kF32UnitRoundoff = 0x1p-24;

// The per-element error bound of the same levels (qsgd; terngrad is bits = 2), for inputs with
// |y| <= y_max: stochastic rounding lands on a neighbouring level, |err| <= scale / s (bits = 1:
// the levels are -scale and +scale, |err| <= 2 scale), plus the f32 rounding of q * scale / s
// (4 units of f32's roundoff).
double stochastic_levels_bound(int bits, double y_max) noexcept;

// Each codec's row, defined where the codec lives (see above).
#define GRADZIP_DECLARE_CODEC_ROW(name, wire_id) extern const CodecDescriptor name##_codec_row;
GRADZIP_CODECS(GRADZIP_DECLARE_CODEC_ROW)
#undef GRADZIP_DECLARE_CODEC_ROW

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

// Every row, in CodecKind order (the spec grammar's order), identities filled in.
std::span<const CodecDescriptor> codec_descriptors() noexcept;

// The row of `kind`; throws ErrorCode::internal for a value without one.
const CodecDescriptor& codec_descriptor(CodecKind kind);

// The row named `name`, or null.
const CodecDescriptor* find_codec_descriptor(std::string_view name) noexcept;

// The row whose messages carry the codec byte `wire_id`, or null (an unknown id on the wire).
const CodecDescriptor* find_wire_descriptor(std::uint8_t wire_id) noexcept;

}  // namespace gradzip::compressors
