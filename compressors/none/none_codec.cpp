// `none`: the payload is the chunk as f32, whatever the input dtype. The baseline every other
// codec is measured against, and what dense fallbacks send.
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/wire_format.h"
#include "kernels/cpu/convert.h"

namespace gradzip::compressors {
namespace {

class NoneCodec final : public Codec {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit NoneCodec(const CompressionSpec& spec) : spec_(spec) {}

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    return kWireHeaderBytes + count * sizeof(float);
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& /*ctx*/) const override {
    require_host(in, "none.encode");
    const std::size_t total = max_encoded_bytes(in.count);
    require_capacity(out, total, "none.encode");
    write_header(WireHeader{WireCodec::none, 0, 0, in.count, in.count * sizeof(float), 0}, out);
    if (in.count > 0 && in.dtype == DType::f32) {
      std::memcpy(out.data() + kWireHeaderBytes, in.data, in.count * sizeof(float));
    } else if (in.count > 0) {
      // `out` is caller memory of any alignment; convert through an aligned block.
      float block[kernels::cpu::kConvertBlock];
      for (std::size_t begin = 0; begin < in.count; begin += kernels::cpu::kConvertBlock) {
        const std::size_t n = std::min(kernels::cpu::kConvertBlock, in.count - begin);
        kernels::cpu::load_as_f32(in, begin, n, block);
        std::memcpy(out.data() + kWireHeaderBytes + begin * sizeof(float), block,
                    n * sizeof(float));
      }
    }
    return total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "none.decode");
    const std::byte* payload = validated_payload(in, out.count, "none.decode");
    if (out.dtype == DType::f32) {
      if (out.count > 0) std::memcpy(out.data, payload, out.count * sizeof(float));
      return;
    }
    // The payload may sit at any alignment inside a receive buffer: copy it in blocks.
    float block[kernels::cpu::kConvertBlock];
    for (std::size_t begin = 0; begin < out.count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, out.count - begin);
      std::memcpy(block, payload + begin * sizeof(float), n * sizeof(float));
      kernels::cpu::store_from_f32(block, n, out, begin);
    }
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "none.decode_add");
    const std::byte* payload = validated_payload(in, count, "none.decode_add");
    for (std::size_t i = 0; i < count; ++i) {
      float value;
      std::memcpy(&value, payload + i * sizeof(float), sizeof value);
      acc[i] += value;
    }
  }

  bool additive() const noexcept override { return true; }
  bool sparse() const noexcept override { return false; }

 private:
  static const std::byte* validated_payload(std::span<const std::byte> in, std::size_t count,
                                            std::string_view op) {
    const WireHeader header = read_header_for(in, WireCodec::none, count, op);
    GZ_REQUIRE(header.payload_bytes == count * sizeof(float), ErrorCode::malformed_message, op,
               ": payload of ", header.payload_bytes, " bytes for ", count,
               " f32 elements (expected ", count * sizeof(float), ")");
    return in.data() + kWireHeaderBytes;
  }

  CompressionSpec spec_;
};

std::unique_ptr<Codec> make_none_codec(const CompressionSpec& spec) {
  return std::make_unique<NoneCodec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr std::array<std::string_view, 1> kNoneExamples{"none"};

// Exact: no error, cosine 1.
double exact_bound(const CompressionSpec&, double) { return 0; }
double exact_cosine(const CompressionSpec&, std::span<const float>) { return 1; }

}  // namespace

// The dense paths; segments cut anywhere.
constinit const CodecDescriptor none_codec_row{
    .make_host = make_none_codec,
    .example_specs = kNoneExamples,
    .paths = CollectivePaths::dense,
    .segment_granularity = segments_anywhere,
    .error_bound = exact_bound,
    .cosine_estimate = exact_cosine,
};

}  // namespace gradzip::compressors
