#include "error_feedback/error_feedback_codec.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "compressors/codec_checks.h"
#include "compressors/device_codec.h"
#include "compressors/fused_feedback.h"
#include "error_feedback/device_feedback.h"
#include "gradzip/error.h"
#include "kernels/cpu/convert.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::error_feedback {

ErrorFeedbackCodec::ErrorFeedbackCodec(std::shared_ptr<const Codec> codec, ResidualStore& store,
                                       std::vector<float>* shared_scratch)
    : codec_(std::move(codec)),
      fused_(dynamic_cast<const compressors::FusedFeedbackEncoder*>(codec_.get())),
      store_(&store),
      shared_scratch_(shared_scratch) {
  GZ_REQUIRE(codec_ != nullptr, ErrorCode::invalid_argument,
             "ErrorFeedbackCodec: the wrapped codec is null");
}

std::size_t ErrorFeedbackCodec::encode(std::string_view tensor_name, ConstTensorView grad,
                                       std::span<std::byte> out, const EncodeContext& ctx) {
  GZ_REQUIRE(ctx.element_offset == 0, ErrorCode::invalid_argument, "ef.encode (rank ",
             store_->rank(), "): tensor '", tensor_name,
             "' is encoded whole, but ctx.element_offset is ", ctx.element_offset,
             " (use encode_chunk for chunks)");
  return encode_chunk(tensor_name, grad.count, grad, out, ctx);
}

std::size_t ErrorFeedbackCodec::encode_chunk(std::string_view tensor_name,
                                             std::size_t tensor_count, ConstTensorView chunk,
                                             std::span<std::byte> out,
                                             const EncodeContext& ctx,
                                             std::span<float> decoded) {
  // Argument checks run before the store or the residual change.
  if (chunk.device.kind == DeviceKind::cpu) compressors::require_host(chunk, "ef.encode");
  else compressors::require_device_tensor(chunk, "ef.encode");
  GZ_REQUIRE(ctx.element_offset <= tensor_count &&
                 chunk.count <= tensor_count - ctx.element_offset,
             ErrorCode::invalid_argument, "ef.encode (rank ", store_->rank(), "): chunk of ",
             chunk.count, " elements at offset ", ctx.element_offset, " does not fit in tensor '",
             tensor_name, "' of ", tensor_count, " elements");
  const std::size_t count = chunk.count;
  compressors::require_capacity(out, codec_->max_encoded_bytes(count), "ef.encode");
  GZ_REQUIRE(decoded.empty() || decoded.size() == count, ErrorCode::invalid_argument,
             "ef.encode (rank ", store_->rank(), "): decoded output of ", decoded.size(),
             " elements for a chunk of ", count);

  if (chunk.device.kind == DeviceKind::cuda) {
    // The same arithmetic on the device, on the residual in the chunk's device memory.
    float* const d_residual =
        store_->device_residual(tensor_name, tensor_count, chunk.device.index) + ctx.element_offset;
    return device_feedback_encode(*codec_, chunk, d_residual, out, ctx, decoded);
  }
  const std::span<float> residual =
      store_->residual(tensor_name, tensor_count).subspan(ctx.element_offset, count);
  float* const e = residual.data();
  if (decoded.empty() && chunk.dtype == DType::f32) {
    const auto* g = static_cast<const float*>(chunk.data);
    // A codec that fuses error feedback into its encode (compressors/fused_feedback.h: sign,
    // qsgd, top-k, fp16, bf16) does it in one pass over g and e, with the same message and residual.
    if (fused_ != nullptr)
      if (const std::optional<std::size_t> bytes = fused_->encode_with_feedback(g, e, count, out, ctx))
        return *bytes;
    if (codec_->subtracts_decoded_in_place()) return encode_in_place(g, e, count, out, ctx);
  }
  std::vector<float>& scratch_buffer = scratch();
  if (scratch_buffer.size() < count) scratch_buffer.resize(count);
  float* const corrected = scratch_buffer.data();  // g'

  // g' = g + e. Converted inputs go block by block so each block is still in L1 for the add.
  if (chunk.dtype == DType::f32) {
    const auto* g = static_cast<const float*>(chunk.data);
    for (std::size_t i = 0; i < count; ++i) corrected[i] = g[i] + e[i];
  } else {
    for (std::size_t begin = 0; begin < count; begin += kernels::cpu::kConvertBlock) {
      const std::size_t n = std::min(kernels::cpu::kConvertBlock, count - begin);
      kernels::cpu::load_as_f32(chunk, begin, n, corrected + begin);
      for (std::size_t i = begin; i < begin + n; ++i) corrected[i] += e[i];
    }
  }

  const std::size_t message_bytes =
      codec_->encode(ConstTensorView{corrected, count, DType::f32, Device{}}, out, ctx);

  // e = g' - D(message). D is applied to the bytes actually written, not recomputed from g'
  // by a model of the codec: the residual then holds exactly what the receivers did not get
  // (stochastic rounding, ties, f16 value widths and any codec detail included), so
  // sum_t D(message_t) + e_T = sum_t g_t holds for every codec. The decode goes straight into
  // the residual's memory (its old value is already folded into g'), which saves a second
  // scratch buffer, unless the caller wants D(message) itself; decoders validate before
  // writing, so a throwing decode leaves e (and `decoded`) as they were.
  // Residuals never hold non-finite values (kernels/nonfinite_math.h): an element of e that
  // comes out NaN or Inf (a non-finite input under nonfinite=propagate never gets here, but a
  // finite one whose encode overflowed might) is stored as 0, so one bad step cannot poison
  // every later one. The device path (device_feedback_encode) applies the same rule.
  const std::span<const std::byte> message(out.data(), message_bytes);
  if (decoded.empty()) {
    codec_->decode(message, TensorView{e, count, DType::f32, Device{}});
    for (std::size_t i = 0; i < count; ++i) e[i] = kernels::finite_or_zero(corrected[i] - e[i]);
  } else {
    codec_->decode(message, TensorView{decoded.data(), count, DType::f32, Device{}});
    for (std::size_t i = 0; i < count; ++i)
      e[i] = kernels::finite_or_zero(corrected[i] - decoded[i]);
  }
  return message_bytes;
}

