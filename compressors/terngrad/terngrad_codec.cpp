// `terngrad:bucket=N`: TernGrad (Wen et al., "TernGrad: Ternary Gradients to Reduce
// Communication in Distributed Deep Learning", NIPS'17). Each bucket of N elements carries one
// f32 scale (max |x|), and each element one of {-scale, 0, +scale}, drawn so that its expectation
// is x (|x| / scale is the probability of +-scale): unbiased, with |decode - x| <= scale. The
// codes are qsgd's 2-bit codes (compressors/terngrad/terngrad_math.h explains why they are the same
// numbers); the payload packs them as ternary digits, five to a byte. Not additive, not sparse.
//
// Message: the 32-byte header (compressors/wire_format.h) with
//   codec = WireCodec::terngrad, flags = 0, small_param = 0, large_param = bucket (>= 1),
//   count = elements, payload_bytes = 4 * ceil(count / bucket) + ceil(count / 5);
// then the payload, little-endian, no padding:
//   offset                      size                   field
//   32                          4 * num_buckets        f32 scale of bucket b at 32 + 4b
//   32 + 4 * num_buckets        ceil(count / 5)        trit bytes: byte j = t0 + 3 t1 + 9 t2 +
//                                                      27 t3 + 81 t4, t_d the trit of element
//                                                      5j + d (0: +0, 1: +scale, 2: -scale)
// Decoders check, before writing any output: the header (codec, count, flags 0, small_param 0,
// bucket >= 1, the exact payload size), every trit byte (below 243, and the digits of the last
// byte after the last element 0), every scale (+0..+Inf or the quiet NaN 0x7FC00000) and that
// every trit of a bucket with a non-finite scale is 0 (such a bucket decodes to the quiet NaN).
#include <array>
#include <memory>
#include <span>
#include <string_view>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/spec_keys.h"
#include "compressors/terngrad/terngrad_cpu.h"
#include "compressors/terngrad/terngrad_math.h"
#include "compressors/wire_format.h"

