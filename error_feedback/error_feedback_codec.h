// Error feedback as a decorator around any codec (Seide et al. 2014; Karimireddy et al. 2019):
//
//   g' = g + e          (f32; g converted from f32/f16/bf16)
//   message = C(g')     (the wrapped codec's encode)
//   e  = g' - D(message) (the wrapped codec's decode of the bytes just written)
//
// Residuals never hold non-finite values: an element of e that comes out NaN or Inf is stored
// as 0 (the CUDA path does the same). The Communicator keeps non-finite inputs away
// from error feedback altogether (the nonfinite= policy of compression_spec.h); the guard
// covers finite inputs whose encode overflows.
//
// Summed over steps this telescopes: sum_t D(message_t) + e_T = sum_t g_t (exactly in real
// arithmetic; in f32 up to one rounding of each + and -), so whatever a lossy codec drops is
// delivered later instead of lost.
//
// The decorator always applies error feedback; with ef=off the caller uses the codec directly.
// Receivers decode with the wrapped codec (codec()): messages are the codec's own wire format.
//
// Not thread-safe: it owns a scratch buffer and updates residuals in the store. Use one
// ErrorFeedbackCodec (and one ResidualStore) per thread that encodes.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "compressors/fused_feedback.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"

namespace gradzip::error_feedback {

class ErrorFeedbackCodec {
 public:
  // `codec` must not be null (invalid_argument). `store` must outlive this object.
  // `shared_scratch`, when given, is used instead of a scratch buffer of this object's own, so
  // that short-lived decorators (one per collective call) reuse memory that is already
  // faulted in: fresh pages for a 64 MiB g' cost more than the error-feedback arithmetic.
  // It must outlive this object and not be used by another thread meanwhile.
  ErrorFeedbackCodec(std::shared_ptr<const Codec> codec, ResidualStore& store,
                     std::vector<float>* shared_scratch = nullptr);

  const Codec& codec() const noexcept { return *codec_; }
  ResidualStore& store() const noexcept { return *store_; }

  // The wrapped codec's bound: error feedback does not change the message.
  std::size_t max_encoded_bytes(std::size_t count) const { return codec_->max_encoded_bytes(count); }

  // CUDA tensors (and `out`, `decoded` then in that device's memory) run the same arithmetic
  // on the device (error_feedback/device_feedback.h), the residual staying in
  // the store.
  // Encodes the whole tensor `tensor_name` (grad.count elements, host or CUDA memory, any dtype) with
  // error feedback into `out` (at least max_encoded_bytes(grad.count) bytes) and returns the
  // message size. The tensor starts at element 0, so ctx.element_offset must be 0
  // (invalid_argument otherwise). `grad` must not overlap `out` or the residual.
  // The first call for a name registers a zero residual of grad.count elements; a later call
  // with another count follows the store's ResizePolicy.
  std::size_t encode(std::string_view tensor_name, ConstTensorView grad, std::span<std::byte> out,
                     const EncodeContext& ctx);

  // Encodes one chunk of a tensor of `tensor_count` elements that is sent in several messages.
  // The chunk holds elements [ctx.element_offset, ctx.element_offset + chunk.count) of the
  // tensor: the same offset keys the codec's random draws and selects the slice of the
  // tensor's residual this chunk reads and updates, so one residual of `tensor_count` elements
  // serves all chunks of the tensor. The range must lie inside the tensor (invalid_argument).
  // Chunks may come in any order and with any boundaries from step to step; each element's
  // residual is updated by the chunk that contains it.
  // `decoded`, when not empty (it must then hold chunk.count floats), also receives
  // D(message): the decode the residual update needs anyway, so a caller that keeps the
  // decoded values (a ring owner, a rank decoding its own message) does not decode twice. It
  // may be the chunk's own memory: g + e is formed before anything is written.
  std::size_t encode_chunk(std::string_view tensor_name, std::size_t tensor_count,
                           ConstTensorView chunk, std::span<std::byte> out,
                           const EncodeContext& ctx, std::span<float> decoded = {});

  // Bytes of f32 scratch held (4 x the largest chunk encoded so far). The scratch is reused:
  // after the first call of a given size, encoding allocates nothing here.
  std::size_t scratch_bytes() const noexcept { return scratch().size() * sizeof(float); }
  void release_scratch() noexcept;

 private:
  // encode_chunk's path for codecs that subtract their decode in place (f32 input, no `decoded`
  // wanted; Codec::subtracts_decoded_in_place): g' formed in the residual's memory, then
  // Codec::subtract_decoded. Same message and residual as the general path. (Codecs with a
  // fused encode, compressors/fused_feedback.h, take that before this.)
  std::size_t encode_in_place(const float* g, float* e, std::size_t count,
                              std::span<std::byte> out, const EncodeContext& ctx);

  std::shared_ptr<const Codec> codec_;
  // codec_'s fused encode (compressors/fused_feedback.h), or null; looked up once.
  const compressors::FusedFeedbackEncoder* fused_;
  ResidualStore* store_;
  // g' of the current chunk: the codec's input, kept until the residual update.
  std::vector<float> own_scratch_;
  std::vector<float>* shared_scratch_ = nullptr;
  std::vector<float>& scratch() noexcept { return shared_scratch_ ? *shared_scratch_ : own_scratch_; }
  const std::vector<float>& scratch() const noexcept {
    return shared_scratch_ ? *shared_scratch_ : own_scratch_;
  }
};

}  // namespace gradzip::error_feedback
