// `topk`: keeps the k = spec.k_for(n) elements of largest magnitude (exact), or about that many
// (approx=on, DGC-style sampled threshold), as (index, value) pairs. Selection, ordering rule
// and the approx guarantee: compressors/topk/topk_cpu.h and compressors/topk/topk_math.h. In short: exact
// keeps exactly the k largest |x| (ties: lowest index; NaN ranks above Inf); approx keeps the
// exact top-m for some ceil(k/2) <= m <= k.
//
// Message: the 32-byte header (compressors/wire_format.h) with
//   codec        WireCodec::topk
//   flags        bit 0: indices are u64 (else u32); bit 1: values are f16 (else f32);
//                no other bit may be set
//   small_param  0 for exact, 1 for approx (informational: decoding ignores it, but it must be
//                0 or 1)
//   count        n, the elements the message decodes to
//   large_param  m, the number of entries (m == k for exact; m <= n)
//   payload      m * (index bytes + value bytes)
// followed by the payload, little-endian, no padding:
//   offset 0        m indices, u32 or u64 (flags bit 0), strictly increasing, each < n
//   offset m * iw   m values, f32 or f16 bits (flags bit 1), values[j] belongs to indices[j]
// with iw = 4 or 8 the index width. The encoder writes u32 indices iff n <= 2^32, and f16
// values (round to nearest even, overflow to +-inf, NaN kept as NaN) iff values=fp16.
// The decoder accepts u64 indices for any n (they are validated like u32 ones) and refuses u32
// indices for n > 2^32, which they cannot address.
//
// decode() writes zeros everywhere, then the values at their indices; decode_add() adds the
// values at their indices. Both validate the whole message, every index included, first.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compressors/codec_checks.h"
#include "compressors/codec_descriptor.h"
#include "compressors/fused_feedback.h"
#include "compressors/spec_keys.h"
#include "compressors/topk/topk_cpu.h"
#include "compressors/wire_format.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/convert.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::compressors {
namespace {

std::size_t index_bytes_for(std::size_t count) {
  return count > kTopkMaxNarrowCount ? sizeof(std::uint64_t) : sizeof(std::uint32_t);
}

// A validated message: where its arrays start and how to read them.
struct TopkPayload {
  const std::byte* indices = nullptr;
  const std::byte* values = nullptr;
  std::size_t entries = 0;
  bool wide_indices = false;
  bool half_values = false;

  std::uint64_t index(std::size_t j) const {
    if (wide_indices) {
      std::uint64_t value;
      std::memcpy(&value, indices + j * sizeof value, sizeof value);
      return value;
    }
    std::uint32_t value;
    std::memcpy(&value, indices + j * sizeof value, sizeof value);
    return value;
  }

