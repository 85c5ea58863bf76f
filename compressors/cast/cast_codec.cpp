// `fp16` and `bf16`: the chunk cast to a 16-bit float format, round to nearest even. One codec
// class serves both; they differ only in the format and its wire codec id.
//
// Message (header layout in wire_format.h):
//   header   codec = fp16 (2) | bf16 (3), flags = 0, small_param = 0, large_param = 0,
//            count = n, payload_bytes = 2n
//   payload  offset 2i, 2 bytes, i < n: element i as IEEE binary16 (fp16) or bfloat16 (bf16)
//            bits, little-endian, rounded to nearest even from the input element's f32 value
//
// Inputs: f32 is rounded once. An input already in the codec's format is copied bit for bit
// (f16 into fp16, bf16 into bf16). The other 16-bit format is widened exactly to f32 and then
// rounded (f16 -> f32 -> bf16 and bf16 -> f32 -> f16), through a stack block of
// kConvertBlock elements.
// Outputs: decode widens the payload exactly to f32; an f16/bf16 output gets those f32 values
// rounded to nearest even, except that an output of the codec's own format gets the payload
// bits copied. decode_add adds the exact f32 values into acc, one IEEE f32 add per element.
// Specials: +-inf stay +-inf; a finite f32 beyond the format's range (fp16: |x| >= 65520)
// becomes +-inf; a NaN stays a NaN of the same sign, quiet, its payload's top bits kept
// (kernels/cast_math.h). A signalling NaN copied bit for bit (same format in and out) stays
// signalling.
// additive(): the payloads of equal-length messages are elementwise 16-bit floats, so a
// reduction may sum them without parsing anything else.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/fused_feedback.h"
#include "compressors/wire_format.h"
#include "kernels/cpu/cast_cpu_simd.h"
#include "kernels/cpu/convert.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::compressors {
namespace {

// What differs between fp16 and bf16.
struct CastFormat {
  WireCodec wire;
  DType dtype;  // the 16-bit format of the payload
  void (*from_f32)(const float* in, std::byte* out16, std::size_t count) noexcept;
  void (*to_f32)(const std::byte* in16, float* out, std::size_t count) noexcept;
  void (*add_to_f32)(const std::byte* in16, float* acc, std::size_t count) noexcept;
};

constexpr CastFormat kFp16{WireCodec::fp16, DType::f16, kernels::cpu::f32_to_f16_bytes,
                           kernels::cpu::f16_bytes_to_f32, kernels::cpu::add_f16_bytes_to_f32};
constexpr CastFormat kBf16{WireCodec::bf16, DType::bf16, kernels::cpu::f32_to_bf16_bytes,
                           kernels::cpu::bf16_bytes_to_f32, kernels::cpu::add_bf16_bytes_to_f32};

constexpr std::size_t kBytesPerElement = 2;

class CastCodec final : public Codec, public FusedFeedbackEncoder {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  CastCodec(const CompressionSpec& spec, const CastFormat& format)
      : spec_(spec),
        format_(format),
        encode_op_(std::string(wire_codec_name(format.wire)) + ".encode"),
        decode_op_(std::string(wire_codec_name(format.wire)) + ".decode"),
        decode_add_op_(std::string(wire_codec_name(format.wire)) + ".decode_add") {}

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    GZ_REQUIRE(
        count <= (std::numeric_limits<std::size_t>::max() - kWireHeaderBytes) / kBytesPerElement,
        ErrorCode::invalid_argument, wire_codec_name(format_.wire), ".max_encoded_bytes: ", count,
        " elements do not fit a message size");
    return kWireHeaderBytes + count * kBytesPerElement;
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& /*ctx*/) const override {
    require_host(in, encode_op_);
    const std::size_t total = max_encoded_bytes(in.count);
    std::byte* payload = start_message(in.count, total, out);
    if (in.count == 0) return total;
    if (in.dtype == format_.dtype) {
      std::memcpy(payload, in.data, in.count * kBytesPerElement);
    } else if (in.dtype == DType::f32) {
      format_.from_f32(static_cast<const float*>(in.data), payload, in.count);
    } else {
      float block[kernels::cpu::kConvertBlock];
      for (std::size_t begin = 0; begin < in.count; begin += kernels::cpu::kConvertBlock) {
        const std::size_t n = std::min(kernels::cpu::kConvertBlock, in.count - begin);
        kernels::cpu::load_as_f32(in, begin, n, block);
        format_.from_f32(block, payload + begin * kBytesPerElement, n);
      }
    }
    return total;
  }

