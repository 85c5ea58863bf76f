// `sign:bucket=N`: 1 bit per element (x < 0) plus one f32 scale per bucket of N elements, the
// bucket's mean |x|; element i decodes to bit ? -scale : +scale. Math and the canonical order
// of the f32 sums: compressors/sign/sign_math.h. Not additive (two messages' bits cannot be summed),
// not sparse.
//
// Header: codec = WireCodec::sign, flags = 0, small_param = 1 (bits per element),
// large_param = bucket (>= 1), count = n.
// Payload (offsets from the end of the 32-byte header; no alignment anywhere):
//   offset       size                 field
//   0            4 * B                scales: f32 little-endian, bucket 0 first,
//                                     B = ceil(n / bucket) (0 when n == 0)
//   4 * B        ceil(n / 8)          sign bits: element i at bit i % 8 (LSB first) of byte i / 8;
//                                     the unused high bits of the last byte are zero
// payload_bytes = 4 * B + ceil(n / 8) exactly. Decoders refuse any other size, bucket 0,
// flags != 0, small_param != 1 and a nonzero unused bit; scales may hold any f32 bits.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/fused_feedback.h"
#include "compressors/sign/sign_cpu.h"
#include "compressors/spec_keys.h"
#include "compressors/wire_format.h"
#include "kernels/cpu/convert.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::compressors {
namespace {

constexpr std::uint8_t kSignBitsPerElement = 1;
static_assert(sizeof(std::size_t) == sizeof(std::uint64_t),
              "the bucket (a 64-bit header field) is used as a size_t");

std::size_t bucket_count(std::size_t count, std::size_t bucket) noexcept {
  return count == 0 ? 0 : (count - 1) / bucket + 1;  // ceil without overflow for any bucket
}

std::size_t bit_bytes(std::size_t count) noexcept { return count / 8 + (count % 8 != 0); }

// payload_bytes for `count` elements; saturates at SIZE_MAX (which no message can have: its
// size would be 32 + SIZE_MAX) when the true size does not fit a size_t.
std::size_t payload_bytes_for(std::size_t count, std::size_t bucket) noexcept {
  const std::size_t buckets = bucket_count(count, bucket);
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  if (buckets > (kMax - bit_bytes(count)) / sizeof(float)) return kMax;
  return buckets * sizeof(float) + bit_bytes(count);
}

// Error feedback fused into the encode (encode_with_feedback): blocks of about this many
// elements (16 KiB of g', which stays in L1 between the add, the encode and the update), whole
// buckets and a multiple of 8 each; buckets whose lcm with 8 exceeds kMaxFusedBlock take the
// general path.
constexpr std::size_t kFusedBlock = 4096;
constexpr std::size_t kMaxFusedBlock = std::size_t{1} << 16;

class SignCodec final : public Codec, public FusedFeedbackEncoder {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit SignCodec(const CompressionSpec& spec) : spec_(spec) {
    GZ_REQUIRE(spec.bucket >= 1, ErrorCode::invalid_argument, "make_codec: sign bucket is 0 in '",
               spec.to_string(), "'; it must be at least 1");
  }

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    const std::size_t payload = payload_bytes_for(count, spec_.bucket);
    GZ_REQUIRE(payload <= std::numeric_limits<std::size_t>::max() - kWireHeaderBytes,
               ErrorCode::invalid_argument, "sign.max_encoded_bytes: ", count,
               " elements do not fit a message");
    return kWireHeaderBytes + payload;
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& /*ctx*/) const override {
    require_host(in, "sign.encode");
    const Layout layout = start_message(in.count, out, "sign.encode");
    if (in.count == 0) return layout.total;
    kernels::cpu::SignEncoder encoder(spec_.bucket, layout.scales, layout.bits);
    if (in.dtype == DType::f32) {
      encoder.add(static_cast<const float*>(in.data), in.count);
    } else {
      // kConvertBlock is a multiple of 8, so each converted block's bits start on a byte.
      static_assert(kernels::cpu::kConvertBlock % 8 == 0);
      float block[kernels::cpu::kConvertBlock];
      for (std::size_t begin = 0; begin < in.count; begin += kernels::cpu::kConvertBlock) {
        const std::size_t n = std::min(kernels::cpu::kConvertBlock, in.count - begin);
        kernels::cpu::load_as_f32(in, begin, n, block);
        encoder.add(block, n);
      }
    }
    encoder.finish();
    // Step 3 of the scale: buckets whose sum overflowed f32 (finite elements near FLT_MAX).
    if (!encoder.any_scale_overflowed()) return layout.total;
    std::vector<float> converted;  // one such bucket of an f16 / bf16 input
    kernels::cpu::sign_rescue_overflowed_scales(
        in.count, spec_.bucket, layout.scales, [&](std::size_t begin, std::size_t len) -> const float* {
          if (in.dtype == DType::f32) return static_cast<const float*>(in.data) + begin;
          converted.resize(len);
          kernels::cpu::load_as_f32(in, begin, len, converted.data());
          return converted.data();
        });
    return layout.total;
  }

