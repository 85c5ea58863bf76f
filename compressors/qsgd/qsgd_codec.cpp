// `qsgd:bits=B,bucket=N`: stochastic-rounding quantisation (Alistarh et al., "QSGD", NIPS'17)
// with one f32 scale (max |x|) per bucket of N elements and a B-bit code per element.
// Unbiased: E[decode(encode(x))] = x up to f32 rounding; the element math and its treatment of
// NaN / Inf are in compressors/qsgd/qsgd_math.h, the loops in qsgd_cpu*.cpp.
//
// Message: the 32-byte header (compressors/wire_format.h) with
//   codec = WireCodec::qsgd, flags = 0, small_param = bits (1..8), large_param = bucket (>= 1),
//   count = elements, payload_bytes = 4 * ceil(count / bucket) + ceil(count * bits / 8);
// then the payload, little-endian, no padding:
//   offset                      size                   field
//   32                          4 * num_buckets        f32 scale of bucket b at 32 + 4b;
//                                                      num_buckets = ceil(count / bucket)
//   32 + 4 * num_buckets        ceil(count * bits / 8) codes, a bit stream packed LSB-first:
//                                                      element i occupies stream bits
//                                                      [i * bits, (i + 1) * bits), byte j holds
//                                                      stream bits [8j, 8j + 8); unused high bits
//                                                      of the last byte are 0
// Codes: bits >= 2: sign bit 2^(bits-1) | magnitude q in [0, 2^(bits-1) - 1], value ±q * scale / s;
//        bits == 1: 1 = +scale, 0 = -scale.
//
// Decoders check, before writing any output: the header (codec, count, flags, bits in 1..8,
// bucket >= 1, the exact payload size), every scale (+0..+Inf or the canonical NaN 0x7FC00000:
// a max |x| is never negative and encode writes only that NaN) and that every code of a
// non-finite bucket is 0 (what encode writes there). The magnitude field can hold any value up
// to 2^(bits-1) - 1 = s, so no code of a finite bucket is out of range. A sign bit with
// magnitude 0 ("-0") is never written by encode; it decodes to -0.0, which equals 0.
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string_view>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/fused_feedback.h"
#include "compressors/qsgd/qsgd_cpu.h"
#include "compressors/spec_keys.h"
#include "compressors/wire_format.h"

namespace gradzip::compressors {
namespace {

using kernels::cpu::QsgdLayout;
using kernels::cpu::qsgd_layout;

class QsgdCodec final : public Codec, public FusedFeedbackEncoder {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit QsgdCodec(const CompressionSpec& spec) : spec_(spec) {
    GZ_REQUIRE(spec.bits >= kernels::kQsgdMinBits && spec.bits <= kernels::kQsgdMaxBits,
               ErrorCode::invalid_spec, "make_codec: qsgd bits=", spec.bits,
               " is outside 1..8 (spec '", spec.to_string(), "')");
    GZ_REQUIRE(spec.bucket >= 1, ErrorCode::invalid_spec, "make_codec: qsgd bucket=0 (spec '",
               spec.to_string(), "'); a bucket holds at least one element");
  }

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    return kWireHeaderBytes + layout_for_encode(count, "qsgd.max_encoded_bytes").payload_bytes();
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& ctx) const override {
    require_host(in, "qsgd.encode");
    const std::size_t total = start_message(in.count, out);
    kernels::cpu::qsgd_encode_payload(in, spec_.bits, spec_.bucket, ctx,
                                      out.data() + kWireHeaderBytes);
    return total;
  }

