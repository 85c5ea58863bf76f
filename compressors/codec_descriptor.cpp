// The compressors layer's codec rows (compressors/codec_descriptor.h).
#include "compressors/codec_descriptor.h"

#include <array>
#include <cstddef>
#include <cstdint>

#include "compressors/registry.h"
#include "gradzip/error.h"

namespace gradzip::compressors {
namespace {

constexpr std::array<std::string_view, 0> kNoKeys{};
constexpr std::array<std::string_view, 2> kQsgdKeys{"bits", "bucket"};
constexpr std::array<std::string_view, 1> kSignKeys{"bucket"};
constexpr std::array<std::string_view, 5> kTopkKeys{"ratio", "k", "approx", "values", "ramp"};
constexpr std::array<std::string_view, 4> kRandkKeys{"ratio", "k", "values", "ramp"};
constexpr std::array<std::string_view, 1> kPowersgdKeys{"rank"};
constexpr std::array<std::string_view, 1> kTerngradKeys{"bucket"};

// Unit roundoff of f32: an add or a cast to f32 errs by at most this much of the result.
constexpr double kF32Unit = 0x1p-24;

// The error bounds (CodecDescriptor::error_bound), from each codec's definition:
//   none        exact
//   fp16        round to nearest even: 2^-11 |y| for normal results, 2^-25 absolute below
//   bf16        2^-8 |y|
//   qsgd:bits=b levels scale * q / s, s = 2^(b-1) - 1, scale = the bucket's max |y| <= y_max:
//               stochastic rounding lands on a neighbouring level, |err| <= scale / s (b = 1:
//               the levels are -scale and +scale, |err| <= 2 scale); plus the f32 rounding of
//               q * scale / s
//   terngrad    qsgd's 2-bit levels {-scale, 0, +scale}: |err| <= scale, plus f32 rounding
//   sign        decodes to +-mean|y| of the bucket: |err| <= |y| + mean <= 2 y_max
//   topk, randk a dropped element errs by |y| <= y_max, a kept one by 0 (f32 values) or by the
//               f16 rounding (values=fp16, < y_max)
double exact_bound(const CompressionSpec&, double) { return 0; }
double fp16_bound(const CompressionSpec&, double y_max) { return 0x1p-11 * y_max + 0x1p-25; }
double bf16_bound(const CompressionSpec&, double y_max) { return 0x1p-8 * y_max; }
double qsgd_bound(const CompressionSpec& spec, double y_max) {
  const double levels = spec.bits == 1 ? 0.5 : static_cast<double>((1 << (spec.bits - 1)) - 1);
  return y_max / levels + 4 * kF32Unit * y_max;
}
double terngrad_bound(const CompressionSpec&, double y_max) { return y_max + 4 * kF32Unit * y_max; }
double sign_bound(const CompressionSpec&, double y_max) { return 2 * y_max; }
double sparse_bound(const CompressionSpec&, double y_max) { return y_max; }

constexpr std::array<CodecDescriptor, 9> kDescriptors{{
    {CodecKind::none, "none", kNoKeys, false, WireCodec::none, make_none_codec, exact_bound, {}},
    {CodecKind::fp16, "fp16", kNoKeys, false, WireCodec::fp16, make_fp16_codec, fp16_bound, {}},
    {CodecKind::bf16, "bf16", kNoKeys, false, WireCodec::bf16, make_bf16_codec, bf16_bound, {}},
    {CodecKind::qsgd, "qsgd", kQsgdKeys, false, WireCodec::qsgd, make_qsgd_codec, qsgd_bound, {}},
    {CodecKind::sign, "sign", kSignKeys, true, WireCodec::sign, make_sign_codec, sign_bound, {}},
    {CodecKind::topk, "topk", kTopkKeys, true, WireCodec::topk, make_topk_codec, sparse_bound, {}},
    {CodecKind::randk, "randk", kRandkKeys, true, WireCodec::randk, make_randk_codec, sparse_bound,
     {}},
    {CodecKind::powersgd, "powersgd", kPowersgdKeys, true, std::nullopt, nullptr, nullptr,
     "powersgd compresses whole matrices inside the Reducer; it has no element codec"},
    {CodecKind::terngrad, "terngrad", kTerngradKeys, false, WireCodec::terngrad,
     make_terngrad_codec, terngrad_bound, {}},
}};

// Row i describes CodecKind i, so a kind indexes its row.
constexpr bool rows_in_kind_order() {
  for (std::size_t i = 0; i < kDescriptors.size(); ++i)
    if (static_cast<std::size_t>(kDescriptors[i].kind) != i) return false;
  return true;
}
static_assert(rows_in_kind_order(), "kDescriptors: row i must describe CodecKind i");

// The row of each codec byte (-1: no codec sends it), built at compile time, so that a message's
// codec byte costs one load (read_header runs this for every message).
constexpr std::array<std::int8_t, 256> kRowOfWireId = [] {
  std::array<std::int8_t, 256> row_of{};
  row_of.fill(-1);
  for (std::size_t i = 0; i < kDescriptors.size(); ++i) {
    if (!kDescriptors[i].wire) continue;
    row_of[static_cast<std::uint8_t>(*kDescriptors[i].wire)] = static_cast<std::int8_t>(i);
  }
  return row_of;
}();

}  // namespace

std::span<const CodecDescriptor> codec_descriptors() noexcept { return kDescriptors; }

const CodecDescriptor& codec_descriptor(CodecKind kind) {
  const auto index = static_cast<std::size_t>(kind);
  GZ_REQUIRE(index < kDescriptors.size(), ErrorCode::internal, "codec kind ", index,
             " has no row in compressors/codec_descriptor.cpp");
  return kDescriptors[index];
}

const CodecDescriptor* find_codec_descriptor(std::string_view name) noexcept {
  for (const CodecDescriptor& row : kDescriptors)
    if (row.name == name) return &row;
  return nullptr;
}

const CodecDescriptor* find_wire_descriptor(std::uint8_t wire_id) noexcept {
  const int row = kRowOfWireId[wire_id];
  return row < 0 ? nullptr : &kDescriptors[static_cast<std::size_t>(row)];
}

}  // namespace gradzip::compressors