  // One pass: per block of whole buckets, g' = g + e into e, the block's bits and scales (the
  // encoder is the same streaming one encode() runs, so the bytes are the same whatever the
  // block boundaries), the overflow rescue of the block's buckets while e still holds g', then
  // e = finite_or_zero(g' - D) from the block's just-written part of the message.
  std::optional<std::size_t> encode_with_feedback(const float* g, float* e, std::size_t count,
                                                  std::span<std::byte> out,
                                                  const EncodeContext& /*ctx*/) const override {
    const std::size_t unit = std::lcm(spec_.bucket, std::size_t{8});
    if (unit > kMaxFusedBlock) return std::nullopt;  // unit >= bucket
    const std::size_t block = std::max(unit, kFusedBlock / unit * unit);
    const Layout layout = start_message(count, out, "sign.encode");
    kernels::cpu::SignEncoder encoder(spec_.bucket, layout.scales, layout.bits);
    const kernels::cpu::SignPayload payload{layout.scales, layout.bits, count, spec_.bucket};
    float decoded[kFusedBlock];  // D of up to kFusedBlock elements at a time
    for (std::size_t begin = 0; begin < count; begin += block) {
      const std::size_t n = std::min(block, count - begin);
      float* const corrected = e + begin;
      for (std::size_t i = 0; i < n; ++i) corrected[i] = g[begin + i] + corrected[i];
      encoder.add(corrected, n);
      if (begin + n == count) encoder.finish();
      if (encoder.any_scale_overflowed()) {
        // Only this block's buckets (it starts on a bucket boundary); earlier blocks' +inf
        // scales are rescued already, and a rescued scale is never +inf unless a bucket holds
        // an inf, whose rescue gives +inf again.
        kernels::cpu::sign_rescue_overflowed_scales(
            n, spec_.bucket, layout.scales + begin / spec_.bucket * sizeof(float),
            [&](std::size_t first, std::size_t) -> const float* { return corrected + first; });
      }
      for (std::size_t done = 0; done < n; done += kFusedBlock) {
        const std::size_t m = std::min(kFusedBlock, n - done);
        kernels::cpu::sign_decode(payload, begin + done, m, decoded);
        for (std::size_t i = 0; i < m; ++i)
          corrected[done + i] = kernels::finite_or_zero(corrected[done + i] - decoded[i]);
      }
    }
    return layout.total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "sign.decode");
    const kernels::cpu::SignPayload payload = validated_payload(in, out.count, "sign.decode");
    if (out.dtype == DType::f32) {
      kernels::cpu::sign_decode(payload, 0, out.count, static_cast<float*>(out.data));
      return;
    }
    float block[kernels::cpu::kConvertBlock];
    for (std::size_t begin = 0; begin < out.count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, out.count - begin);
      kernels::cpu::sign_decode(payload, begin, n, block);
      kernels::cpu::store_from_f32(block, n, out, begin);
    }
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "sign.decode_add");
    kernels::cpu::sign_decode_add(validated_payload(in, count, "sign.decode_add"), acc);
  }

  // Decoded block by block into a stack buffer, so the residual is read and written once.
  void subtract_decoded(std::span<const std::byte> in, float* residual,
                        std::size_t count) const override {
    require_accumulator(residual, count, "sign.subtract_decoded");
    const kernels::cpu::SignPayload payload = validated_payload(in, count, "sign.subtract_decoded");
    float block[kernels::cpu::kConvertBlock];
    for (std::size_t begin = 0; begin < count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, count - begin);
      kernels::cpu::sign_decode(payload, begin, n, block);
      for (std::size_t i = 0; i < n; ++i)
        residual[begin + i] = kernels::finite_or_zero(residual[begin + i] - block[i]);
    }
  }
  bool subtracts_decoded_in_place() const noexcept override { return true; }

  bool additive() const noexcept override { return false; }
  bool sparse() const noexcept override { return false; }

 private:
  // Where a message of `count` elements puts its parts, and its size.
  struct Layout {
    std::size_t total = 0;
    std::byte* scales = nullptr;
    std::uint8_t* bits = nullptr;
  };

  // Checks `out`'s capacity, writes the header and returns the layout (`op` names the caller).
  Layout start_message(std::size_t count, std::span<std::byte> out, std::string_view op) const {
    Layout layout;
    layout.total = max_encoded_bytes(count);
    require_capacity(out, layout.total, op);
    write_header(WireHeader{WireCodec::sign, 0, kSignBitsPerElement, count,
                            layout.total - kWireHeaderBytes, spec_.bucket},
                 out);
    layout.scales = out.data() + kWireHeaderBytes;
    layout.bits = reinterpret_cast<std::uint8_t*>(layout.scales +
                                                  bucket_count(count, spec_.bucket) * sizeof(float));
    return layout;
  }

  // Checks every header field, the exact payload size and the unused bits of the last byte.
  static kernels::cpu::SignPayload validated_payload(std::span<const std::byte> in,
                                                     std::size_t count, std::string_view op) {
    const WireHeader header = read_header_for(in, WireCodec::sign, count, op);
    GZ_REQUIRE(header.flags == 0, ErrorCode::malformed_message, op, ": flags are 0x", std::hex,
               int{header.flags}, " (expected 0)");
    GZ_REQUIRE(header.small_param == kSignBitsPerElement, ErrorCode::malformed_message, op,
               ": small_param (bits per element) is ", int{header.small_param}, " (expected ",
               int{kSignBitsPerElement}, ")");
    GZ_REQUIRE(bucket_of(header) >= 1, ErrorCode::malformed_message, op,
               ": bucket (large_param) is 0 (expected >= 1)");
    const auto bucket = static_cast<std::size_t>(bucket_of(header));
    const std::size_t expected = payload_bytes_for(count, bucket);
    GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
               header.payload_bytes, " bytes for ", count, " elements in buckets of ", bucket,
               " (expected ", expected, ": ", bucket_count(count, bucket), " f32 scales + ",
               bit_bytes(count), " bytes of bits)");
    const std::byte* scales = in.data() + kWireHeaderBytes;
    const auto* bits =
        reinterpret_cast<const std::uint8_t*>(scales + bucket_count(count, bucket) * sizeof(float));
    if (count % 8 != 0) {
      const unsigned padding = bits[count / 8] >> (count % 8);
      GZ_REQUIRE(padding == 0, ErrorCode::malformed_message, op, ": unused bits ", count % 8,
                 "..7 of the last sign byte are 0x", std::hex, padding, " (expected 0)");
    }
    return kernels::cpu::SignPayload{scales, bits, count, bucket};
  }

  CompressionSpec spec_;
};

std::unique_ptr<Codec> make_sign_codec(const CompressionSpec& spec) {
  return std::make_unique<SignCodec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr std::array<CodecKey, 1> kSignKeys{kBucketKey};
constexpr std::array<std::string_view, 3> kSignExamples{"sign:bucket=1", "sign:bucket=13",
                                                        "sign:bucket=512"};

// Decodes to +-mean|y| of the bucket: |err| <= |y| + mean <= 2 y_max.
double sign_bound(const CompressionSpec&, double y_max) { return 2 * y_max; }

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

}  // namespace

// Biased, deterministic, error feedback on by default: a bucket quantiser's paths (SRA by
// default); segments cut on whole buckets that end on a whole bit byte.
constinit const CodecDescriptor sign_codec_row{
    .keys = kSignKeys,
    .error_feedback_default = true,
    .make_host = make_sign_codec,
    .example_specs = kSignExamples,
    .paths = CollectivePaths::bucket_quantiser,
    .segment_granularity = segments_on_bit_code_buckets,
    .error_bound = sign_bound,
    .cosine_estimate = sign_cosine,
};

}  // namespace gradzip::compressors
