// The collectives' codec table (collectives/codec_table.h).
#include "collectives/codec_table.h"

#include <array>

namespace gradzip::collectives {
namespace {

using A = ModeledAlgorithm;

constexpr std::array kDenseRunnable{A::ring, A::sra, A::rhd, A::tree};
constexpr std::array kQuantisedRunnable{A::sra, A::ring, A::rhd, A::tree};
constexpr std::array kQuantisedAuto{A::sra, A::tree};
constexpr std::array kTopkRunnable{A::allgather, A::ring, A::rhd, A::tree};
constexpr std::array kTopkAuto{A::allgather, A::tree};
constexpr std::array kRandkPaths{A::randk};

CodecRow dense(CodecKind codec, DType wire_values) {
  CodecRow row;
  row.codec = codec;
  row.default_path = A::ring;
  row.runnable = kDenseRunnable;
  row.auto_choices = kDenseRunnable;
  row.wire_values = wire_values;
  return row;
}

CodecRow quantised(CodecKind codec) {
  CodecRow row;
  row.codec = codec;
  row.default_path = A::sra;
  row.runnable = kQuantisedRunnable;
  row.auto_choices = kQuantisedAuto;
  return row;
}

std::array<CodecRow, 8> make_table() {
  std::array<CodecRow, 8> table{};
  table[static_cast<std::size_t>(CodecKind::none)] = dense(CodecKind::none, DType::f32);
  table[static_cast<std::size_t>(CodecKind::fp16)] = dense(CodecKind::fp16, DType::f16);
  table[static_cast<std::size_t>(CodecKind::bf16)] = dense(CodecKind::bf16, DType::bf16);
  table[static_cast<std::size_t>(CodecKind::qsgd)] = quantised(CodecKind::qsgd);
  table[static_cast<std::size_t>(CodecKind::sign)] = quantised(CodecKind::sign);

  CodecRow& topk = table[static_cast<std::size_t>(CodecKind::topk)];
  topk.codec = CodecKind::topk;
  topk.default_path = A::allgather;
  topk.runnable = kTopkRunnable;
  topk.auto_choices = kTopkAuto;
  topk.values_key = true;
  topk.size_varies_with_approx = true;

  CodecRow& randk = table[static_cast<std::size_t>(CodecKind::randk)];
  randk.codec = CodecKind::randk;
  randk.default_path = A::randk;
  randk.runnable = kRandkPaths;
  randk.auto_choices = kRandkPaths;
  randk.shared_indices = true;
  randk.values_key = true;

  // PowerSGD runs in the Reducer; its row says so (element_codec) and otherwise reads like the
  // uncompressed one, which is what its dense parameters use.
  CodecRow& powersgd = table[static_cast<std::size_t>(CodecKind::powersgd)];
  powersgd = dense(CodecKind::powersgd, DType::f32);
  powersgd.element_codec = false;
  return table;
}

}  // namespace

const CodecRow& codec_row(CodecKind codec) noexcept {
  static const std::array<CodecRow, 8> table = make_table();
  const auto index = static_cast<std::size_t>(codec);
  return table[index < table.size() ? index : 0];
}

Algorithm default_flat_algorithm(CodecKind codec) noexcept {
  switch (codec_row(codec).default_path) {
    case A::sra: return Algorithm::sra;
    case A::allgather: return Algorithm::allgather;
    default: return Algorithm::ring;
  }
}

std::string_view default_path_name(CodecKind codec) noexcept {
  return modeled_algorithm_name(codec_row(codec).default_path);
}

DType wire_value_type(const CompressionSpec& spec) noexcept {
  const CodecRow& row = codec_row(spec.codec);
  if (row.values_key) return spec.values == DType::f16 ? DType::f16 : DType::f32;
  return row.wire_values;
}

bool message_size_varies(const CompressionSpec& spec) noexcept {
  return codec_row(spec.codec).size_varies_with_approx && spec.approx;
}

}  // namespace gradzip::collectives
