// How the collectives run each codec: one row per codec (codec_table.cpp), built from the
// codec's compressors row (its family of paths and traits, compressors/codec_descriptor.h): the
// one place that says which algorithm algo=auto runs for it, which algorithms can run it, what
// it carries on the wire, and the traits algorithms branch on. Nothing else in collectives/
// switches over CodecKind for these facts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "collectives/cost_model.h"
#include "compressors/codec_descriptor.h"
#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

struct CodecRow {
  CodecKind codec = CodecKind::none;
  // What algo=auto runs without the cost model, and the model's fallback: the ring, SRA, the
  // sparse all-reduce, or random-k's shared-index path (randk_allreduce).
  AlgorithmId default_path = AlgorithmId::ring;
  // Every flat path that can run the codec, the default first (the cost model's
  // candidate_algorithms; `gradzip-bench model` compares them).
  std::span<const AlgorithmId> runnable;
  // The paths algo=auto may choose among with the model, the default first: those that compress
  // each element no more often than the default does, so that the choice changes the speed but
  // never makes the result less accurate. The ring re-encodes partial sums P - 1 times and
  // halving/doubling log2 P times, which is why neither is offered for the quantisers (qsgd,
  // sign, terngrad) or top-k.
  std::span<const AlgorithmId> auto_choices;
  // Random-k: every rank draws the same indices from the shared seed, so its messages add up
  // index by index (its own path; its encodes keep the shared seed instead of a per-rank one).
  bool shared_indices = false;
  // False for powersgd, which compresses whole matrices in the Reducer, never in a collective.
  bool element_codec = true;
  // The codec's compressors row, whose traits (wire values, varying sizes, segment rule) the
  // functions below read.
  const compressors::CodecDescriptor* descriptor = nullptr;
};

// The codec's row (every CodecKind has one).
const CodecRow& codec_row(CodecKind codec) noexcept;

// What run_flat_allreduce runs for algo=auto with `codec` and no model, as an Algorithm (random-k:
// its shared-index path has none; Algorithm::ring is returned and shared_indices says the rest).
Algorithm default_flat_algorithm(CodecKind codec) noexcept;

// The stats name of the codec's default path ("ring", "sra", "sparse" or "randk").
std::string_view default_path_name(CodecKind codec) noexcept;

// The 16-bit type `spec`'s wire values narrow to, or f32 when they do not narrow.
DType wire_value_type(const CompressionSpec& spec) noexcept;

// The element count every segment boundary of `spec`'s chunks must be a multiple of (from the
// chunk's start), or 0 when its chunks may not be cut (the row's segment_granularity).
std::size_t segment_granularity(const CompressionSpec& spec) noexcept;

// Whether two ranks' messages for the same count may differ in size (a receiver cannot post
// the exact size in advance).
bool message_size_varies(const CompressionSpec& spec) noexcept;

}  // namespace gradzip::collectives
