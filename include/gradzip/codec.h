// The codec interface: a stateless transform between a gradient chunk and a self-describing
// encoded message (the wire format, see compressors/wire_format.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "gradzip/compression_spec.h"
#include "gradzip/tensor_view.h"

namespace gradzip {

// What makes stochastic choices reproducible. Stochastic rounding and random-k draw from
// Philox 4x32-10 keyed by `seed`, with the counter built from (element index, step, tensor id),
// so every rank, and the CPU and the GPU, draw the same numbers for the same element.
struct EncodeContext {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t tensor_id = 0;
  // Index of the chunk's first element inside its tensor. Element-wise draws (qsgd's
  // stochastic rounding) are keyed by the global element index, so a tensor encoded in chunks
  // draws the same numbers as the whole tensor encoded at once. Random-k picks k per chunk from
  // counters offset by this value, so chunks of one tensor never share draws, but a chunked
  // tensor keeps a different selection than the same tensor sent whole.
  std::uint64_t element_offset = 0;
};

// Tensors on a CUDA device (TensorView::device.kind == DeviceKind::cuda), in builds with CUDA:
// encode, decode and decode_add run the kernels of kernels/cuda/ and write the same message
// bytes and decoded bits as the host code (the GPU tests check this byte for byte). Then
//   - the message (encode's `out`, decode's `in`) is device memory on the tensor's device; a
//     host buffer there is refused (invalid_argument), and so is a view on another device;
//   - the work runs on the legacy default stream of that device, which orders it after all
//     earlier work of blocking streams, and the call returns when it is done (encode returns
//     the size, decoders report a malformed message, like the host calls);
//   - scratch memory comes from the device's stream-ordered pool (cudaMallocAsync) per call.
// A build without CUDA refuses CUDA tensors with ErrorCode::unsupported.
class Codec {
 public:
  virtual ~Codec() = default;

  // The spec this codec was made from, and its canonical string.
  virtual const CompressionSpec& spec() const noexcept = 0;
  std::string name() const { return spec().to_string(); }

  // Upper bound of encode()'s result for `count` elements (header included).
  virtual std::size_t max_encoded_bytes(std::size_t count) const = 0;

  // Encodes `in` (host memory; f32, f16 or bf16) into `out`, which must hold at least
  // max_encoded_bytes(in.count) bytes. Returns the bytes written: header plus payload.
  // Deterministic: the same input, spec and context give the same bytes.
  virtual std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                             const EncodeContext& ctx) const = 0;

  // Decodes the message `in` (exactly one message, no trailing bytes) into `out`, whose count
  // must equal the message's element count. f16/bf16 outputs are rounded to nearest even.
  // Every header field is validated first; a bad message throws ErrorCode::malformed_message
  // and leaves `out` untouched.
  virtual void decode(std::span<const std::byte> in, TensorView out) const = 0;

  // acc[i] += decoded[i] for i < count, with the same validation as decode(). `acc` is host
  // memory.
  virtual void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const = 0;
  // The same for an f32 accumulator anywhere (host or CUDA). The default serves host views.
  virtual void decode_add(std::span<const std::byte> in, TensorView acc) const;

  // Error feedback's residual update for a message of this codec (error_feedback/
  // error_feedback_codec.h): residual[i] = finite_or_zero(residual[i] - decoded[i]) for every
  // element whose decoded value is not +0.0, where finite_or_zero turns NaN and Inf into 0.
  // Elements whose decoded value is +0.0 may be left as they are: for a finite residual that is
  // the same update (x - (+0.0) == x), so a caller whose residual is all finite gets exactly
  // decode-then-subtract. Same validation as decode(); a bad message throws
  // ErrorCode::malformed_message and leaves `residual` untouched. `residual` is host memory.
  // The default decodes into a temporary and updates every element; a sparse codec touches
  // only the entries its message carries, which saves error feedback a full decode.
  virtual void subtract_decoded(std::span<const std::byte> in, float* residual,
                                std::size_t count) const;
  // True when subtract_decoded needs no memory of its own (it touches only the carried entries,
  // or decodes block by block into a fixed buffer): error feedback then updates the residual in
  // place instead of decoding the whole message into scratch (error_feedback_codec.h).
  virtual bool subtracts_decoded_in_place() const noexcept { return false; }

  // True when payloads of equal-length messages can be summed without decoding
  // (casts, shared-seed random-k).
  virtual bool additive() const noexcept = 0;

  // True when the payload carries indices (top-k).
  virtual bool sparse() const noexcept = 0;
};

// Creates the codec a spec names. Throws ErrorCode::unsupported for `powersgd`, which is a
// Reducer-level compressor working on whole matrices rather than on element chunks.
std::unique_ptr<Codec> make_codec(const CompressionSpec& spec);
std::unique_ptr<Codec> make_codec(std::string_view spec);

}  // namespace gradzip