namespace gradzip::compressors {
namespace {

using kernels::kTerngradMaxCount;
using kernels::terngrad_layout;
using kernels::terngrad_layout_fits;
using kernels::TerngradLayout;
using kernels::cpu::TerngradPayloadProblem;

class TerngradCodec final : public Codec {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit TerngradCodec(const CompressionSpec& spec) : spec_(spec) {
    GZ_REQUIRE(spec.bucket >= 1, ErrorCode::invalid_spec,
               "make_codec: terngrad bucket=0 (spec '", spec.to_string(),
               "'); a bucket holds at least one element");
  }

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    return kWireHeaderBytes + layout_for_encode(count, "terngrad.max_encoded_bytes").payload_bytes();
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& ctx) const override {
    require_host(in, "terngrad.encode");
    const TerngradLayout layout = layout_for_encode(in.count, "terngrad.encode");
    const std::size_t total = kWireHeaderBytes + layout.payload_bytes();
    require_capacity(out, total, "terngrad.encode");
    write_header(WireHeader{WireCodec::terngrad, 0, 0, in.count, layout.payload_bytes(),
                            spec_.bucket},
                 out);
    kernels::cpu::terngrad_encode_payload(in, spec_.bucket, ctx, out.data() + kWireHeaderBytes);
    return total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "terngrad.decode");
    const Validated message = validate(in, out.count, "terngrad.decode");
    kernels::cpu::terngrad_decode_payload(message.payload, out.count, message.bucket, out);
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "terngrad.decode_add");
    const Validated message = validate(in, count, "terngrad.decode_add");
    kernels::cpu::terngrad_decode_add_payload(message.payload, count, message.bucket, acc);
  }

  bool additive() const noexcept override { return false; }
  bool sparse() const noexcept override { return false; }

 private:
  struct Validated {
    const std::byte* payload;
    std::size_t bucket;
  };

  TerngradLayout layout_for_encode(std::size_t count, std::string_view op) const {
    GZ_REQUIRE(terngrad_layout_fits(count, spec_.bucket), ErrorCode::invalid_argument, op, ": ",
               count, " elements exceed the ", kTerngradMaxCount, " a terngrad message can hold");
    return terngrad_layout(count, spec_.bucket);
  }

  static Validated validate(std::span<const std::byte> in, std::size_t count, std::string_view op) {
    const WireHeader header = read_header_for(in, WireCodec::terngrad, count, op);
    GZ_REQUIRE(header.flags == 0 && header.small_param == 0, ErrorCode::malformed_message, op,
               ": flags 0x", std::hex, int{header.flags}, ", small_param ", std::dec,
               int{header.small_param}, " (expected 0 and 0)");
    GZ_REQUIRE(bucket_of(header) >= 1, ErrorCode::malformed_message, op,
               ": bucket 0 (expected >= 1)");
    const std::size_t bucket = static_cast<std::size_t>(bucket_of(header));
    GZ_REQUIRE(terngrad_layout_fits(count, bucket), ErrorCode::malformed_message, op, ": count ",
               count, " exceeds the ", kTerngradMaxCount, " a terngrad message can hold");
    const TerngradLayout layout = terngrad_layout(count, bucket);
    GZ_REQUIRE(header.payload_bytes == layout.payload_bytes(), ErrorCode::malformed_message, op,
               ": payload of ", header.payload_bytes, " bytes for ", count, " elements, bucket=",
               bucket, " (expected ", layout.payload_bytes(), " = ", layout.scale_bytes,
               " scale bytes + ", layout.trit_bytes, " trit bytes)");
    const std::byte* payload = payload_of(in).data();
    TerngradPayloadProblem problem;
    if (!kernels::cpu::terngrad_check_payload(payload, count, bucket, problem)) {
      switch (problem.kind) {
        case TerngradPayloadProblem::Kind::trit_byte:
          GZ_THROW(ErrorCode::malformed_message, op, ": trit byte ", problem.index, " is ",
                   problem.value, " (expected at most ",
                   kernels::terngrad_byte_limit(count, problem.index),
                   ": five trits below 243, the digits after the last element 0)");
        case TerngradPayloadProblem::Kind::scale:
          GZ_THROW(ErrorCode::malformed_message, op, ": bucket ", problem.index, " has scale 0x",
                   std::hex, problem.value,
                   " (expected +0 .. +Inf, 0x7f800000 or below, or the quiet NaN 0x7fc00000)");
        case TerngradPayloadProblem::Kind::nonzero_code:
          GZ_THROW(ErrorCode::malformed_message, op, ": bucket ", problem.index,
                   " has the non-finite scale 0x", std::hex, problem.value,
                   " and a non-zero trit (expected every trit of such a bucket to be 0)");
      }
    }
    return Validated{payload, bucket};
  }

  CompressionSpec spec_;
};

std::unique_ptr<Codec> make_terngrad_codec(const CompressionSpec& spec) {
  return std::make_unique<TerngradCodec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr std::array<CodecKey, 1> kTerngradKeys{kBucketKey};
constexpr std::array<std::string_view, 3> kTerngradExamples{
    "terngrad:bucket=1", "terngrad:bucket=7", "terngrad:bucket=512"};

// qsgd's 2-bit levels {-scale, 0, +scale}: |err| <= scale, plus the f32 rounding.
double terngrad_bound(const CompressionSpec&, double y_max) {
  return stochastic_levels_bound(2, y_max);
}

double terngrad_cosine(const CompressionSpec& spec, std::span<const float> y) {
  return stochastic_levels_cosine(y, spec.bucket, 2);  // qsgd's 2-bit levels
}

}  // namespace

// Unbiased, stochastic: a bucket quantiser's paths (SRA by default); segments cut on whole
// buckets of whole trit bytes. Error feedback off unless the spec asks.
constinit const CodecDescriptor terngrad_codec_row{
    .keys = kTerngradKeys,
    .make_host = make_terngrad_codec,
    .example_specs = kTerngradExamples,
    .paths = CollectivePaths::bucket_quantiser,
    .segment_granularity = segments_on_trit_code_buckets,
    .error_bound = terngrad_bound,
    .cosine_estimate = terngrad_cosine,
};

}  // namespace gradzip::compressors
