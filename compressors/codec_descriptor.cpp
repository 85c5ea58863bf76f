// The codec table (compressors/codec_descriptor.h): every codec's row, in the order of
// gradzip/codec_list.h, with the identity the list gives it.
#include "compressors/codec_descriptor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>

#include "gradzip/error.h"

namespace gradzip::compressors {
namespace {

#define GRADZIP_COUNT_CODEC(name, wire_id) +1
constexpr std::size_t kCodecCount = 0 GRADZIP_CODECS(GRADZIP_COUNT_CODEC);
#undef GRADZIP_COUNT_CODEC

// Each codec's codec byte, in list order (0: none).
#define GRADZIP_WIRE_ID(name, wire_id) std::uint8_t{wire_id},
constexpr std::array<std::uint8_t, kCodecCount> kWireIds{GRADZIP_CODECS(GRADZIP_WIRE_ID)};
#undef GRADZIP_WIRE_ID

constexpr bool wire_ids_unique() {
  for (std::size_t i = 0; i < kCodecCount; ++i)
    for (std::size_t j = i + 1; j < kCodecCount; ++j)
      if (kWireIds[i] != 0 && kWireIds[i] == kWireIds[j]) return false;
  return true;
}
static_assert(wire_ids_unique(), "gradzip/codec_list.h: two codecs share a codec byte");

// The row of each codec byte (-1: no codec sends it), built at compile time from the list, so
// that a message's codec byte costs one load (read_header runs this for every message).
constexpr std::array<std::int8_t, 256> kRowOfWireId = [] {
  std::array<std::int8_t, 256> row_of{};
  row_of.fill(-1);
  for (std::size_t i = 0; i < kCodecCount; ++i)
    if (kWireIds[i] != 0) row_of[kWireIds[i]] = static_cast<std::int8_t>(i);
  return row_of;
}();

struct CodecTable {
  std::array<CodecDescriptor, kCodecCount> rows;
};

// The rows copied from their definitions with the list's identity filled in. Built on first
// use (the rows are constant-initialised, so any static initialiser may ask).
const CodecTable& table() {
  static const CodecTable built = [] {
    CodecTable result;
    std::size_t i = 0;
#define GRADZIP_FILL_ROW(codec, wire_id)                                            \
    result.rows[i] = codec##_codec_row;                                            \
    result.rows[i].kind = CodecKind::codec;                                        \
    result.rows[i].name = #codec;                                                  \
    result.rows[i].wire = wire_id == 0 ? std::nullopt                              \
                                       : std::optional<WireCodec>(WireCodec::codec); \
    ++i;
    GRADZIP_CODECS(GRADZIP_FILL_ROW)
#undef GRADZIP_FILL_ROW
    return result;
  }();
  return built;
}

}  // namespace

std::span<const CodecDescriptor> codec_descriptors() noexcept { return table().rows; }

const CodecDescriptor& codec_descriptor(CodecKind kind) {
  const auto index = static_cast<std::size_t>(kind);
  GZ_REQUIRE(index < table().rows.size(), ErrorCode::internal, "codec kind ", index,
             " has no row (gradzip/codec_list.h lists every codec)");
  return table().rows[index];
}

const CodecDescriptor* find_codec_descriptor(std::string_view name) noexcept {
  for (const CodecDescriptor& row : table().rows)
    if (row.name == name) return &row;
  return nullptr;
}

namespace {

// The parser bounds bucket by 2^31; a larger one set in code is never cut (the lcm could
// overflow).
constexpr std::size_t kLargestCutBucket = std::size_t{1} << 31;

std::size_t whole_buckets_of(const CompressionSpec& spec, std::size_t codes_per_byte) noexcept {
  const std::size_t bucket = std::max<std::size_t>(spec.bucket, 1);
  return bucket > kLargestCutBucket ? 0 : std::lcm(bucket, codes_per_byte);
}

}  // namespace

std::size_t segments_anywhere(const CompressionSpec& /*spec*/) noexcept { return 1; }

std::size_t segments_on_bit_code_buckets(const CompressionSpec& spec) noexcept {
  // Codes of at most 8 bits: 8 elements end on a byte boundary whatever the width.
  return whole_buckets_of(spec, 8);
}

std::size_t segments_on_trit_code_buckets(const CompressionSpec& spec) noexcept {
  return whole_buckets_of(spec, 5);
}

double cosine_of_relative_error(double relative) noexcept {
  return relative < 1 ? std::sqrt(1 - relative * relative) : 0.0;
}

double stochastic_levels_cosine(std::span<const float> y, std::size_t bucket, int bits) {
  const double levels = bits == 1 ? 1.0 : static_cast<double>((1 << (bits - 1)) - 1);
  double energy = 0, variance = 0;
  for (std::size_t begin = 0; begin < y.size(); begin += bucket) {
    const std::span<const float> part = y.subspan(begin, std::min(bucket, y.size() - begin));
    double scale = 0;
    for (const float v : part) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    if (scale == 0) continue;
    const double spacing = bits == 1 ? 2 * scale : scale / levels;
    for (const float v : part) {
      const double position =
          bits == 1 ? (v + scale) / spacing : std::fabs(static_cast<double>(v)) / spacing;
      const double fraction = position - std::floor(position);
      energy += static_cast<double>(v) * v;
      variance += fraction * (1 - fraction) * spacing * spacing;
    }
  }
  return energy == 0 ? 1.0 : 1 / std::sqrt(1 + variance / energy);
}

double squared_norm(std::span<const float> y) noexcept {
  double sum = 0;
  for (const float v : y) sum += static_cast<double>(v) * v;
  return sum;
}

double selection_bound(const CompressionSpec&, double y_max) noexcept { return y_max; }

double stochastic_levels_bound(int bits, double y_max) noexcept {
  const double levels = bits == 1 ? 0.5 : static_cast<double>((1 << (bits - 1)) - 1);
  return y_max / levels + 4 * kF32UnitRoundoff * y_max;
}

double allreduce_cosine_floor(double single_cosine, int compressions) noexcept {
  return 0.5 * single_cosine * single_cosine /
         std::sqrt(static_cast<double>(std::max(compressions, 1)));
}

double cosine_similarity(std::span<const float> actual, std::span<const double> exact) noexcept {
  double dot = 0, actual_energy = 0, exact_energy = 0;
  for (std::size_t i = 0; i < actual.size() && i < exact.size(); ++i) {
    dot += static_cast<double>(actual[i]) * exact[i];
    actual_energy += static_cast<double>(actual[i]) * actual[i];
    exact_energy += exact[i] * exact[i];
  }
  if (actual_energy == 0 || exact_energy == 0) return actual_energy == exact_energy ? 1.0 : 0.0;
  return dot / std::sqrt(actual_energy * exact_energy);
}

const CodecDescriptor* find_wire_descriptor(std::uint8_t wire_id) noexcept {
  const int row = kRowOfWireId[wire_id];
  return row < 0 ? nullptr : &table().rows[static_cast<std::size_t>(row)];
}

}  // namespace gradzip::compressors
