// The collectives' codec table (collectives/codec_table.h).
#include "collectives/codec_table.h"

#include <algorithm>
#include <array>
#include <numeric>
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

// A row with its paths; the traits are set by the caller.
CodecRow paths(CodecKind codec, A default_path, std::span<const A> runnable,
               std::span<const A> auto_choices) {
  CodecRow row;
  row.codec = codec;
  row.default_path = default_path;
  row.runnable = runnable;
  row.auto_choices = auto_choices;
  return row;
}

// Indexed by CodecKind, one row per codec of compressors/codec_descriptor.cpp. A codec given no
// row below is a build mistake: the first lookup names it and aborts, rather than letting it
// run as `none`'s row (tests/unit/test_codec_table.cpp checks every row's content).
std::vector<CodecRow> make_table() {
  const std::size_t codecs = compressors::codec_descriptors().size();
  std::vector<CodecRow> table(codecs);
  std::vector<bool> given(codecs, false);
  const auto set = [&table, &given](CodecRow row) {
    const auto index = static_cast<std::size_t>(row.codec);
    table[index] = row;
    given[index] = true;
  };
  for (const CodecKind codec : {CodecKind::none, CodecKind::fp16, CodecKind::bf16, CodecKind::powersgd}) {
    CodecRow row = paths(codec, A::ring, kDenseRunnable, kDenseRunnable);
    row.wire_values = codec == CodecKind::fp16 ? DType::f16 : codec == CodecKind::bf16 ? DType::bf16 : DType::f32;
    // PowerSGD runs in the Reducer; its row says so and otherwise reads like the uncompressed
    // one, which is what its dense parameters use.
    row.element_codec = codec != CodecKind::powersgd;
    row.segment_cut = row.element_codec ? SegmentCut::any_element : SegmentCut::never;
    set(row);
  }
  for (const CodecKind codec : {CodecKind::qsgd, CodecKind::sign, CodecKind::terngrad}) {
    CodecRow row = paths(codec, A::sra, kQuantisedRunnable, kQuantisedAuto);
    row.segment_cut = codec == CodecKind::terngrad ? SegmentCut::buckets_of_trit_codes
                                                   : SegmentCut::buckets_of_bit_codes;
    set(row);
  }

  CodecRow topk = paths(CodecKind::topk, A::sparse, kTopkRunnable, kTopkAuto);
  topk.values_key = true;
  topk.size_varies_with_approx = true;
  set(topk);

  CodecRow randk = paths(CodecKind::randk, A::randk, kRandkPaths, kRandkPaths);
  randk.shared_indices = true;
  randk.values_key = true;
  set(randk);
  for (std::size_t index = 0; index < codecs; ++index) {
    if (given[index]) continue;
    std::fprintf(stderr,
                 "gradzip internal error: codec '%.*s' has no row in collectives/codec_table.cpp\n",
                 static_cast<int>(compressors::codec_descriptors()[index].name.size()),
                 compressors::codec_descriptors()[index].name.data());
    std::abort();
  }
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
  const CodecRow& row = codec_row(spec.codec);
  if (row.values_key) return spec.values == DType::f16 ? DType::f16 : DType::f32;
  return row.wire_values;
}

std::size_t segment_granularity(const CompressionSpec& spec) noexcept {
  // The parser bounds bucket by 2^31; a larger one set in code is never cut (the lcm could
  // overflow).
  constexpr std::size_t kLargestCutBucket = std::size_t{1} << 31;
  const std::size_t bucket = std::max<std::size_t>(spec.bucket, 1);
  switch (codec_row(spec.codec).segment_cut) {
    case SegmentCut::never: return 0;
    case SegmentCut::any_element: return 1;
    case SegmentCut::buckets_of_bit_codes:
      // Codes of at most 8 bits: 8 elements end on a byte boundary whatever the width.
      return bucket > kLargestCutBucket ? 0 : std::lcm(bucket, std::size_t{8});
    case SegmentCut::buckets_of_trit_codes:
      return bucket > kLargestCutBucket ? 0 : std::lcm(bucket, std::size_t{5});
  }
  return 0;
}

bool message_size_varies(const CompressionSpec& spec) noexcept {
  return codec_row(spec.codec).size_varies_with_approx && spec.approx;
}

}  // namespace gradzip::collectives
