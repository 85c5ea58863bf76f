// PowerSGD over one Reducer group (contract in powersgd.h).
//
// Where determinism comes from: the output P Q^T and the kept Q are computed from all-reduced
// bytes only (P after the first all-reduce, Q after the second), which are the same on every
// rank; the two steps that run on them (orthonormalise_columns, reconstruct) are plain loops
// with a fixed summation order, so every rank gets the same bits. The products with M' (this
// rank's own data) run through Eigen: their results differ between ranks anyway and reach the
// others only through the all-reduces.
#include "pipeline/powersgd.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/communicator_internal.h"
#include "collectives/random_streams.h"
#include "kernels/philox_math.h"

namespace gradzip::pipeline {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColumnMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// A column whose norm after projection is at most this fraction of its norm before (it lay in
// the span of the earlier columns, up to f32 rounding) is set to zero (powersgd.h). Relative,
// so that the scale of the gradient does not decide whether a direction survives.
constexpr double kDependentColumnFraction = 1e-5;

// Where one matrix's factors sit in the packed P and Q buffers (both column-major).
struct FactorLayout {
  std::size_t rank = 0;      // R = min(spec.rank, rows, cols); 0 for an empty matrix
  std::size_t p_offset = 0;  // rows * R values from here
  std::size_t q_offset = 0;  // cols * R values from here
};

std::string residual_key(std::string_view name) { return "powersgd:" + std::string(name); }
std::string q_key(std::string_view name) { return "powersgd-q:" + std::string(name); }

// Element k of the first Q of a tensor (powersgd.h: Box-Muller over Philox, computed in f64).
float initial_q_element(const collectives::RandomStream& stream, std::size_t k) {
  const kernels::Philox4x32 block = kernels::philox_block(stream.key, 0, stream.tensor_id, k >> 2);
  const std::size_t pair = (k >> 1) & 1;
  const double u1 = (static_cast<double>(block.v[2 * pair] >> 8) + 1.0) * 0x1p-24;  // (0, 1]
  const double u2 = static_cast<double>(block.v[2 * pair + 1] >> 8) * 0x1p-24;      // [0, 1)
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * 3.14159265358979323846 * u2;
  return static_cast<float>((k & 1) != 0 ? radius * std::sin(angle) : radius * std::cos(angle));
}

// Elements [begin, end) of a kept Q set to the first Q's values.
void draw_initial_q(std::span<float> q, std::uint64_t seed, std::string_view name,
                    std::size_t begin, std::size_t end) {
  const collectives::RandomStream stream = collectives::random_stream_of(seed, q_key(name));
  for (std::size_t k = begin; k < end; ++k) q[k] = initial_q_element(stream, k);
}

// True when Q's column (`count` values) can no longer carry a direction: all zero (P's column
// was set to zero, e.g. after a zero gradient) or holding an inf / NaN. Such a column would
// stay dead or poisoned for every later step, since P = M' Q.
bool dead_column(const float* column, std::size_t count) {
  bool all_zero = true;
  for (std::size_t i = 0; i < count; ++i) {
    if (!std::isfinite(column[i])) return true;
    all_zero = all_zero && column[i] == 0.0f;
  }
  return all_zero;
}

// Checks what one rank can check alone; the first problem is thrown as invalid_argument.
void validate(std::span<const PowerSgdMatrix> matrices, const CompressionSpec& spec,
              std::string_view group_name) {
  GZ_REQUIRE(spec.codec == CodecKind::powersgd, ErrorCode::invalid_argument, "powersgd of '",
             group_name, "': the spec '", spec.to_string(), "' is not a powersgd spec");
  GZ_REQUIRE(spec.rank >= 1, ErrorCode::invalid_argument, "powersgd of '", group_name,
             "': rank ", spec.rank, " is not >= 1");
  std::set<std::string_view> names;
  for (const PowerSgdMatrix& matrix : matrices) {
    GZ_REQUIRE(!matrix.name.empty(), ErrorCode::invalid_argument, "powersgd of '", group_name,
               "': a matrix has an empty name (it keys the residual and Q)");
    GZ_REQUIRE(names.insert(matrix.name).second, ErrorCode::invalid_argument, "powersgd of '",
               group_name, "': matrix '", matrix.name, "' is given twice");
    GZ_REQUIRE(matrix.cols == 0 || matrix.rows <= std::numeric_limits<std::size_t>::max() / matrix.cols,
               ErrorCode::invalid_argument, "powersgd of '", group_name, "': matrix '",
               matrix.name, "' has ", matrix.rows, " x ", matrix.cols, " elements, beyond size_t");
    GZ_REQUIRE(matrix.data.size() == matrix.rows * matrix.cols, ErrorCode::invalid_argument,
               "powersgd of '", group_name, "': matrix '", matrix.name, "' is ", matrix.rows,
               " x ", matrix.cols, " = ", matrix.rows * matrix.cols, " elements but its data has ",
               matrix.data.size());
  }
}

// Layouts of every matrix; the totals land in p_count and q_count. Depends on the shapes and
// spec.rank only, so every rank that passes the same shapes gets the same buffers.
std::vector<FactorLayout> layout_factors(std::span<const PowerSgdMatrix> matrices,
                                         const CompressionSpec& spec, std::size_t& p_count,
                                         std::size_t& q_count) {
  std::vector<FactorLayout> layouts(matrices.size());
  p_count = 0;
  q_count = 0;
  const std::size_t spec_rank = static_cast<std::size_t>(std::max(spec.rank, 0));
  for (std::size_t m = 0; m < matrices.size(); ++m) {
    const PowerSgdMatrix& matrix = matrices[m];
    layouts[m].rank = std::min({spec_rank, matrix.rows, matrix.cols});
    layouts[m].p_offset = p_count;
    layouts[m].q_offset = q_count;
    p_count += matrix.rows * layouts[m].rank;
    q_count += matrix.cols * layouts[m].rank;
  }
  return layouts;
}

// Modified Gram-Schmidt on the columns of `p` (rows x rank, column-major) in place. Dot
// products and norms accumulate in f64 in index order: the result is a fixed function of the
// input bytes, and a loop over rows * rank^2 terms is cheap next to the products with M'.
void orthonormalise_columns(float* p, std::size_t rows, std::size_t rank) {
  const auto norm_of = [rows](const float* column) {
    double squares = 0.0;
    for (std::size_t i = 0; i < rows; ++i) squares += static_cast<double>(column[i]) * column[i];
    return std::sqrt(squares);
  };
  for (std::size_t j = 0; j < rank; ++j) {
    float* column = p + j * rows;
    const double norm_before = norm_of(column);
    for (std::size_t k = 0; k < j; ++k) {
      const float* basis = p + k * rows;
      double dot = 0.0;
      for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(basis[i]) * column[i];
      const float projection = static_cast<float>(dot);
      for (std::size_t i = 0; i < rows; ++i) column[i] -= projection * basis[i];
    }
    const double norm = norm_of(column);
    // Also catches zero, inf and NaN columns: they carry no direction.
    if (!(norm > kDependentColumnFraction * norm_before) || !std::isfinite(norm)) {
      std::fill(column, column + rows, 0.0f);
      continue;
    }
    const float inverse = static_cast<float>(1.0 / norm);
    for (std::size_t i = 0; i < rows; ++i) column[i] *= inverse;
  }
}

// out (rows x cols, row-major) = P Q^T with P rows x rank and Q cols x rank, both column-major.
// Each element sums its rank terms in order j = 0, 1, ... (the inner loop runs over the output
// row, so it vectorises without reassociating any sum).
void reconstruct(const float* p, const float* q, std::size_t rows, std::size_t cols,
                 std::size_t rank, float* out) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* out_row = out + i * cols;
    std::fill(out_row, out_row + cols, 0.0f);
    for (std::size_t j = 0; j < rank; ++j) {
      const float p_ij = p[j * rows + i];
      const float* q_column = q + j * cols;
      for (std::size_t c = 0; c < cols; ++c) out_row[c] += p_ij * q_column[c];
    }
  }
}

