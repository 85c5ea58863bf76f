// PowerSGD's row (compressors/codec_descriptor.h): its spec key and collective family. It has
// no element codec: the Reducer compresses whole matrices (pipeline/powersgd.cpp), so the row
// names no factory and says why.
#include <array>
#include <string>
#include <string_view>

#include "compressors/codec_descriptor.h"
#include "compressors/spec_keys.h"

namespace gradzip::compressors {
namespace {

constexpr CodecKey kRankKey{
    "rank",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.rank = static_cast<int>(parse_spec_unsigned(text, "rank", value, 1, 1024));
    },
    [](const CompressionSpec& spec) { return detail::concat("rank=", spec.rank); }};

constexpr std::array<CodecKey, 1> kPowersgdKeys{kRankKey};

}  // namespace

// Biased (low rank): error feedback on by default; the whole-matrix path.
constinit const CodecDescriptor powersgd_codec_row{
    .keys = kPowersgdKeys,
    .error_feedback_default = true,
    .why_no_element_codec =
        "powersgd compresses whole matrices inside the Reducer; it has no element codec",
    .paths = CollectivePaths::whole_matrix,
};

}  // namespace gradzip::compressors
