// Error feedback fused into a codec's encode: one pass over g and e, block by block, instead of
// error_feedback_codec.cpp's three (g + e, encode, residual update). A codec implements it
// when its message can be produced block by block (sign, qsgd: buckets; the casts) and its
// decode of a block needs only that block's part of the message, or (top-k) when it can form
// g' inside its own first pass over the data and update the residual from the message
// sparsely; error_feedback_codec.cpp asks for it with a dynamic_cast and falls back to its
// general path when the codec does not implement it or declines.
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "gradzip/codec.h"

namespace gradzip::compressors {

class FusedFeedbackEncoder {
 public:
  virtual ~FusedFeedbackEncoder() = default;

  // g and e: host f32 arrays of `count` elements (e is the residual, updated in place; neither
  // overlaps `out`, which holds at least max_encoded_bytes(count)). Writes into `out` exactly
  // the message encode() writes for g' = g + e (f32 adds, element by element), sets every
  // e[i] = finite_or_zero(g'[i] - D(message)[i]) (the general path's residual, bit for bit),
  // and returns the message size. std::nullopt, with nothing written, when this spec cannot
  // run fused (e.g. buckets too large for a block held in cache); the caller then runs the
  // general path.
  virtual std::optional<std::size_t> encode_with_feedback(const float* g, float* e,
                                                          std::size_t count,
                                                          std::span<std::byte> out,
                                                          const EncodeContext& ctx) const = 0;
};

}  // namespace gradzip::compressors