// The spec of the P and Q all-reduces: uncompressed, no error feedback, the step's seed.
CompressionSpec factor_allreduce_spec(std::uint64_t seed) {
  CompressionSpec dense;
  dense.codec = CodecKind::none;
  dense.error_feedback = false;
  dense.seed = seed;
  return dense;
}

void add_call(CollectiveStats& total, const CollectiveStats& call) {
  total.sent_header_bytes += call.sent_header_bytes;
  total.sent_index_bytes += call.sent_index_bytes;
  total.sent_payload_bytes += call.sent_payload_bytes;
  total.received_bytes += call.received_bytes;
  total.encode_seconds += call.encode_seconds;
  total.communicate_seconds += call.communicate_seconds;
  total.decode_seconds += call.decode_seconds;
}

// The step, with `stats` filled as it goes (the caller times the whole of it).
void run_powersgd(Communicator& lane, std::span<const PowerSgdMatrix> matrices,
                  const CompressionSpec& spec, std::string_view group_name, std::uint32_t step,
                  const Error* preset_error, CollectiveStats& stats) {
  std::optional<Error> local_error;
  try {
    validate(matrices, spec, group_name);
  } catch (const Error& error) {
    local_error = error;
  }

  std::size_t p_count = 0;
  std::size_t q_count = 0;
  const std::vector<FactorLayout> layouts = layout_factors(matrices, spec, p_count, q_count);
  for (const PowerSgdMatrix& matrix : matrices) stats.count += matrix.rows * matrix.cols;
  stats.encoded_input_bytes = 4 * static_cast<std::uint64_t>(stats.count);
  stats.encoded_message_bytes = 4 * static_cast<std::uint64_t>(p_count + q_count);
  stats.compression_ratio =
      stats.encoded_message_bytes == 0
          ? 1.0
          : static_cast<double>(stats.encoded_input_bytes) / static_cast<double>(stats.encoded_message_bytes);

  // With an error the calls only fail, so they get no buffers (sizes from bad shapes could be
  // anything; the call check reports the argument error before comparing counts).
  std::vector<float> p_all(local_error ? 0 : p_count, 0.0f);
  std::vector<float> q_all(local_error ? 0 : q_count, 0.0f);
  // Per matrix: its residual (empty without error feedback) and its kept Q.
  std::vector<std::span<float>> residuals(matrices.size());
  std::vector<std::span<float>> kept_q(matrices.size());

  // State and P, unless the call is going to fail anyway: then nothing here runs and the P
  // all-reduce below throws on every rank. A failure getting the state (a size change under
  // ef_resize=error) becomes this rank's error in the same way.
  if (!local_error && preset_error == nullptr) {
    try {
      error_feedback::ResidualStore& store = collectives::residuals_of(lane);
      store.set_resize_policy(spec.ef_resize);
      const std::string who = "powersgd of '" + std::string(group_name) + "'";  // once per step
      for (std::size_t m = 0; m < matrices.size(); ++m) {
        const PowerSgdMatrix& matrix = matrices[m];
        const std::size_t rank = layouts[m].rank;
        if (rank == 0) continue;  // empty: no state, nothing to send
        if (spec.error_feedback) residuals[m] = store.residual(residual_key(matrix.name), matrix.data.size());
        const std::string key = q_key(matrix.name);
        collectives::claim_random_stream(lane, spec.seed, key, who);
        const bool fresh = !store.contains(key) || store.residual(key).size() != matrix.cols * rank;
        kept_q[m] = store.residual(key, matrix.cols * rank);
        if (fresh) draw_initial_q(kept_q[m], spec.seed, matrix.name, 0, kept_q[m].size());
      }
    } catch (const Error& error) {
      local_error = error;
    }
  }
  if (!local_error && preset_error == nullptr) {
    const collectives::StageTimer encode(stats, collectives::Stage::encode);
    for (std::size_t m = 0; m < matrices.size(); ++m) {
      const PowerSgdMatrix& matrix = matrices[m];
      const std::size_t rank = layouts[m].rank;
      if (rank == 0) continue;
      // M' = M + E, in place: the data is replaced by the approximation at the end anyway.
      for (std::size_t i = 0; i < residuals[m].size(); ++i) matrix.data[i] += residuals[m][i];
      const Eigen::Map<const RowMajorMatrix> gradient(matrix.data.data(), matrix.rows, matrix.cols);
      const Eigen::Map<const ColumnMajorMatrix> q(kept_q[m].data(), matrix.cols, rank);
      Eigen::Map<ColumnMajorMatrix> p(p_all.data() + layouts[m].p_offset, matrix.rows, rank);
      p.noalias() = gradient * q;
    }
  }

  const CompressionSpec dense = factor_allreduce_spec(spec.seed);
  const Error* p_error = preset_error != nullptr ? preset_error : (local_error ? &*local_error : nullptr);
  const std::string group(group_name);
  const CollectiveStats p_stats =
      collectives::allreduce_at_step(lane, host_view(p_all.data(), p_all.size()), group + "/P",
                                     dense, ReduceOp::average, step, p_error);
  add_call(stats, p_stats);
  // The call check throws on every rank when any rank had an error; this only guards that.
  if (p_error != nullptr) throw *p_error;

  {
    const collectives::StageTimer encode(stats, collectives::Stage::encode);
    for (std::size_t m = 0; m < matrices.size(); ++m) {
      const PowerSgdMatrix& matrix = matrices[m];
      const std::size_t rank = layouts[m].rank;
      if (rank == 0) continue;
      float* p = p_all.data() + layouts[m].p_offset;
      orthonormalise_columns(p, matrix.rows, rank);
      const Eigen::Map<const RowMajorMatrix> gradient(matrix.data.data(), matrix.rows, matrix.cols);
      const Eigen::Map<const ColumnMajorMatrix> p_hat(p, matrix.rows, rank);
      Eigen::Map<ColumnMajorMatrix> q(q_all.data() + layouts[m].q_offset, matrix.cols, rank);
      q.noalias() = gradient.transpose() * p_hat;
    }
  }

  const CollectiveStats q_stats =
      collectives::allreduce_at_step(lane, host_view(q_all.data(), q_all.size()), group + "/Q",
                                     dense, ReduceOp::average, step, preset_error);
  add_call(stats, q_stats);
  stats.note = "P: " + p_stats.algorithm + ", Q: " + q_stats.algorithm;

  const collectives::StageTimer decode(stats, collectives::Stage::decode);
  for (std::size_t m = 0; m < matrices.size(); ++m) {
    const PowerSgdMatrix& matrix = matrices[m];
    const std::size_t rank = layouts[m].rank;
    if (rank == 0) continue;
    const float* q = q_all.data() + layouts[m].q_offset;
    std::copy(q, q + kept_q[m].size(), kept_q[m].begin());
    for (std::size_t j = 0; j < rank; ++j)
      if (dead_column(q + j * matrix.cols, matrix.cols))
        draw_initial_q(kept_q[m], spec.seed, matrix.name, j * matrix.cols, (j + 1) * matrix.cols);
    // E = M' - P Q^T: keep M' in the residual before the data is overwritten.
    const std::span<float> residual = residuals[m];
    std::copy(matrix.data.begin(), matrix.data.begin() + residual.size(), residual.begin());
    reconstruct(p_all.data() + layouts[m].p_offset, q, matrix.rows, matrix.cols, rank,
                matrix.data.data());
    for (std::size_t i = 0; i < residual.size(); ++i) residual[i] -= matrix.data[i];
  }
}

}  // namespace

CollectiveStats powersgd_allreduce(Communicator& lane,
                                   std::span<const PowerSgdMatrix> matrices,
                                   const CompressionSpec& spec, std::string_view group_name,
                                   std::uint32_t step, const Error* preset_error) {
  CollectiveStats stats;
  stats.algorithm = "powersgd";
  stats.spec = spec.to_string();
  stats.ranks = lane.size();
  {
    const collectives::StageTimer total(stats, collectives::Stage::total);
    run_powersgd(lane, matrices, spec, group_name, step, preset_error, stats);
  }
  return stats;
}

}  // namespace gradzip::pipeline