  float value(std::size_t j) const {
    if (half_values) {
      std::uint16_t bits;
      std::memcpy(&bits, values + j * sizeof bits, sizeof bits);
      return kernels::f16_bits_to_f32(bits);
    }
    float value;
    std::memcpy(&value, values + j * sizeof value, sizeof value);
    return value;
  }
};

// Checks every header field, the payload size and every index of the message for `count`
// output elements; throws malformed_message naming `op` otherwise.
TopkPayload validated_payload(std::span<const std::byte> in, std::size_t count,
                              std::string_view op) {
  const WireHeader header = read_header_for(in, WireCodec::topk, count, op);
  GZ_REQUIRE((header.flags & ~(kTopkWideIndices | kTopkHalfValues)) == 0,
             ErrorCode::malformed_message, op, ": flags 0x", std::hex, int{header.flags}, std::dec,
             " has bits other than 0x1 (64-bit indices) and 0x2 (f16 values)");
  GZ_REQUIRE(header.small_param <= 1, ErrorCode::malformed_message, op, ": small_param ",
             int{header.small_param}, " is neither 0 (exact) nor 1 (approx)");
  TopkPayload payload;
  payload.wide_indices = has_wide_indices(header);
  payload.half_values = has_half_values(header);
  GZ_REQUIRE(payload.wide_indices || header.count <= kTopkMaxNarrowCount, ErrorCode::malformed_message,
             op, ": 32-bit indices cannot address ", header.count,
             " elements (flags bit 0x1 must be set above 2^32)");
  GZ_REQUIRE(entry_count_of(header) <= header.count, ErrorCode::malformed_message, op, ": ",
             entry_count_of(header), " entries (large_param) for ", header.count, " elements");
  const std::size_t index_width = payload.wide_indices ? 8 : 4;
  const std::size_t value_width = payload.half_values ? 2 : 4;
  const std::size_t entry_bytes = index_width + value_width;
  // Division, not m * entry_bytes: large_param comes off the wire and could overflow.
  GZ_REQUIRE(header.payload_bytes % entry_bytes == 0 &&
                 header.payload_bytes / entry_bytes == entry_count_of(header),
             ErrorCode::malformed_message, op, ": payload of ", header.payload_bytes,
             " bytes, expected ", entry_count_of(header), " entries of ", entry_bytes, " bytes (",
             index_width, "-byte index, ", value_width, "-byte value)");
  payload.entries = static_cast<std::size_t>(entry_count_of(header));
  payload.indices = in.data() + kWireHeaderBytes;
  payload.values = payload.indices + payload.entries * index_width;
  std::uint64_t previous = 0;
  for (std::size_t j = 0; j < payload.entries; ++j) {
    const std::uint64_t index = payload.index(j);
    GZ_REQUIRE(index < header.count, ErrorCode::malformed_message, op, ": entry ", j,
               " has index ", index, ", the message holds ", header.count, " elements");
    GZ_REQUIRE(j == 0 || index > previous, ErrorCode::malformed_message, op, ": entry ", j,
               " has index ", index, " after index ", previous,
               " (indices must be strictly increasing)");
    previous = index;
  }
  return payload;
}

// Selection results, kept per thread across calls (one pair per index width, shared by the
// plain and the error-feedback encode): k entries of a large tensor are megabytes, and fresh
// pages every step cost more than copying them into the message. Grown to hold k entries.
template <typename IndexT>
std::pair<std::vector<IndexT>, std::vector<float>>& selection_buffers(std::size_t k) {
  thread_local std::pair<std::vector<IndexT>, std::vector<float>> buffers;
  if (buffers.first.size() < k) buffers.first.resize(k);
  if (buffers.second.size() < k) buffers.second.resize(k);
  return buffers;
}

class TopkCodec final : public Codec, public FusedFeedbackEncoder {
 public:
  using Codec::decode_add;  // the TensorView form (host accumulators) too
  explicit TopkCodec(const CompressionSpec& spec) : spec_(spec) {}

  const CompressionSpec& spec() const noexcept override { return spec_; }

  std::size_t max_encoded_bytes(std::size_t count) const override {
    return kWireHeaderBytes + spec_.k_for(count) * (index_bytes_for(count) + value_bytes());
  }

  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& ctx) const override {
    require_host(in, "topk.encode");
    require_capacity(out, max_encoded_bytes(in.count), "topk.encode");
    return index_bytes_for(in.count) == sizeof(std::uint32_t)
               ? encode_with<std::uint32_t>(in, out, ctx)
               : encode_with<std::uint64_t>(in, out, ctx);
  }

