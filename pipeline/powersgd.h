// PowerSGD (Vogels et al., 2019) for the matrices of one Reducer bucket group.
//
// For each matrix M (rows x cols, row-major f32: this rank's own gradient, not divided by the
// rank count; the all-reduces below take the average), one step is:
//   M' = M + E                       (E: this rank's error-feedback residual, when spec.ef)
//   P  = M' Q                        (rows x R; Q: cols x R, the same bytes on every rank)
//   all-reduce-average every matrix's P together (one call)
//   orthonormalise P's columns       (modified Gram-Schmidt; a column whose norm falls
//                                     under 1e-8 after projection is set to zero)
//   Q  = M'^T P                      (cols x R)
//   all-reduce-average every matrix's Q together (one call)
//   M  <- P Q^T                      (the approximation of the average, written in place)
//   E  <- M' - P Q^T                 (when spec.ef)
// Q is kept for the next step (warm start) and is the same on every rank because it is the
// output of an all-reduce. On a matrix's first step Q is drawn from a standard normal
// distribution with Philox keyed by (spec.seed, tensor_id_of(name)), the same on every rank.
// R = min(spec.rank, rows, cols).
//
// State lives in the lane's residual store (so Reducer::save_state checkpoints it): the residual
// under "powersgd:<name>" (rows * cols values) and Q under "powersgd-q:<name>" (cols * R).
//
// The two all-reduces run through collectives::allreduce_at_step with codec `none` (error
// feedback off, the spec's seed), ReduceOp::average, names "<group_name>/P" and
// "<group_name>/Q", and `step`; `preset_error` (may be null) is passed to both so that a rank
// that cannot take part fails the calls on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "collectives/communicator_state.h"
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
// times of both all-reduces summed, compression_ratio = (f32 bytes of the matrices) / (f32
// bytes of all P and Q), encoded_input_bytes / encoded_message_bytes set accordingly.
CollectiveStats powersgd_allreduce(collectives::CommunicatorState& lane,
                                   std::span<const PowerSgdMatrix> matrices,
                                   const CompressionSpec& spec, std::string_view group_name,
                                   std::uint32_t step, const Error* preset_error);

}  // namespace gradzip::pipeline
