// The rows of the codecs that have no folder of their own (compressors/codec_descriptor.h):
// their spec keys, rules, factories, collective traits and error oracles.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compressors/codec_descriptor.h"
#include "compressors/registry.h"
#include "gradzip/error.h"

namespace gradzip::compressors {
namespace {

// The error bounds (CodecDescriptor::error_bound), from each codec's definition:
//   none        exact
//   fp16        round to nearest even: 2^-11 |y| for normal results, 2^-25 absolute below
//   bf16        2^-8 |y|
//   topk        selection_bound (codec_descriptor.h)
double exact_bound(const CompressionSpec&, double) { return 0; }
double fp16_bound(const CompressionSpec&, double y_max) { return 0x1p-11 * y_max + 0x1p-25; }
double bf16_bound(const CompressionSpec&, double y_max) { return 0x1p-8 * y_max; }

// The cosine estimates (CodecDescriptor::cosine_estimate), from each codec's definition. They
// read y only. Sums are in f64.
double squared_norm(std::span<const float> y) {
  double sum = 0;
  for (const float v : y) sum += static_cast<double>(v) * v;
  return sum;
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

// ---- keys --------------------------------------------------------------------------------------

constexpr CodecKey kApproxKey{
    "approx",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.approx = parse_spec_choice<bool>(text, "approx", value, {{"on", true}, {"off", false}});
    },
    [](const CompressionSpec& spec) {
      return std::string(spec.approx ? "approx=on" : "approx=off");
    }};
constexpr CodecKey kRankKey{
    "rank",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.rank = static_cast<int>(parse_spec_unsigned(text, "rank", value, 1, 1024));
    },
    [](const CompressionSpec& spec) { return detail::concat("rank=", spec.rank); }};

constexpr std::array<CodecKey, 5> kTopkKeys{kRatioKey, kCountKey, kApproxKey, kValuesKey, kRampKey};
constexpr std::array<CodecKey, 1> kPowersgdKeys{kRankKey};

// The rows' example specs (CodecDescriptor::example_specs).
constexpr std::array<std::string_view, 1> kNoneExamples{"none"};
constexpr std::array<std::string_view, 1> kFp16Examples{"fp16"};
constexpr std::array<std::string_view, 1> kBf16Examples{"bf16"};
constexpr std::array<std::string_view, 5> kTopkExamples{
    "topk:ratio=0.1", "topk:k=1", "topk:ratio=0.5,approx=on", "topk:ratio=0.1,values=fp16",
    "topk:ratio=0.3,approx=on,values=fp16"};

}  // namespace

// ---- rows --------------------------------------------------------------------------------------

constinit const CodecDescriptor none_codec_row{
    .make_host = make_none_codec,
    .example_specs = kNoneExamples,
    .paths = CollectivePaths::dense,
    .segment_granularity = segments_anywhere,
    .error_bound = exact_bound,
    .cosine_estimate = exact_cosine,
};
constinit const CodecDescriptor fp16_codec_row{
    .make_host = make_fp16_codec,
    .example_specs = kFp16Examples,
    .paths = CollectivePaths::dense,
    .wire_values = DType::f16,
    .segment_granularity = segments_anywhere,
    .error_bound = fp16_bound,
    .cosine_estimate = fp16_cosine,
};
constinit const CodecDescriptor bf16_codec_row{
    .make_host = make_bf16_codec,
    .example_specs = kBf16Examples,
    .paths = CollectivePaths::dense,
    .wire_values = DType::bf16,
    .segment_granularity = segments_anywhere,
    .error_bound = bf16_bound,
    .cosine_estimate = bf16_cosine,
};
constinit const CodecDescriptor topk_codec_row{
    .keys = kTopkKeys,
    .check_spec = check_selection_spec,
    .error_feedback_default = true,
    .make_host = make_topk_codec,
    .example_specs = kTopkExamples,
    .paths = CollectivePaths::top_selection,
    .values_key = true,
    .size_varies_with_approx = true,
    .error_bound = selection_bound,
    .cosine_estimate = topk_cosine,
};
constinit const CodecDescriptor powersgd_codec_row{
    .keys = kPowersgdKeys,
    .error_feedback_default = true,
    .why_no_element_codec =
        "powersgd compresses whole matrices inside the Reducer; it has no element codec",
    .paths = CollectivePaths::whole_matrix,
};

}  // namespace gradzip::compressors