// The path of codecs whose subtract_decoded works in place (top-k, sign): the same message and
// the same residual as the general path above, in fewer passes over memory. g' is formed in
// the residual's own memory and encoded from there; then Codec::subtract_decoded updates the
// residual: top-k only at the entries its message carries (D is +0.0 everywhere else, and
// e = g' - (+0.0) = g' for a finite g'), sign block by block through a stack buffer. That is
// three streams over the chunk (g, e in, e out) plus the encode and the update, against the
// general path's scratch write, full decode and second pass. When some g' is not finite, a
// finite_or_zero sweep after the update gives each element the general path's
// finite_or_zero(g' - D): the updated entries are finite already, the others are g' - (+0.0).
// The encode's argument checks ran in encode_chunk before the residual changed; it cannot fail
// after them.
std::size_t ErrorFeedbackCodec::encode_in_place(const float* g, float* e, std::size_t count,
                                                std::span<std::byte> out,
                                                const EncodeContext& ctx) {
  bool any_non_finite = false;
  for (std::size_t i = 0; i < count; ++i) {
    e[i] = g[i] + e[i];
    any_non_finite |= kernels::f32_bits_nonfinite(kernels::float_bits(e[i]));
  }
  const std::size_t message_bytes =
      codec_->encode(ConstTensorView{e, count, DType::f32, Device{}}, out, ctx);
  codec_->subtract_decoded(std::span<const std::byte>(out.data(), message_bytes), e, count);
  if (any_non_finite)
    for (std::size_t i = 0; i < count; ++i) e[i] = kernels::finite_or_zero(e[i]);
  return message_bytes;
}

void ErrorFeedbackCodec::release_scratch() noexcept {
  scratch().clear();
  scratch().shrink_to_fit();
}

}  // namespace gradzip::error_feedback
