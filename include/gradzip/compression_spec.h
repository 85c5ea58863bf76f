// One string configures a codec and its policies, the same from C++, Python, the CLI and
// GRADZIP_COMPRESSOR. Grammar:
//
//   spec   := codec [ ':' option { ',' option } ]
//   option := key '=' value
//   codec  := none | fp16 | bf16 | qsgd | sign | topk | randk | powersgd | terngrad | fp8
//             (gradzip/codec_list.h)
//
// Codec keys (defaults in brackets):
//   qsgd      bits=1..8 [8], bucket=N [512]
//   sign      bucket=N [512]
//   topk      ratio=(0,1] [0.01] | k=N, approx=on|off [off], values=fp32|fp16 [fp32],
//             ramp=STEPS [0]
//   randk     ratio=(0,1] [0.01] | k=N, values=fp32|fp16 [fp32], ramp=STEPS [0]
// ramp (Reducer only): after warm-up the ratio falls geometrically from 0.25 to `ratio` over
// STEPS steps (DGC's exponential sparsity warm-up); 0 = the target ratio from the start.
//   powersgd  rank=N [4]
//   terngrad  bucket=N [512]   (TernGrad: {-1, 0, +1} x the bucket's max |x|, unbiased)
//   fp8       format=e4m3|e5m2 [e4m3]   (8-bit floats, a power-of-two scale per block of 32)
// Shared keys, accepted after every codec:
//   ef=on|off            error feedback [on for sign, topk, randk, powersgd; off otherwise]
//   ef_resize=error|reset what the residual store does when a tensor changes size [error]
//   algo=auto|ring|sra|sparse|hier|rhd|tree  collective algorithm [auto]; sparse = the sparse
//                        all-reduce (algo=allgather, its former name, is accepted as an alias);
//                        rhd = recursive halving/doubling, tree = binomial tree (all-reduce
//                        only); auto: the cost model's choice (collectives/algorithm_choice.h)
//   warmup=STEPS         dense steps before compression starts [0]
//   min_bytes=N          with algo=auto, tensors smaller than this go uncompressed through the
//                        transport's own all-reduce [65536]
//   seed=N               seed of the counter-based generator [0]
//   ranks_per_node=L     hierarchical all-reduce: L consecutive ranks form a node; 0 = detect
//                        nodes from shared memory [0]
//   nonfinite=propagate|error|skip  what a collective does when any rank's input holds a NaN
//                        or Inf (every rank counts its own before the call check, or on the
//                        device during a stream-ordered call on a CUDA tensor, which is then
//                        undone and run again; all ranks decide together) [propagate]:
//                          propagate: reduced uncompressed (the transport's sum; the ring
//                                     without a codec for reduce-scatter / all-gather), error
//                                     feedback neither added nor updated: the NaN / Inf land
//                                     where a plain all-reduce puts them, on every rank;
//                          skip:      nothing moves, the tensor is zeros on every rank,
//                                     residuals untouched, CollectiveStats::skipped is set;
//                          error:     every rank throws ErrorCode::nonfinite naming the ranks,
//                                     counts and first indices; the tensor is left as passed
//   fallback=off|dense   algo=auto only [off]; dense: when the cost model predicts that the
//                        transport's own uncompressed f32 all-reduce of a tensor is no slower
//                        on this link than the compressed path it would choose, the tensor goes
//                        dense, with the error-feedback residual (all of its roles) added to
//                        it and zeroed, so nothing is lost; CollectiveStats::fallback is set
//                        and the note gives both predictions. Host tensors only (the model's γ
//                        is the CPU's): CUDA tensors always compress. Refused with an explicit
//                        algo= and for powersgd. All-reduce only (reduce-scatter and
//                        all-gather always compress). to_string() writes it only when dense.
//   segment=BYTES        pipelining inside one call [65536]: the ring and SRA (all-reduce and
//                        reduce-scatter, host tensors over MPI) cut each chunk into segments whose
//                        messages hold about BYTES bytes (the ring into at most 8), so that the
//                        encode of one segment overlaps the transfer and decode of the ones
//                        before. Cuts fall on
//                        whole buckets and code bytes, so the result and the residuals are bit
//                        for bit those of the unsegmented call; each extra segment adds one
//                        32-byte header per message. The sparse all-reduce (top-k's default,
//                        whose message is never cut) instead decodes each rank's message as it
//                        arrives, overlapping the others' transfers (same bytes, same bits).
//                        0: one message per chunk and no overlap in either. The 64 KiB
//                        default keeps each message within Open MPI's TCP eager limit, which
//                        lets it travel while the sender encodes the next one (docs/results.md).
//                        to_string() writes it only when it is not the default.
//
// Unknown codecs, unknown keys, repeated keys and bad values throw gradzip::Error
// (ErrorCode::invalid_spec) naming what was wrong and listing what is accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradzip/algorithm_list.h"
#include "gradzip/codec_list.h"
#include "gradzip/dtype.h"