  // One pass over g and e, block by block (compressors/qsgd/qsgd_cpu.h): the message encode(g + e)
  // writes and the residual of the general path, bit for bit. Declines buckets whose lcm with 8
  // exceeds the kernel's largest block.
  std::optional<std::size_t> encode_with_feedback(const float* g, float* e, std::size_t count,
                                                  std::span<std::byte> out,
                                                  const EncodeContext& ctx) const override {
    if (!kernels::cpu::qsgd_fuses_bucket(spec_.bucket)) return std::nullopt;
    const std::size_t total = start_message(count, out);
    kernels::cpu::qsgd_encode_payload_with_feedback(g, e, count, spec_.bits, spec_.bucket, ctx,
                                                    out.data() + kWireHeaderBytes);
    return total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "qsgd.decode");
    const Validated message = validate(in, out.count, "qsgd.decode");
    kernels::cpu::qsgd_decode_payload(message.payload, out.count, message.bits, message.bucket,
                                      out);
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "qsgd.decode_add");
    const Validated message = validate(in, count, "qsgd.decode_add");
    kernels::cpu::qsgd_decode_add_payload(message.payload, count, message.bits, message.bucket,
                                          acc);
  }

  bool additive() const noexcept override { return false; }
  bool sparse() const noexcept override { return false; }

 private:
  struct Validated {
    const std::byte* payload;
    int bits;
    std::size_t bucket;
  };

  // Checks `out`'s capacity for a message of `count` elements, writes its header and returns
  // the message size.
  std::size_t start_message(std::size_t count, std::span<std::byte> out) const {
    const QsgdLayout layout = layout_for_encode(count, "qsgd.encode");
    const std::size_t total = kWireHeaderBytes + layout.payload_bytes();
    require_capacity(out, total, "qsgd.encode");
    write_header(WireHeader{WireCodec::qsgd, 0, static_cast<std::uint8_t>(spec_.bits), count,
                            layout.payload_bytes(), spec_.bucket},
                 out);
    return total;
  }

  QsgdLayout layout_for_encode(std::size_t count, std::string_view op) const {
    const auto layout = qsgd_layout(count, spec_.bits, spec_.bucket);
    GZ_REQUIRE(layout.has_value(), ErrorCode::invalid_argument, op, ": ", count,
               " elements exceed the ", kernels::cpu::kQsgdMaxCount, " a qsgd message can hold");
    return *layout;
  }

  static Validated validate(std::span<const std::byte> in, std::size_t count, std::string_view op) {
    const WireHeader header = read_header_for(in, WireCodec::qsgd, count, op);
    GZ_REQUIRE(header.flags == 0, ErrorCode::malformed_message, op, ": flags 0x", std::hex,
               int{header.flags}, " (expected 0)");
    const int bits = qsgd_bits_of(header);
    GZ_REQUIRE(bits >= kernels::kQsgdMinBits && bits <= kernels::kQsgdMaxBits,
               ErrorCode::malformed_message, op, ": bits ", bits, " (expected 1..8)");
    GZ_REQUIRE(bucket_of(header) >= 1, ErrorCode::malformed_message, op,
               ": bucket 0 (expected >= 1)");
    // Buckets above SIZE_MAX cannot occur on a 64-bit host; count <= kQsgdMaxCount bounds the rest.
    const std::size_t bucket = static_cast<std::size_t>(bucket_of(header));
    const auto layout = qsgd_layout(count, bits, bucket);
    GZ_REQUIRE(layout.has_value(), ErrorCode::malformed_message, op, ": count ", count,
               " exceeds the ", kernels::cpu::kQsgdMaxCount, " a qsgd message can hold");
    GZ_REQUIRE(header.payload_bytes == layout->payload_bytes(), ErrorCode::malformed_message, op,
               ": payload of ", header.payload_bytes, " bytes for ", count, " elements, bits=",
               bits, ", bucket=", bucket, " (expected ", layout->payload_bytes(), " = ",
               layout->scale_bytes, " scale bytes + ", layout->code_bytes, " code bytes)");
    const std::byte* payload = payload_of(in).data();
    kernels::cpu::QsgdPayloadProblem problem;
    if (!kernels::cpu::qsgd_check_payload(payload, count, bits, bucket, problem)) {
      if (problem.nonzero_code) {
        GZ_THROW(ErrorCode::malformed_message, op, ": bucket ", problem.bucket_index,
                 " has the non-finite scale 0x", std::hex, problem.scale_bits,
                 " and a non-zero code (expected every code of such a bucket to be 0)");
      }
      GZ_THROW(ErrorCode::malformed_message, op, ": bucket ", problem.bucket_index, " has scale 0x",
               std::hex, problem.scale_bits,
               " (expected +0 .. +Inf, 0x7f800000 or below, or the quiet NaN 0x7fc00000)");
    }
    return Validated{payload, bits, bucket};
  }

  CompressionSpec spec_;
};

std::unique_ptr<Codec> make_qsgd_codec(const CompressionSpec& spec) {
  return std::make_unique<QsgdCodec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr CodecKey kBitsKey{
    "bits",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.bits = static_cast<int>(parse_spec_unsigned(text, "bits", value, 1, 8));
    },
    [](const CompressionSpec& spec) { return detail::concat("bits=", spec.bits); }};
constexpr std::array<CodecKey, 2> kQsgdKeys{kBitsKey, kBucketKey};

// 1-bit qsgd decodes every element to +-(bucket maximum): its error is as large as the
// signal, and feeding it back grows the maximum every step (measured: the residual reaches
// 1e28 in 100 steps). `sign` scales by the mean |g| instead and is the 1-bit codec for EF.
void check_qsgd_spec(CompressionSpec& spec, std::string_view text,
                     const std::set<std::string_view>&) {
  GZ_REQUIRE(!(spec.bits == 1 && spec.error_feedback), ErrorCode::invalid_spec,
             "compression spec '", text,
             "': qsgd with bits=1 and ef=on diverges (each element's error is up to twice the "
             "bucket maximum, and error feedback amplifies it); use 'sign' for 1-bit with error "
             "feedback, or ef=off");
}

constexpr std::array<std::string_view, 8> kQsgdExamples{
    "qsgd:bits=1,bucket=1",   "qsgd:bits=1,bucket=64", "qsgd:bits=2,bucket=7",
    "qsgd:bits=2,bucket=512", "qsgd:bits=4,bucket=3",  "qsgd:bits=4,bucket=128",
    "qsgd:bits=8,bucket=1",   "qsgd:bits=8,bucket=512"};

double qsgd_bound(const CompressionSpec& spec, double y_max) {
  return stochastic_levels_bound(spec.bits, y_max);
}

double qsgd_cosine(const CompressionSpec& spec, std::span<const float> y) {
  return stochastic_levels_cosine(y, spec.bucket, spec.bits);
}

}  // namespace

// Unbiased, stochastic: a bucket quantiser's paths (SRA by default); segments cut on whole
// buckets that end on a whole code byte. Error feedback off unless the spec asks (and refused
// with bits=1).
constinit const CodecDescriptor qsgd_codec_row{
    .keys = kQsgdKeys,
    .check_spec = check_qsgd_spec,
    .make_host = make_qsgd_codec,
    .example_specs = kQsgdExamples,
    .paths = CollectivePaths::bucket_quantiser,
    .segment_granularity = segments_on_bit_code_buckets,
    .error_bound = qsgd_bound,
    .cosine_estimate = qsgd_cosine,
};

}  // namespace gradzip::compressors
