// The collectives' codec table (collectives/codec_table.h).
#include "collectives/codec_table.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "collectives/algorithm_table.h"
#include "compressors/codec_descriptor.h"

namespace gradzip::collectives {
namespace {

using A = AlgorithmId;

constexpr std::array kDenseRunnable{A::ring, A::sra, A::rhd, A::tree};
constexpr std::array kQuantisedRunnable{A::sra, A::ring, A::rhd, A::tree};
constexpr std::array kQuantisedAuto{A::sra, A::tree};
constexpr std::array kTopkRunnable{A::sparse, A::ring, A::rhd, A::tree};
constexpr std::array kTopkAuto{A::sparse, A::tree};
constexpr std::array kRandkPaths{A::randk};

// A codec's row: its paths from its family, its traits from its compressors row.
CodecRow row_of(const compressors::CodecDescriptor& codec) {
  CodecRow row;
  row.codec = codec.kind;
  switch (codec.paths) {
    case compressors::CollectivePaths::dense:
    case compressors::CollectivePaths::whole_matrix:
      // PowerSGD runs in the Reducer; its row says so and otherwise reads like the uncompressed
      // one, which is what its dense parameters use.
      row.default_path = A::ring;
      row.runnable = kDenseRunnable;
      row.auto_choices = kDenseRunnable;
      break;
    case compressors::CollectivePaths::bucket_quantiser:
      row.default_path = A::sra;
      row.runnable = kQuantisedRunnable;
      row.auto_choices = kQuantisedAuto;
      break;
    case compressors::CollectivePaths::top_selection:
      row.default_path = A::sparse;
      row.runnable = kTopkRunnable;
      row.auto_choices = kTopkAuto;
      break;
    case compressors::CollectivePaths::shared_selection:
      row.default_path = A::randk;
      row.runnable = kRandkPaths;
      row.auto_choices = kRandkPaths;
      row.shared_indices = true;
      break;
  }
  row.element_codec = codec.paths != compressors::CollectivePaths::whole_matrix;
  row.descriptor = &codec;
  return row;
}

// Indexed by CodecKind, one row per codec of compressors/codec_descriptor.h.
std::vector<CodecRow> make_table() {
  std::vector<CodecRow> table;
  for (const compressors::CodecDescriptor& codec : compressors::codec_descriptors())
    table.push_back(row_of(codec));
  return table;
}

}  // namespace

const CodecRow& codec_row(CodecKind codec) noexcept {
  static const std::vector<CodecRow> table = make_table();
  const auto index = static_cast<std::size_t>(codec);
  if (index >= table.size()) {  // only a value cast from outside the enum gets here
    std::fprintf(stderr, "gradzip internal error: codec kind %zu is not a CodecKind\n", index);
    std::abort();
  }
  return table[index];
}

Algorithm default_flat_algorithm(CodecKind codec) noexcept {
  // The path's algo= value; random-k's shared-index path has none (its callers test
  // shared_indices first).
  return algorithm_row(codec_row(codec).default_path).spec_value.value_or(Algorithm::ring);
}

std::string_view default_path_name(CodecKind codec) noexcept {
  return algorithm_id_name(codec_row(codec).default_path);
}

DType wire_value_type(const CompressionSpec& spec) noexcept {
  const compressors::CodecDescriptor& codec = *codec_row(spec.codec).descriptor;
  if (codec.values_key) return spec.values == DType::f16 ? DType::f16 : DType::f32;
  return codec.wire_values;
}

std::size_t segment_granularity(const CompressionSpec& spec) noexcept {
  const compressors::CodecDescriptor& codec = *codec_row(spec.codec).descriptor;
  return codec.segment_granularity == nullptr ? 0 : codec.segment_granularity(spec);
}

bool message_size_varies(const CompressionSpec& spec) noexcept {
  return codec_row(spec.codec).descriptor->size_varies_with_approx && spec.approx;
}

}  // namespace gradzip::collectives