namespace gradzip {

// One enumerator per codec of gradzip/codec_list.h, in its order.
#define GRADZIP_CODEC_KIND(name, wire_id) name,
enum class CodecKind : std::uint8_t { GRADZIP_CODECS(GRADZIP_CODEC_KIND) };
#undef GRADZIP_CODEC_KIND
// sparse: the sparse all-reduce (every rank's whole compressed message all-gathered, the decoded
// messages summed; top-k's default). `allgather` is its former name, kept so that existing code
// compiles.
// One enumerator per algo= value of gradzip/algorithm_list.h, in its order.
#define GRADZIP_ALGORITHM_ENUMERATOR(value, name) value,
enum class Algorithm : std::uint8_t {
  GRADZIP_ALGORITHMS(GRADZIP_ALGORITHM_ENUMERATOR)
  allgather [[deprecated("the sparse all-reduce is Algorithm::sparse")]] = sparse,
};
#undef GRADZIP_ALGORITHM_ENUMERATOR
enum class ResizePolicy : std::uint8_t { error, reset };
enum class NonfinitePolicy : std::uint8_t { propagate, error, skip };
enum class FallbackPolicy : std::uint8_t { off, dense };

std::string_view codec_kind_name(CodecKind kind) noexcept;
// The algo= name of `algo` (gradzip/algorithm_list.h); "unknown" for a value outside the list.
constexpr std::string_view algorithm_name(Algorithm algo) noexcept {
#define GRADZIP_ALGORITHM_NAME(value, name) \
  if (algo == Algorithm::value) return name;
  GRADZIP_ALGORITHMS(GRADZIP_ALGORITHM_NAME)
#undef GRADZIP_ALGORITHM_NAME
  return "unknown";
}
std::string_view nonfinite_policy_name(NonfinitePolicy policy) noexcept;
std::string_view fallback_policy_name(FallbackPolicy policy) noexcept;

// The `segment` key's default: 64 KiB messages.
inline constexpr std::size_t kDefaultSegmentBytes = 65536;

struct CompressionSpec {
  CodecKind codec = CodecKind::none;

  // qsgd, sign, terngrad
  int bits = 8;
  std::size_t bucket = 512;

  // topk, randk: k = ceil(ratio * n) unless k is given explicitly (k > 0).
  double ratio = 0.01;
  std::size_t k = 0;
  bool approx = false;
  DType values = DType::f32;  // value precision on the wire: f32 or f16
  std::uint32_t ramp = 0;     // Reducer: steps of the geometric ratio ramp after warm-up

  // powersgd
  int rank = 4;

  // A codec's choice among its own element formats, set by its format= key (0: its default);
  // the codec's row names the values.
  std::uint8_t format = 0;

  // shared
  bool error_feedback = false;
  ResizePolicy ef_resize = ResizePolicy::error;
  Algorithm algo = Algorithm::auto_select;
  std::uint32_t warmup = 0;
  std::size_t min_bytes = 65536;
  std::uint64_t seed = 0;
  std::uint32_t ranks_per_node = 0;
  NonfinitePolicy nonfinite = NonfinitePolicy::propagate;
  FallbackPolicy fallback = FallbackPolicy::off;
  std::size_t segment_bytes = kDefaultSegmentBytes;

  // Parses a spec string (grammar above). Throws gradzip::Error on any bad input.
  static CompressionSpec parse(std::string_view text);

  // Canonical string: parse(to_string()) == *this, keys in a fixed order, every key written
  // but fallback, written only when it is dense, and segment, written only when it is not the
  // default.
  std::string to_string() const;

  // Number of entries top-k / random-k keep out of n: 0 when n == 0, else clamped to [1, n].
  std::size_t k_for(std::size_t n) const noexcept;

  bool operator==(const CompressionSpec&) const = default;
};

}  // namespace gradzip
