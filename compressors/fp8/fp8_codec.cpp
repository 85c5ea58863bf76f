// `fp8:format=e4m3|e5m2`: each element as an 8-bit float of the chosen format, with one
// power-of-two scale per block of 32 elements (OCP Microscaling style; the element math, and
// why nothing is ever clipped, in fp8_math.h). Deterministic: the same input gives the same
// bytes on every ISA and on the device. Not additive, not sparse.
//
// Header: codec = WireCodec::fp8, flags = 0, small_param = format (0: e4m3, 1: e5m2),
// large_param = block (32), count = n.
// Payload (offsets from the end of the 32-byte header; no alignment anywhere):
//   offset  size   field
//   0       B      scales: one byte per block, block 0 first, B = ceil(n / 32): s + 127 for the
//                  scale 2^s (0..254), or 255 for a block holding a NaN or an infinity, which
//                  decodes to NaN throughout
//   B       n      codes: element i's code in byte B + i (sign bit 7, then exponent, mantissa)
// payload_bytes = B + n exactly. Decoders refuse any other size, flags != 0, an unknown format
// and a block other than 32; every scale and code byte decodes (codes that are NaN or, in e5m2,
// infinities in the format decode to those, as the format defines them).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/fp8/fp8_codec.h"
#include "compressors/fp8/fp8_math.h"
#include "compressors/wire_format.h"
#include "kernels/cpu/convert.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::compressors {
namespace {

using fp8::Format;
using fp8::kFp8Block;

class Fp8Codec final : public Codec {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit Fp8Codec(const CompressionSpec& spec) : spec_(spec), format_(fp8::format_of(spec)) {}

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    GZ_REQUIRE(count <= fp8::kMaxCount, ErrorCode::invalid_argument, "fp8.max_encoded_bytes: ",
               count, " elements do not fit a message");
    return kWireHeaderBytes + fp8::payload_bytes(count);
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& /*ctx*/) const override {
    require_host(in, "fp8.encode");
    const std::size_t total = max_encoded_bytes(in.count);
    require_capacity(out, total, "fp8.encode");
    write_header(fp8::header_for(format_, in.count), out);
    auto* scales = reinterpret_cast<std::uint8_t*>(out.data() + kWireHeaderBytes);
    std::uint8_t* codes = scales + fp8::block_count(in.count);
    if (in.dtype == DType::f32) {
      fp8::encode_blocks(static_cast<const float*>(in.data), in.count, format_, scales, codes);
      return total;
    }
    // kConvertBlock is a multiple of the block: converted pieces start on a block.
    static_assert(kernels::cpu::kConvertBlock % kFp8Block == 0);
    float piece[kernels::cpu::kConvertBlock];
    for (std::size_t begin = 0; begin < in.count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, in.count - begin);
      kernels::cpu::load_as_f32(in, begin, n, piece);
      fp8::encode_blocks(piece, n, format_, scales + begin / kFp8Block, codes + begin);
    }
    return total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "fp8.decode");
    const Payload payload = validated_payload(in, out.count, "fp8.decode");
    if (out.dtype == DType::f32) {
      fp8::decode_range(payload.scales, payload.codes, 0, out.count, payload.format,
                        static_cast<float*>(out.data), false);
      return;
    }
    float piece[kernels::cpu::kConvertBlock];
    for (std::size_t begin = 0; begin < out.count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, out.count - begin);
      fp8::decode_range(payload.scales, payload.codes, begin, n, payload.format, piece, false);
      kernels::cpu::store_from_f32(piece, n, out, begin);
    }
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "fp8.decode_add");
    const Payload payload = validated_payload(in, count, "fp8.decode_add");
    fp8::decode_range(payload.scales, payload.codes, 0, count, payload.format, acc, true);
  }

  bool additive() const noexcept override { return false; }
  bool sparse() const noexcept override { return false; }

 private:
  struct Payload {
    const std::uint8_t* scales = nullptr;
    const std::uint8_t* codes = nullptr;
    Format format = Format::e4m3;
  };

  // Checks every header field and the exact payload size. The message's own format decides the
  // decode (a receiver's spec says how it encodes; both ranks' specs agree in a collective, whose
  // call check compares them).
  static Payload validated_payload(std::span<const std::byte> in, std::size_t count,
                                   std::string_view op) {
    const WireHeader header = read_header_for(in, WireCodec::fp8, count, op);
    fp8::check_header(header, count, op);
    Payload payload;
    payload.format = static_cast<Format>(header.small_param);
    payload.scales = reinterpret_cast<const std::uint8_t*>(in.data() + kWireHeaderBytes);
    payload.codes = payload.scales + fp8::block_count(count);
    return payload;
  }

  CompressionSpec spec_;
  Format format_;
};