  void decode(std::span<const std::byte> in, TensorView out) const override {
    require_host(out, "topk.decode");
    const TopkPayload payload = validated_payload(in, out.count, "topk.decode");
    if (out.count == 0) return;
    std::memset(out.data, 0, out.size_bytes());  // +0.0 in f32, f16 and bf16
    std::byte* const base = static_cast<std::byte*>(out.data);
    for (std::size_t j = 0; j < payload.entries; ++j) {
      const std::size_t index = static_cast<std::size_t>(payload.index(j));
      const float value = payload.value(j);
      switch (out.dtype) {
        case DType::f32:
          std::memcpy(base + index * sizeof(float), &value, sizeof value);
          break;
        case DType::f16: {  // a store into a tensor: IEEE rounding (kernels/cast_math.h)
          const std::uint16_t bits = kernels::f32_to_f16_bits_ieee(value);
          std::memcpy(base + index * sizeof bits, &bits, sizeof bits);
          break;
        }
        case DType::bf16: {
          const std::uint16_t bits = kernels::f32_to_bf16_bits_ieee(value);
          std::memcpy(base + index * sizeof bits, &bits, sizeof bits);
          break;
        }
      }
    }
  }

  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    require_accumulator(acc, count, "topk.decode_add");
    const TopkPayload payload = validated_payload(in, count, "topk.decode_add");
    for (std::size_t j = 0; j < payload.entries; ++j)
      acc[static_cast<std::size_t>(payload.index(j))] += payload.value(j);
  }

  // Only the carried entries: everywhere else decode() writes +0.0.
  void subtract_decoded(std::span<const std::byte> in, float* residual,
                        std::size_t count) const override {
    require_accumulator(residual, count, "topk.subtract_decoded");
    const TopkPayload payload = validated_payload(in, count, "topk.subtract_decoded");
    for (std::size_t j = 0; j < payload.entries; ++j) {
      float& value = residual[static_cast<std::size_t>(payload.index(j))];
      value = kernels::finite_or_zero(value - payload.value(j));
    }
  }
  bool subtracts_decoded_in_place() const noexcept override { return true; }

  bool additive() const noexcept override { return false; }
  bool sparse() const noexcept override { return true; }

  // Error feedback with the add inside the candidate pass (compressors/topk/topk_cpu.h
  // topk_select_with_feedback): the message of encode(g + e), then e = g' - D(message), which
  // changes e only at the carried entries (D is +0.0 elsewhere), plus a finite_or_zero sweep
  // when some g' is not finite: the general path's residual, bit for bit.
  std::optional<std::size_t> encode_with_feedback(const float* g, float* e, std::size_t count,
                                                  std::span<std::byte> out,
                                                  const EncodeContext& ctx) const override {
    require_capacity(out, max_encoded_bytes(count), "topk.encode");
    return index_bytes_for(count) == sizeof(std::uint32_t)
               ? encode_with_feedback_as<std::uint32_t>(g, e, count, out, ctx)
               : encode_with_feedback_as<std::uint64_t>(g, e, count, out, ctx);
  }

 private:
  std::size_t value_bytes() const { return spec_.values == DType::f16 ? 2 : 4; }

  template <typename IndexT>
  std::size_t encode_with_feedback_as(const float* g, float* e, std::size_t count,
                                      std::span<std::byte> out, const EncodeContext& ctx) const {
    bool any_non_finite = false;
    const std::size_t message_bytes = select_and_write<IndexT>(
        count, out, ctx,
        [&](auto&&... args) {
          return kernels::cpu::topk_select_with_feedback(g, e, count, args..., any_non_finite);
        },
        [&](std::span<const IndexT> indices, std::span<const float> selected) {
          // e = finite_or_zero(g' - D) at the sent entries, with g' the selected value (its
          // bits, widened) and D the value as the message carries it: f32 values give +0.0,
          // f16 ones the rounding error. Stores only: the residual of a large tensor is far
          // out of cache there, and reading it (subtract_decoded) cost a miss per entry.
          constexpr std::size_t kPrefetchAhead = 16;
          for (std::size_t j = 0; j < indices.size(); ++j) {
            if (j + kPrefetchAhead < indices.size())
              __builtin_prefetch(e + indices[j + kPrefetchAhead], 1);
            const float sent = spec_.values == DType::f16
                                   ? kernels::f16_bits_to_f32(kernels::f32_to_f16_bits(selected[j]))
                                   : selected[j];
            e[indices[j]] = kernels::finite_or_zero(selected[j] - sent);
          }
        });
    if (any_non_finite)
      for (std::size_t i = 0; i < count; ++i) e[i] = kernels::finite_or_zero(e[i]);
    return message_bytes;
  }

  template <typename IndexT>
  std::size_t encode_with(ConstTensorView in, std::span<std::byte> out,
                          const EncodeContext& ctx) const {
    return select_and_write<IndexT>(
        in.count, out, ctx,
        [&](auto&&... args) { return kernels::cpu::topk_select<IndexT>(in, args...); },
        [](std::span<const IndexT>, std::span<const float>) {});
  }

  // Runs select(k, options, index_out, value_out) -> TopkResult for an n-element tensor,
  // writes its entries as the message, then calls selected(indices, values) with the entries
  // (values as selected, f32); returns the message size.
  template <typename IndexT, typename Select, typename Selected>
  std::size_t select_and_write(std::size_t n, std::span<std::byte> out, const EncodeContext& ctx,
                               Select&& select, Selected&& selected) const {
    const std::size_t k = spec_.k_for(n);
    auto& [indices, values] = selection_buffers<IndexT>(k);
    const kernels::cpu::TopkOptions options{spec_.approx, ctx.seed, ctx.step, ctx.tensor_id};
    const std::size_t entries = select(k, options, indices.data(), values.data()).count;

    const std::size_t payload_bytes = entries * (sizeof(IndexT) + value_bytes());
    std::uint8_t flags = sizeof(IndexT) == 8 ? kTopkWideIndices : 0;
    if (spec_.values == DType::f16) flags |= kTopkHalfValues;
    write_header(WireHeader{WireCodec::topk, flags, static_cast<std::uint8_t>(spec_.approx ? 1 : 0),
                            n, payload_bytes, entries},
                 out);
    std::byte* const index_area = out.data() + kWireHeaderBytes;
    std::byte* const value_area = index_area + entries * sizeof(IndexT);
    if (entries > 0) std::memcpy(index_area, indices.data(), entries * sizeof(IndexT));
    if (spec_.values == DType::f16) {
      // `out` may sit at any alignment: convert through an aligned block.
      std::uint16_t block[kernels::cpu::kConvertBlock];
      for (std::size_t begin = 0; begin < entries; begin += kernels::cpu::kConvertBlock) {
        const std::size_t count = std::min(kernels::cpu::kConvertBlock, entries - begin);
        kernels::cpu::f32_to_f16(values.data() + begin, block, count);
        std::memcpy(value_area + begin * sizeof(std::uint16_t), block, count * sizeof(std::uint16_t));
      }
    } else if (entries > 0) {
      std::memcpy(value_area, values.data(), entries * sizeof(float));
    }
    selected(std::span<const IndexT>(indices.data(), entries),
             std::span<const float>(values.data(), entries));
    return kWireHeaderBytes + payload_bytes;
  }

  CompressionSpec spec_;
};