  // Error feedback in one pass (compressors/fused_feedback.h): per block of kConvertBlock
  // elements, g' = g + e into e, the same conversion encode() runs, its widening back, and
  // e = finite_or_zero(g' - widened), while the block is in L1.
  std::optional<std::size_t> encode_with_feedback(const float* g, float* e, std::size_t count,
                                                  std::span<std::byte> out,
                                                  const EncodeContext& /*ctx*/) const override {
    const std::size_t total = max_encoded_bytes(count);
    std::byte* payload = start_message(count, total, out);
    float widened[kernels::cpu::kConvertBlock];
    for (std::size_t begin = 0; begin < count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, count - begin);
      float* const corrected = e + begin;
      for (std::size_t i = 0; i < n; ++i) corrected[i] = g[begin + i] + corrected[i];
      format_.from_f32(corrected, payload + begin * kBytesPerElement, n);
      format_.to_f32(payload + begin * kBytesPerElement, widened, n);
      for (std::size_t i = 0; i < n; ++i)
        corrected[i] = kernels::finite_or_zero(corrected[i] - widened[i]);
    }
    return total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, decode_op_);
    const std::byte* payload = validated_payload(in, out.count, decode_op_);
    if (out.count == 0) return;
    if (out.dtype == DType::f32) {
      format_.to_f32(payload, static_cast<float*>(out.data), out.count);
    } else if (out.dtype == format_.dtype) {
      std::memcpy(out.data, payload, out.count * kBytesPerElement);
    } else {
      float block[kernels::cpu::kConvertBlock];
      for (std::size_t begin = 0; begin < out.count; begin += kernels::cpu::kConvertBlock) {
        const std::size_t n = std::min(kernels::cpu::kConvertBlock, out.count - begin);
        format_.to_f32(payload + begin * kBytesPerElement, block, n);
        kernels::cpu::store_from_f32(block, n, out, begin);
      }
    }
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, decode_add_op_);
    const std::byte* payload = validated_payload(in, count, decode_add_op_);
    format_.add_to_f32(payload, acc, count);
  }

  bool additive() const noexcept override { return true; }
  bool sparse() const noexcept override { return false; }

 private:
  // Checks that `out` holds the `total` bytes of a message of `count` elements, writes its
  // header and returns where the payload goes.
  std::byte* start_message(std::size_t count, std::size_t total, std::span<std::byte> out) const {
    require_capacity(out, total, encode_op_);
    write_header(WireHeader{format_.wire, 0, 0, count, count * kBytesPerElement, 0}, out);
    return out.data() + kWireHeaderBytes;
  }

  // Checks every header field of `in` for a message of `count` elements; returns its payload.
  const std::byte* validated_payload(std::span<const std::byte> in, std::size_t count,
                                     const std::string& op) const {
    const WireHeader header = read_header_for(in, format_.wire, count, op);
    GZ_REQUIRE(header.flags == 0, ErrorCode::malformed_message, op, ": flags are ",
               int{header.flags}, " (expected 0)");
    GZ_REQUIRE(header.small_param == 0, ErrorCode::malformed_message, op, ": small_param is ",
               int{header.small_param}, " (expected 0)");
    GZ_REQUIRE(header.large_param == 0, ErrorCode::malformed_message, op, ": large_param is ",
               header.large_param, " (expected 0)");
    // Written without count * 2, which could wrap for an absurd count.
    GZ_REQUIRE(header.payload_bytes % kBytesPerElement == 0 &&
                   header.payload_bytes / kBytesPerElement == count,
               ErrorCode::malformed_message, op, ": payload of ", header.payload_bytes,
               " bytes for ", count, " elements of 2 bytes (expected ", count, " x 2 bytes)");
    return in.data() + kWireHeaderBytes;
  }

  CompressionSpec spec_;
  CastFormat format_;
  std::string encode_op_;
  std::string decode_op_;
  std::string decode_add_op_;
};

std::unique_ptr<Codec> make_fp16_codec(const CompressionSpec& spec) {
  return std::make_unique<CastCodec>(spec, kFp16);
}

std::unique_ptr<Codec> make_bf16_codec(const CompressionSpec& spec) {
  return std::make_unique<CastCodec>(spec, kBf16);
}

// ---- the rows ------------------------------------------------------------------------------------

constexpr std::array<std::string_view, 1> kFp16Examples{"fp16"};
constexpr std::array<std::string_view, 1> kBf16Examples{"bf16"};

// Round to nearest even: fp16 errs by at most 2^-11 |y| for normal results and 2^-25 absolute
// below, bf16 by 2^-8 |y|.
double fp16_bound(const CompressionSpec&, double y_max) { return 0x1p-11 * y_max + 0x1p-25; }
double bf16_bound(const CompressionSpec&, double y_max) { return 0x1p-8 * y_max; }

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

}  // namespace

// The dense paths, 16-bit values on the wire; segments cut anywhere.
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

}  // namespace gradzip::compressors
