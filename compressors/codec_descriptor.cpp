// The compressors layer's codec rows (compressors/codec_descriptor.h).
#include "compressors/codec_descriptor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

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

// The cosine estimates (CodecDescriptor::cosine_estimate), from each codec's definition. They
// read y only. Sums are in f64.
double squared_norm(std::span<const float> y) {
  double sum = 0;
  for (const float v : y) sum += static_cast<double>(v) * v;
  return sum;
}

// cos(y + e, y) >= sqrt(1 - d^2) whenever |e| <= d |y| with d < 1 (the sine of the angle is at
// most d).
double cosine_of_relative_error(double relative) {
  return relative < 1 ? std::sqrt(1 - relative * relative) : 0.0;
}

double exact_cosine(const CompressionSpec&, std::span<const float>) { return 1; }

// |err_i| <= 2^-11 |y_i| + 2^-25 (fp16_bound), so |err| <= 2^-11 |y| + 2^-25 sqrt(n).
double fp16_cosine(const CompressionSpec&, std::span<const float> y) {
  const double norm = std::sqrt(squared_norm(y));
  if (norm == 0) return 1;
  return cosine_of_relative_error(0x1p-11 + 0x1p-25 * std::sqrt(static_cast<double>(y.size())) /
                                                norm);
}

double bf16_cosine(const CompressionSpec&, std::span<const float>) {
  return cosine_of_relative_error(0x1p-8);
}

// Unbiased stochastic rounding, per bucket, to the levels -scale + j * spacing (bits = 1:
// spacing 2 scale from -scale) or +-q * spacing (spacing = scale / s): a value a fraction f of
// the way between two levels gets variance f (1 - f) spacing^2, and the rounding errors are
// uncorrelated with y, so E |D(E(y))|^2 = |y|^2 + variance and cos ~ 1 / sqrt(1 + variance/|y|^2).
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

double qsgd_cosine(const CompressionSpec& spec, std::span<const float> y) {
  return stochastic_levels_cosine(y, spec.bucket, spec.bits);
}

double terngrad_cosine(const CompressionSpec& spec, std::span<const float> y) {
  return stochastic_levels_cosine(y, spec.bucket, 2);  // qsgd's 2-bit levels
}

// Each bucket decodes to m sign(y), m = mean |y|: <D, y> = m sum |y| = d m^2 = |D|^2, so
// cos = |D| / |y| = sqrt(sum over buckets of d m^2) / |y|.
double sign_cosine(const CompressionSpec& spec, std::span<const float> y) {
  double energy = 0, kept = 0;
  for (std::size_t begin = 0; begin < y.size(); begin += spec.bucket) {
    const std::span<const float> part = y.subspan(begin, std::min(spec.bucket, y.size() - begin));
    double magnitude = 0;
    for (const float v : part) {
      magnitude += std::fabs(static_cast<double>(v));
      energy += static_cast<double>(v) * v;
    }
    kept += magnitude * magnitude / static_cast<double>(part.size());
  }
  return energy == 0 ? 1.0 : std::sqrt(kept / energy);
}

// Exact top-k keeps the k largest |y|: cos = sqrt(their share of |y|^2). approx=on keeps the
// exact top m for some m >= ceil(k/2) (compressors/topk.cpp), so the estimate uses ceil(k/2).
double topk_cosine(const CompressionSpec& spec, std::span<const float> y) {
  const double energy = squared_norm(y);
  if (energy == 0) return 1;
  std::size_t kept = std::min(spec.k_for(y.size()), y.size());
  if (spec.approx) kept = (kept + 1) / 2;
  std::vector<float> magnitudes(y.size());
  std::transform(y.begin(), y.end(), magnitudes.begin(), [](float v) { return std::fabs(v); });
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(kept),
                   magnitudes.end(), std::greater<>());
  double kept_energy = 0;
  for (std::size_t i = 0; i < kept; ++i)
    kept_energy += static_cast<double>(magnitudes[i]) * magnitudes[i];
  return std::sqrt(kept_energy / energy);
}

// k indices drawn without regard to the values keep k/n of |y|^2 on average.
double randk_cosine(const CompressionSpec& spec, std::span<const float> y) {
  if (y.empty()) return 1;
  const double kept = static_cast<double>(std::min(spec.k_for(y.size()), y.size()));
  return std::sqrt(kept / static_cast<double>(y.size()));
}

constexpr std::array<CodecDescriptor, 9> kDescriptors{{
    {CodecKind::none, "none", kNoKeys, false, WireCodec::none, make_none_codec, exact_bound,
     exact_cosine, {}},
    {CodecKind::fp16, "fp16", kNoKeys, false, WireCodec::fp16, make_fp16_codec, fp16_bound,
     fp16_cosine, {}},
    {CodecKind::bf16, "bf16", kNoKeys, false, WireCodec::bf16, make_bf16_codec, bf16_bound,
     bf16_cosine, {}},
    {CodecKind::qsgd, "qsgd", kQsgdKeys, false, WireCodec::qsgd, make_qsgd_codec, qsgd_bound,
     qsgd_cosine, {}},
    {CodecKind::sign, "sign", kSignKeys, true, WireCodec::sign, make_sign_codec, sign_bound,
     sign_cosine, {}},
    {CodecKind::topk, "topk", kTopkKeys, true, WireCodec::topk, make_topk_codec, sparse_bound,
     topk_cosine, {}},
    {CodecKind::randk, "randk", kRandkKeys, true, WireCodec::randk, make_randk_codec, sparse_bound,
     randk_cosine, {}},
    {CodecKind::powersgd, "powersgd", kPowersgdKeys, true, std::nullopt, nullptr, nullptr, nullptr,
     "powersgd compresses whole matrices inside the Reducer; it has no element codec"},
    {CodecKind::terngrad, "terngrad", kTerngradKeys, false, WireCodec::terngrad,
     make_terngrad_codec, terngrad_bound, terngrad_cosine, {}},
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
  return row < 0 ? nullptr : &kDescriptors[static_cast<std::size_t>(row)];
}

}  // namespace gradzip::compressors
