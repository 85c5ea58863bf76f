#include "gradzip/codec.h"

#include <optional>
#include <vector>

#include "compressors/codec_descriptor.h"
#include "compressors/device_codec.h"
#include "compressors/fused_feedback.h"
#include "gradzip/error.h"
#include "kernels/nonfinite_math.h"

namespace gradzip {
namespace compressors {
namespace {

// What make_codec() returns: the host codec, with CUDA tensors sent to the device codecs
// (compressors/device_codec.h). Host calls pass straight through.
// Error feedback's fused encode (compressors/fused_feedback.h, host memory only) is the host
// codec's, when it has one.
class DeviceDispatchCodec final : public Codec, public FusedFeedbackEncoder {
 public:
  explicit DeviceDispatchCodec(std::unique_ptr<Codec> host)
      : host_(std::move(host)), host_fused_(dynamic_cast<const FusedFeedbackEncoder*>(host_.get())) {}

  std::optional<std::size_t> encode_with_feedback(const float* g, float* e, std::size_t count,
                                                  std::span<std::byte> out,
                                                  const EncodeContext& ctx) const override {
    if (host_fused_ == nullptr) return std::nullopt;
    return host_fused_->encode_with_feedback(g, e, count, out, ctx);
  }

  const CompressionSpec& spec() const noexcept override { return host_->spec(); }
  std::size_t max_encoded_bytes(std::size_t count) const override {
    return host_->max_encoded_bytes(count);
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& ctx) const override {
    if (in.device.kind == DeviceKind::cuda) return device_encode(*host_, in, out, ctx);
    return host_->encode(in, out, ctx);
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    if (out.device.kind == DeviceKind::cuda) return device_decode(*host_, in, out, false);
    host_->decode(in, out);
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    host_->decode_add(in, acc, count);
  }
  void decode_add(std::span<const std::byte> in, TensorView acc) const override {
    if (acc.device.kind == DeviceKind::cuda) return device_decode(*host_, in, acc, true);
    host_->decode_add(in, acc);
  }

  void subtract_decoded(std::span<const std::byte> in, float* residual,
                        std::size_t count) const override {
    host_->subtract_decoded(in, residual, count);
  }
  bool subtracts_decoded_in_place() const noexcept override {
    return host_->subtracts_decoded_in_place();
  }

  bool additive() const noexcept override { return host_->additive(); }
  bool sparse() const noexcept override { return host_->sparse(); }

 private:
  std::unique_ptr<Codec> host_;
  const FusedFeedbackEncoder* host_fused_;  // null: the host codec has no fused encode
};

std::unique_ptr<Codec> make_host_codec(const CompressionSpec& spec) {
  const CodecDescriptor& row = codec_descriptor(spec.codec);
  GZ_REQUIRE(row.make_host != nullptr, ErrorCode::unsupported, "make_codec: ",
             row.why_no_element_codec, " (spec '", spec.to_string(), "')");
  return row.make_host(spec);
}

}  // namespace
}  // namespace compressors

void Codec::decode_add(std::span<const std::byte> in, TensorView acc) const {
  GZ_REQUIRE(acc.dtype == DType::f32, ErrorCode::invalid_argument, name(),
             ".decode_add: the accumulator is ", dtype_name(acc.dtype), "; it must be f32");
  GZ_REQUIRE(acc.device.kind == DeviceKind::cpu, ErrorCode::unsupported, name(),
             ".decode_add: the accumulator is on CUDA device ", acc.device.index,
             " and this codec object serves host memory (make_codec() codecs serve both)");
  decode_add(in, static_cast<float*>(acc.data), acc.count);
}

void Codec::subtract_decoded(std::span<const std::byte> in, float* residual,
                             std::size_t count) const {
  GZ_REQUIRE(residual != nullptr || count == 0, ErrorCode::invalid_argument, name(),
             ".subtract_decoded: null residual for ", count, " elements");
  std::vector<float> decoded(count);
  decode(in, TensorView{decoded.data(), count, DType::f32, Device{}});
  for (std::size_t i = 0; i < count; ++i)
    residual[i] = kernels::finite_or_zero(residual[i] - decoded[i]);
}

std::unique_ptr<Codec> make_codec(const CompressionSpec& spec) {
  return std::make_unique<compressors::DeviceDispatchCodec>(compressors::make_host_codec(spec));
}

std::unique_ptr<Codec> make_codec(std::string_view spec) {
  return make_codec(CompressionSpec::parse(spec));
}

}  // namespace gradzip
