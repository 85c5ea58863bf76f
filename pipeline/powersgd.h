// PowerSGD (Vogels et al., 2019) for the matrices of one Reducer bucket group.
//
// For each matrix M (rows x cols, row-major f32: this rank's own gradient, not divided by the
// rank count; the all-reduces below take the average), one step is:
//   M' = M + E                       (E: this rank's error-feedback residual, when spec.ef)
//   P  = M' Q                        (rows x R; Q: cols x R, the same bytes on every rank)
//   all-reduce-average every matrix's P together (one call)
//   orthonormalise P's columns       (modified Gram-Schmidt, dot products and norms summed
//                                     in f64 in index order; a column whose norm after
//                                     projection is at most 1e-5 of its norm before, or
//                                     not finite, is set to zero)
//   Q  = M'^T P                      (cols x R)
//   all-reduce-average every matrix's Q together (one call)
//   M  <- P Q^T                      (the approximation of the average, written in place)
//   E  <- M' - P Q^T                 (when spec.ef)
// Q is kept for the next step (warm start) and is the same on every rank because it is the
// output of an all-reduce. On a matrix's first step Q is drawn from a standard normal
// distribution with Philox on the random stream s = random_stream_of(spec.seed, "powersgd-q:" +
// name) (collectives/random_streams.h; claimed for the lane like a call's name), the same on
// every rank: element k of Q's storage (below) is, computed in f64 and rounded to f32,
//   w = philox_block(s.key, 0, s.tensor_id, k / 4), a = w[2 * ((k / 2) % 2)],
//   b = w[2 * ((k / 2) % 2) + 1], u1 = ((a >> 8) + 1) * 2^-24, u2 = (b >> 8) * 2^-24,
//   sqrt(-2 ln u1) * (k even ? cos(2 pi u2) : sin(2 pi u2))          (Box-Muller).
// A kept column of Q that is all zero (its P column was set to zero, e.g. after a zero
// gradient) or holds an inf / NaN is replaced by that column of the first-step draw, so that it
// does not stay dead for every later step (P = M' Q); the output of the step itself is as above.
// R = min(spec.rank, rows, cols). A matrix with no elements (rows or cols 0) has R = 0: it keeps
// no state and adds nothing to P or Q.
//
// State lives in the lane's residual store (so Reducer::save_state checkpoints it): the residual
// under "powersgd:<name>" (rows * cols values, row-major, only when spec.ef) and Q under
// "powersgd-q:<name>" (cols * R values, column-major: column j is values [j * cols, (j+1) * cols)).
// Both follow spec.ef_resize when a matrix changes shape (reset: a fresh zero residual and a
// fresh first-step Q; error: ErrorCode::size_mismatch).
//
// The two all-reduces run through collectives::allreduce_at_step with codec `none` (error
// feedback off, the spec's seed), ReduceOp::average, names "<group_name>/P" and
// "<group_name>/Q", and `step`; `preset_error` (may be null) is passed to both so that a rank
// that cannot take part fails the calls on every rank. Both calls are made even when no matrix
// has elements (with 0 elements), so every rank makes the same calls whatever it holds.
//
// Errors: this rank's own problems (spec.codec is not powersgd, spec.rank < 1, an empty or
// repeated name, data.size() != rows * cols: ErrorCode::invalid_argument naming the matrix; a
// shape change under ef_resize=error: size_mismatch) are passed as the P call's error, so every
// rank throws (the others name this rank). A rank with an error, preset or own, computes
// nothing and changes no state before the P call throws; the other ranks may have created a
// first step's state (a zero residual, the first Q), which is what their next first step
// creates anyway. When a call throws, the matrices' contents are unspecified; the values of
// residuals and Q change only after both calls succeeded (a reset under ef_resize=reset, or a
// first step's creation, happens before the calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"

namespace gradzip::pipeline {

struct PowerSgdMatrix {
  std::string name;       // the registered tensor's name (keys its residual and Q)
  std::span<float> data;  // rows * cols f32 values, row-major; replaced by the approximation
  std::size_t rows = 0;
  std::size_t cols = 0;
};

// One PowerSGD step over `matrices` (see above). Every rank passes the same names and shapes
// in the same order. Returns the stats of the step: algorithm "powersgd", sent bytes and the
// times of both all-reduces summed (encode_seconds also counts the products with M' and the
// orthonormalisation, decode_seconds the reconstruction and the residual update), count = the
// matrices' elements, compression_ratio = (f32 bytes of the matrices) / (f32 bytes of all P and
// Q), or 1 when there are none, encoded_input_bytes / encoded_message_bytes set accordingly,
// note = "P: <algorithm>, Q: <algorithm>" of the two calls.
CollectiveStats powersgd_allreduce(Communicator& lane,
                                   std::span<const PowerSgdMatrix> matrices,
                                   const CompressionSpec& spec, std::string_view group_name,
                                   std::uint32_t step, const Error* preset_error);

}  // namespace gradzip::pipeline
