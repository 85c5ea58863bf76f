// `randk`: shared-seed random-k sparsification (`randk:ratio=r` or `randk:k=N`, optional
// `values=fp16`). k = spec.k_for(n) indices are drawn from the EncodeContext (seed, step,
// tensor id, element offset) by the stratified rule of randk_math.h, so every rank with the
// same context keeps the same indices: the payload carries values only, and payloads
// of equal keys can be summed value by value (additive, not sparse).
//
// Values are sent as they are, NOT rescaled by n/k: D(C(g)) is a shrunk estimate of g and
// error feedback (on by default for randk) carries the dropped part into later steps.
//
// Chunks: a chunk at element_offset o draws its indices from Philox blocks o .. o+k-1 (k is the
// chunk's own k_for(chunk length), strata span the chunk only). So the chunks of one tensor use
// disjoint counters, but a tensor sent in chunks keeps a different selection than the same
// tensor sent whole.
//
// Message = 32-byte header (compressors/wire_format.h) + payload:
//   header: codec randk, flags bit 1 (0x02) set = f16 values, no other bit; small_param 0;
//           count = n; large_param = k (k == 0 iff n == 0, else 1 <= k <= n);
//           payload_bytes = 24 + k * (4 or 2).
//   payload (little-endian, at any alignment):
//     offset  size   field
//     0       8      seed            u64  | the key the indices are drawn from, so decoding
//     8       4      step            u32  | needs nothing but the message
//     12      4      tensor_id       u32  |
//     16      8      element_offset  u64  |
//     24      4k     values          f32; or 2k bytes of f16 (round to nearest even) with flags
//                                    bit 1. Value j belongs to index_j, the j-th smallest index.
// The key is written for every count, including n == 0 (payload of 24 bytes).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string_view>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/randk/randk_cpu.h"
#include "compressors/randk/randk_header.h"
#include "compressors/spec_keys.h"
#include "compressors/wire_format.h"

namespace gradzip::compressors {
namespace {

// What a validated message holds.
struct RandkMessage {
  std::uint64_t k;
  DType value_dtype;
  kernels::RandkKey key;
  const std::byte* values;
};

class RandkCodec final : public Codec {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit RandkCodec(const CompressionSpec& spec) : spec_(spec) {
    GZ_REQUIRE(spec.values == DType::f32 || spec.values == DType::f16, ErrorCode::invalid_spec,
               "randk: values must be fp32 or fp16, got ", dtype_name(spec.values));
  }

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    return kWireHeaderBytes + kRandkKeyBytes + spec_.k_for(count) * dtype_size(spec_.values);
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& ctx) const override {
    require_host(in, "randk.encode");
    const WireHeader header = randk_header(spec_, in.count);
    const std::size_t total = kWireHeaderBytes + header.payload_bytes;
    require_capacity(out, total, "randk.encode");
    write_header(header, out);
    const kernels::RandkKey key = kernels::cpu::randk_key(ctx);
    std::byte* key_bytes = out.data() + kWireHeaderBytes;
    kernels::randk_write_key(key, key_bytes);
    kernels::cpu::randk_gather(in, entry_count_of(header), key, spec_.values,
                               key_bytes + kRandkKeyBytes);
    return total;
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "randk.decode");
    const RandkMessage message = validated(in, out.count, "randk.decode");
    kernels::cpu::randk_scatter(message.values, message.value_dtype, message.k, message.key, out);
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "randk.decode_add");
    const RandkMessage message = validated(in, count, "randk.decode_add");
    kernels::cpu::randk_scatter_add(message.values, message.value_dtype, message.k, message.key,
                                    acc, count);
  }

  bool additive() const noexcept override { return true; }
  bool sparse() const noexcept override { return false; }

 private:
  // Every header field and the exact payload size, before anything is written. The indices
  // need no check: the rule puts them inside [0, count) for any key once 1 <= k <= count.
  static RandkMessage validated(std::span<const std::byte> in, std::size_t count,
                                std::string_view op) {
    const WireHeader header = read_header_for(in, WireCodec::randk, count, op);
    GZ_REQUIRE((header.flags & ~kRandkHalfValues) == 0, ErrorCode::malformed_message, op,
               ": flags 0x", std::hex, int{header.flags},
               " (only bit 1, 0x02 = f16 values, is defined)");
    GZ_REQUIRE(header.small_param == 0, ErrorCode::malformed_message, op, ": small_param ",
               int{header.small_param}, " (expected 0)");
    const std::uint64_t k = entry_count_of(header);
    if (count == 0) {
      GZ_REQUIRE(k == 0, ErrorCode::malformed_message, op, ": k = ", k,
                 " for a message of 0 elements (expected 0)");
    } else {
      GZ_REQUIRE(k >= 1 && k <= count, ErrorCode::malformed_message, op, ": k = ", k, " for ",
                 count, " elements (expected 1 <= k <= ", count, ")");
    }
    const DType value_dtype = has_half_values(header) ? DType::f16 : DType::f32;
    const std::uint64_t value_bytes = dtype_size(value_dtype);
    // k <= count keeps k * value_bytes in range for any real buffer; check anyway.
    GZ_REQUIRE(k <= (std::numeric_limits<std::uint64_t>::max() - kRandkKeyBytes) / value_bytes,
               ErrorCode::malformed_message, op, ": k = ", k, " overflows the payload size");
    const std::uint64_t expected = kRandkKeyBytes + k * value_bytes;
    GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
               header.payload_bytes, " bytes for k = ", k, " ", dtype_name(value_dtype),
               " values (expected ", kRandkKeyBytes, " + ", k, " * ", value_bytes, " = ", expected, ")");
    const std::byte* payload = in.data() + kWireHeaderBytes;
    return RandkMessage{k, value_dtype, kernels::randk_read_key(payload), payload + kRandkKeyBytes};
  }

  CompressionSpec spec_;
};

std::unique_ptr<Codec> make_randk_codec(const CompressionSpec& spec) {
  return std::make_unique<RandkCodec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr std::array<CodecKey, 4> kRandkKeys{kRatioKey, kCountKey, kValuesKey, kRampKey};
constexpr std::array<std::string_view, 3> kRandkExamples{"randk:ratio=0.1", "randk:k=1",
                                                         "randk:ratio=0.5,values=fp16"};

// k indices drawn without regard to the values keep k/n of |y|^2 on average.
double randk_cosine(const CompressionSpec& spec, std::span<const float> y) {
  if (y.empty()) return 1;
  const double kept = static_cast<double>(std::min(spec.k_for(y.size()), y.size()));
  return std::sqrt(kept / static_cast<double>(y.size()));
}

}  // namespace

// Biased (values not rescaled): error feedback on by default; the shared-selection paths (every
// rank keeps the same indices, so payloads add value by value).
constinit const CodecDescriptor randk_codec_row{
    .keys = kRandkKeys,
    .check_spec = check_selection_spec,
    .error_feedback_default = true,
    .make_host = make_randk_codec,
    .example_specs = kRandkExamples,
    .paths = CollectivePaths::shared_selection,
    .values_key = true,
    .error_bound = selection_bound,
    .cosine_estimate = randk_cosine,
};

}  // namespace gradzip::compressors