std::unique_ptr<Codec> make_fp8_codec(const CompressionSpec& spec) {
  GZ_REQUIRE(spec.format <= 1, ErrorCode::invalid_argument, "make_codec: fp8 format ",
             int{spec.format}, " in '", spec.to_string(), "' is not one (0: e4m3, 1: e5m2)");
  return std::make_unique<Fp8Codec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr CodecKey kFormatKey{
    "format",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.format = static_cast<std::uint8_t>(parse_spec_choice<Format>(
          text, "format", value, {{"e4m3", Format::e4m3}, {"e5m2", Format::e5m2}}));
    },
    [](const CompressionSpec& spec) {
      return std::string(spec.format == static_cast<std::uint8_t>(Format::e5m2) ? "format=e5m2"
                                                                                : "format=e4m3");
    }};
constexpr std::array<CodecKey, 1> kFp8Keys{kFormatKey};
constexpr std::array<std::string_view, 2> kFp8Examples{"fp8", "fp8:format=e5m2"};

double fp8_bound(const CompressionSpec& spec, double y_max) {
  return fp8::fp8_error_bound(fp8::format_of(spec), y_max);
}

// |err_i| <= d |y_i| + a_b for element i of block b (fp8_error_bound's two terms, a_b the half
// subnormal step at the block's own scale), so |err| <= d |y| + sqrt(sum a_b^2): the cosine is
// at least that of the relative error (d + |a| / |y|), computed from y's own block scales.
double fp8_cosine(const CompressionSpec& spec, std::span<const float> y) {
  const Format format = fp8::format_of(spec);
  const fp8::FormatParams p = fp8::params_of(format);
  double energy = 0, floor_energy = 0;
  for (std::size_t begin = 0; begin < y.size(); begin += kFp8Block) {
    const std::size_t n = std::min(kFp8Block, y.size() - begin);
    const std::uint32_t amax = fp8::block_amax_bits(y.data() + begin, n);
    for (std::size_t i = 0; i < n; ++i) energy += static_cast<double>(y[begin + i]) * y[begin + i];
    if (amax >= 0x7f800000u) return 0;  // not finite: no direction to keep
    const int s = fp8::scale_exponent(amax, format);
    const double half_step = std::ldexp(1.0, s - p.bias - p.mantissa_bits);
    floor_energy += static_cast<double>(n) * half_step * half_step;
  }
  if (energy == 0) return 1;
  return cosine_of_relative_error(9.0 / 8.0 / static_cast<double>(1u << (p.mantissa_bits + 1)) +
                                  std::sqrt(floor_energy / energy));
}

}  // namespace

// Deterministic rounding, re-applied to partial sums on the ring: a bucket quantiser's paths
// (SRA by default). Segments cut on whole blocks of 32 (each element a whole byte).
constinit const CodecDescriptor fp8_codec_row{
    .keys = kFp8Keys,
    .make_host = make_fp8_codec,
    .example_specs = kFp8Examples,
    .paths = CollectivePaths::bucket_quantiser,
    .segment_granularity = [](const CompressionSpec&) noexcept { return kFp8Block; },
    .error_bound = fp8_bound,
    .cosine_estimate = fp8_cosine,
};

}  // namespace gradzip::compressors