std::unique_ptr<Codec> make_topk_codec(const CompressionSpec& spec) {
  GZ_REQUIRE(spec.codec == CodecKind::topk, ErrorCode::internal,
             "make_topk_codec: spec '", spec.to_string(), "' is not a topk spec");
  GZ_REQUIRE(spec.values == DType::f32 || spec.values == DType::f16, ErrorCode::invalid_spec,
             "topk: values=", dtype_name(spec.values), " is not one of fp32, fp16");
  return std::make_unique<TopkCodec>(spec);
}

// ---- the row -------------------------------------------------------------------------------------

constexpr CodecKey kApproxKey{
    "approx",
    [](CompressionSpec& spec, std::string_view value, std::string_view text) {
      spec.approx = parse_spec_choice<bool>(text, "approx", value, {{"on", true}, {"off", false}});
    },
    [](const CompressionSpec& spec) {
      return std::string(spec.approx ? "approx=on" : "approx=off");
    }};
constexpr std::array<CodecKey, 5> kTopkKeys{kRatioKey, kCountKey, kApproxKey, kValuesKey,
                                             kRampKey};
constexpr std::array<std::string_view, 5> kTopkExamples{
    "topk:ratio=0.1", "topk:k=1", "topk:ratio=0.5,approx=on", "topk:ratio=0.1,values=fp16",
    "topk:ratio=0.3,approx=on,values=fp16"};

// Exact top-k keeps the k largest |y|: cos = sqrt(their share of |y|^2). approx=on keeps the
// exact top m for some m >= ceil(k/2) (above), so the estimate uses ceil(k/2).
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

}  // namespace

// Biased: error feedback on by default; the top-selection paths (each rank's own indices, so
// messages are gathered and their entries added). Approximate top-k's message size varies.
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

}  // namespace gradzip::compressors
