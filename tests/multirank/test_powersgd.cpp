// PowerSGD (pipeline/powersgd.h) under mpirun (np 1..5): exact reconstruction of rank-R
// averages, error feedback's running sum over steps, warm start against an f64 reference of the
// power iteration, the documented first Q, state, errors on one rank failing every rank, stats.
//
// Tolerances. Where the result is lossy in f32 the tests compare with an f64 reference of the
// same step (ReferenceStep, below) and a first-order bound on how far the f32 step can drift
// from it, computed from the test's own data; the derivation is next to the code. Every rank
// generates every rank's inputs, so the reference and its bound are computed locally.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator_internal.h"
#include "collectives/random_streams.h"
#include "error_feedback/residual_store.h"
#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "kernels/philox_math.h"
#include "pipeline/powersgd.h"
#include "tests/multirank/multirank_support.h"

namespace gradzip {
namespace {

using pipeline::PowerSgdMatrix;
using testing::identical_on_all_ranks;
using testing::world_rank;
using testing::world_size;

constexpr double kUnitRoundoff = 0x1p-24;  // f32 round to nearest

// Higham's gamma_n = n u / (1 - n u): the relative error bound of n f32 roundings in a row.
double gamma_n(std::size_t n) {
  const double nu = static_cast<double>(n) * kUnitRoundoff;
  return nu / (1.0 - nu);
}

// ---- f64 matrices for the references --------------------------------------------------------

struct Mat {
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<double> values;  // row-major

  Mat(std::size_t r, std::size_t c) : rows(r), cols(c), values(r * c, 0.0) {}
  double& operator()(std::size_t i, std::size_t j) { return values[i * cols + j]; }
  double operator()(std::size_t i, std::size_t j) const { return values[i * cols + j]; }
};

Mat from_row_major(std::span<const float> data, std::size_t rows, std::size_t cols) {
  Mat m(rows, cols);
  for (std::size_t i = 0; i < data.size(); ++i) m.values[i] = data[i];
  return m;
}

// Q as the residual store keeps it: cols x R, column-major.
Mat from_column_major(std::span<const float> data, std::size_t rows, std::size_t cols) {
  Mat m(rows, cols);
  for (std::size_t j = 0; j < cols; ++j)
    for (std::size_t i = 0; i < rows; ++i) m(i, j) = data[j * rows + i];
  return m;
}

Mat multiply(const Mat& a, const Mat& b) {
  Mat c(a.rows, b.cols);
  for (std::size_t i = 0; i < a.rows; ++i)
    for (std::size_t k = 0; k < a.cols; ++k)
      for (std::size_t j = 0; j < b.cols; ++j) c(i, j) += a(i, k) * b(k, j);
  return c;
}

Mat transpose(const Mat& a) {
  Mat t(a.cols, a.rows);
  for (std::size_t i = 0; i < a.rows; ++i)
    for (std::size_t j = 0; j < a.cols; ++j) t(j, i) = a(i, j);
  return t;
}

Mat absolute(Mat a) {
  for (double& v : a.values) v = std::abs(v);
  return a;
}

Mat subtract(Mat a, const Mat& b) {
  for (std::size_t i = 0; i < a.values.size(); ++i) a.values[i] -= b.values[i];
  return a;
}

double frobenius(const Mat& a) {
  double squares = 0.0;
  for (double v : a.values) squares += v * v;
  return std::sqrt(squares);
}

struct Orthonormal {
  Mat basis;               // Q factor: the input's columns orthonormalised by MGS
  double sigma_min_lower;  // a lower bound of the input's smallest singular value (0: rank-deficient)
};

// MGS in f64. With input = basis * T (T upper triangular), sigma_min(input) = 1 / ||T^-1||_2
// >= 1 / ||T^-1||_F; T^-1 comes from back substitution.
Orthonormal orthonormalise(const Mat& input) {
  const std::size_t k = input.cols;
  Mat basis = input;
  Mat t(k, k);
  for (std::size_t j = 0; j < k; ++j) {
    for (std::size_t l = 0; l < j; ++l) {
      double dot = 0.0;
      for (std::size_t i = 0; i < basis.rows; ++i) dot += basis(i, l) * basis(i, j);
      t(l, j) = dot;
      for (std::size_t i = 0; i < basis.rows; ++i) basis(i, j) -= dot * basis(i, l);
    }
    double squares = 0.0;
    for (std::size_t i = 0; i < basis.rows; ++i) squares += basis(i, j) * basis(i, j);
    t(j, j) = std::sqrt(squares);
    if (t(j, j) == 0.0) return {basis, 0.0};
    for (std::size_t i = 0; i < basis.rows; ++i) basis(i, j) /= t(j, j);
  }
  Mat inverse(k, k);
  for (std::size_t c = 0; c < k; ++c)
    for (std::size_t i = c + 1; i-- > 0;) {
      double x = i == c ? 1.0 : 0.0;
      for (std::size_t l = i + 1; l <= c; ++l) x -= t(i, l) * inverse(l, c);
      inverse(i, c) = x / t(i, i);
    }
  return {basis, 1.0 / frobenius(inverse)};
}

// The first Q of a tensor, exactly as powersgd.h documents it (cols x R, element k of the
// column-major storage), with the same f64 expressions as the implementation so that the
// floats are the same.
std::vector<float> documented_first_q(std::uint64_t seed, const std::string& name,
                                      std::size_t cols, std::size_t rank) {
  const collectives::RandomStream stream = collectives::random_stream_of(seed, "powersgd-q:" + name);
  std::vector<float> q(cols * rank);
  for (std::size_t k = 0; k < q.size(); ++k) {
    const kernels::Philox4x32 w = kernels::philox_block(stream.key, 0, stream.tensor_id, k / 4);
    const std::uint32_t a = w.v[2 * ((k / 2) % 2)];
    const std::uint32_t b = w.v[2 * ((k / 2) % 2) + 1];
    const double u1 = (static_cast<double>(a >> 8) + 1.0) * 0x1p-24;
    const double u2 = static_cast<double>(b >> 8) * 0x1p-24;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * 3.14159265358979323846 * u2;
    q[k] = static_cast<float>(k % 2 == 1 ? radius * std::sin(angle) : radius * std::cos(angle));
  }
  return q;
}

// One PowerSGD step in f64 on the ranks' M' (error feedback already added), from Q_in, and a
// bound on how far the f32 implementation can be from it (Frobenius norms).
//
// Derivation (first order; A = mean_r M'_r, |X| elementwise, u = 2^-24, gamma_n as above):
//  P:   each rank's f32 product M'_r Q is within gamma_cols |M'_r||Q| of exact (any summation
//       order); the all-reduce divides by n and sums n terms: within gamma_n of the mean. So
//       ||P_f32 - A Q_in|| <= (gamma_cols + gamma_n (1 + gamma_cols)) ||mean|M'||Q_in||| +
//       ||A|| dQ_in, where dQ_in bounds ||Q_in,f32 - Q_in||.
//  MGS: with f64 dot products only the f32 updates round: column j takes j updates of two
//       roundings each, so the backward error is <= 4 R u ||P||. With e = ||dP|| + 4 R u ||P||
//       and s <= sigma_min(P), the Q factor moves by at most (1 + sqrt 2) (e / s) / (1 - e / s)
//       (Sun 1991, QR perturbation); that also covers MGS's loss of orthogonality (~ u kappa).
//  Q:   Q = mean_r M'_r^T P_hat (f32 products, all-reduce as for P): within ||A|| dP_hat +
//       (gamma_rows + gamma_n (1 + gamma_rows)) ||mean|M'|^T |P_hat|||.
//  out: P_hat Q^T with R-term sums: within dP_hat ||Q|| + (1 + dP_hat) dQ +
//       gamma_R || |P_hat||Q|^T ||.
// The bounds returned are 1.1 times these sums: the terms left out are products of a rounding
// term (< 1e-5 here) with a deviation (< 1e-2, checked).
struct ReferenceStep {
  Mat q{0, 0};       // the all-reduced Q: what the implementation keeps
  Mat output{0, 0};  // P_hat Q^T
  double q_deviation = 0;
  double output_deviation = 0;
};

ReferenceStep reference_step(const std::vector<Mat>& m_prime, const Mat& q_in, double q_in_deviation) {
  const std::size_t n = m_prime.size();
  const std::size_t rows = m_prime[0].rows;
  const std::size_t cols = m_prime[0].cols;
  const std::size_t rank = q_in.cols;
  Mat mean(rows, cols);
  Mat abs_mean(rows, cols);
  for (const Mat& m : m_prime)
    for (std::size_t i = 0; i < m.values.size(); ++i) {
      mean.values[i] += m.values[i] / static_cast<double>(n);
      abs_mean.values[i] += std::abs(m.values[i]) / static_cast<double>(n);
    }
  const Mat p = multiply(mean, q_in);
  const Orthonormal qr = orthonormalise(p);
  const double p_error = (gamma_n(cols) + gamma_n(n) * (1 + gamma_n(cols))) *
                             frobenius(multiply(abs_mean, absolute(q_in))) +
                         frobenius(mean) * q_in_deviation;
  const double mgs_error = 4.0 * static_cast<double>(rank) * kUnitRoundoff * frobenius(p);
  const double relative_p_error = (p_error + mgs_error) / qr.sigma_min_lower;
  const double p_hat_deviation = (1.0 + std::sqrt(2.0)) * relative_p_error / (1.0 - relative_p_error);
  EXPECT_LT(p_hat_deviation, 1e-2) << "the first-order bound needs a small deviation (sigma_min "
                                    << qr.sigma_min_lower << ")";

  ReferenceStep step;
  step.q = multiply(transpose(mean), qr.basis);
  step.output = multiply(qr.basis, transpose(step.q));
  const double q_deviation =
      frobenius(mean) * p_hat_deviation + (gamma_n(rows) + gamma_n(n) * (1 + gamma_n(rows))) *
                                              frobenius(multiply(transpose(abs_mean), absolute(qr.basis)));
  const double output_deviation =
      p_hat_deviation * frobenius(step.q) + (1.0 + p_hat_deviation) * q_deviation +
      gamma_n(rank) * frobenius(multiply(absolute(qr.basis), transpose(absolute(step.q))));
  step.q_deviation = 1.1 * q_deviation;
  step.output_deviation = 1.1 * output_deviation;
  return step;
}

Mat mean_of(const std::vector<Mat>& per_rank) {
  Mat mean(per_rank[0].rows, per_rank[0].cols);
  for (const Mat& m : per_rank)
    for (std::size_t i = 0; i < m.values.size(); ++i)
      mean.values[i] += m.values[i] / static_cast<double>(per_rank.size());
  return mean;
}

// ---- inputs ----------------------------------------------------------------------------------

struct Input {
  std::string name;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<float> data;  // row-major
};

CollectiveStats run_step(Communicator& lane, std::vector<Input>& inputs,
                         const std::string& spec, const std::string& group, std::uint32_t step,
                         const Error* preset_error = nullptr) {
  std::vector<PowerSgdMatrix> matrices;
  for (Input& input : inputs) matrices.push_back({input.name, input.data, input.rows, input.cols});
  return pipeline::powersgd_allreduce(lane, matrices, CompressionSpec::parse(spec), group, step,
                                      preset_error);
}

// Rank r's rows x cols matrix U V_r^T of rank `rank`, exact in f32 (small integers): U
// (rows x rank) shared by all ranks with integers in {-3..3} \ {0}; V_r = W + D_r (cols x rank)
// with W = round(4 Q0) shared (Q0: the tensor's documented first Q) and D_r rank-dependent in
// [-1, 1]. The mean is exactly U mean(V_r)^T, and aligning W with Q0 makes
// mean(V_r)^T Q0 ~ 4 Q0^T Q0 well-conditioned, so A Q0 (whose sigma_min the bound divides
// by) is about as well-conditioned as U, whatever Q0 the seed draws.
std::vector<float> low_rank_contribution(std::size_t rows, std::size_t cols, std::size_t rank,
                                         int r, std::uint64_t seed, std::span<const float> q0) {
  std::vector<float> u = testing::integer_contribution(rows * rank, 0, seed, 3);
  for (float& v : u)
    if (v == 0.0f) v = 1.0f;
  const std::vector<float> d = testing::integer_contribution(cols * rank, r, seed + 2, 1);
  std::vector<float> m(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t k = 0; k < cols; ++k) {
      double sum = 0.0;
      for (std::size_t j = 0; j < rank; ++j)
        sum += static_cast<double>(u[i * rank + j]) *
               (std::nearbyint(4.0 * q0[j * cols + k]) + d[k * rank + j]);
      m[i * cols + k] = static_cast<float>(sum);
    }
  return m;
}

std::vector<Mat> all_ranks(std::size_t rows, std::size_t cols,
                           const std::function<std::vector<float>(int)>& contribution) {
  std::vector<Mat> per_rank;
  for (int r = 0; r < world_size(); ++r) per_rank.push_back(from_row_major(contribution(r), rows, cols));
  return per_rank;
}

std::size_t factor_rank(std::size_t spec_rank, std::size_t rows, std::size_t cols) {
  return std::min({spec_rank, rows, cols});
}

template <typename Body>
std::optional<Error> error_of(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    return error;
  }
  return std::nullopt;
}

// ---- tests -----------------------------------------------------------------------------------

// Every rank's matrix is U V_r^T with U shared, so the mean is exactly of rank R and
// P = mean Q0 spans its column space: P_hat P_hat^T mean = mean in exact arithmetic. The f32
// result must be within the reference's bound of it (the reference itself is exact to f64
// rounding, checked), the same bytes on every rank. Two groups (spec ranks 2 and 4) cover
// non-square shapes, a single row / column (R = 1) and a P buffer large enough for the ring
// (4100 x 8 at R = 4: 16400 floats >= min_bytes / 4).
TEST(PowerSgd, ExactlyLowRankMeanIsReconstructed) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  struct Group {
    std::string spec;
    std::size_t spec_rank;
    std::vector<std::pair<std::size_t, std::size_t>> shapes;
  };
  const std::vector<Group> groups = {
      {"powersgd:rank=2", 2, {{37, 23}, {40, 1}}},
      {"powersgd:rank=4", 4, {{23, 37}, {64, 64}, {1, 40}, {4100, 8}}},
  };
  std::uint32_t step = 0;
  for (const Group& group : groups) {
    std::vector<Input> inputs;
    for (std::size_t m = 0; m < group.shapes.size(); ++m) {
      const auto [rows, cols] = group.shapes[m];
      const std::size_t rank = factor_rank(group.spec_rank, rows, cols);
      const std::string name = group.spec + "/w" + std::to_string(m);
      inputs.push_back({name, rows, cols,
                        low_rank_contribution(rows, cols, rank, world_rank(), 100 + m,
                                              documented_first_q(0, name, cols, rank))});
    }
    run_step(lane, inputs, group.spec, group.spec, step++);
    for (std::size_t m = 0; m < inputs.size(); ++m) {
      const Input& input = inputs[m];
      SCOPED_TRACE(input.name + " " + std::to_string(input.rows) + "x" + std::to_string(input.cols));
      const std::size_t rank = factor_rank(group.spec_rank, input.rows, input.cols);
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(input.data)));
      const std::vector<float> q0 = documented_first_q(0, input.name, input.cols, rank);
      const std::vector<Mat> per_rank = all_ranks(input.rows, input.cols, [&](int r) {
        return low_rank_contribution(input.rows, input.cols, rank, r, 100 + m, q0);
      });
      const Mat mean = mean_of(per_rank);
      const ReferenceStep reference =
          reference_step(per_rank, from_column_major(q0, input.cols, rank), 0.0);
      const double norm = frobenius(mean);
      const double reference_error = frobenius(subtract(reference.output, mean));
      EXPECT_LE(reference_error, 1e-12 * norm) << "the f64 reference reconstructs the rank-R mean";
      // The bound (5e-6 .. 5.4e-4 relative here; gamma_rows = 2.4e-4 for 4100 rows dominates
      // the largest) must stay far below the O(1) errors of a wrong algorithm to mean anything.
      EXPECT_LT(reference.output_deviation, 1e-3 * norm) << "inputs too ill-conditioned";
      const double error = frobenius(subtract(from_row_major(input.data, input.rows, input.cols), mean));
      EXPECT_LE(error, reference_error + reference.output_deviation)
          << "relative error " << error / norm << ", bound "
          << (reference_error + reference.output_deviation) / norm;
      if (world_rank() == 0)
        std::printf("[ measured ] %s: relative error %.3g, bound %.3g\n", input.name.c_str(),
                    error / norm, (reference_error + reference.output_deviation) / norm);
    }
  }
}

// The documented first Q: a step on all-zero matrices sets every P column to zero, outputs zero
// and keeps a zero residual; the all-reduced Q is then all zero, so every kept column is
// redrawn: the kept Q must be the documented first draw, bit for bit. The next step with
// rank-R data must then be exactly (bytes) the first step of a fresh communicator.
TEST(PowerSgd, ZeroGradientKeepsTheFirstQAndDoesNotKillLaterSteps) {
  const std::size_t rows = 37, cols = 23, rank = 3;
  const std::string spec = "powersgd:rank=3,seed=7";
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  std::vector<Input> zeros = {{"z", rows, cols, std::vector<float>(rows * cols, 0.0f)}};
  run_step(lane, zeros, spec, "g", 0);
  for (float v : zeros[0].data) ASSERT_EQ(v, 0.0f);
  for (float v : collectives::residuals_of(lane).residual("powersgd:z")) ASSERT_EQ(v, 0.0f);
  const std::span<const float> kept = collectives::residuals_of(lane).residual("powersgd-q:z");
  const std::vector<float> expected = documented_first_q(7, "z", cols, rank);
  ASSERT_EQ(kept.size(), expected.size());
  EXPECT_EQ(std::memcmp(kept.data(), expected.data(), kept.size_bytes()), 0);

  std::vector<Input> data = {{"z", rows, cols, low_rank_contribution(rows, cols, rank, world_rank(), 5, expected)}};
  std::vector<Input> fresh_data = data;
  run_step(lane, data, spec, "g", 1);
  Communicator fresh = Communicator::world();
  run_step(fresh, fresh_data, spec, "g", 1);
  EXPECT_EQ(std::memcmp(data[0].data.data(), fresh_data[0].data.data(), rows * cols * 4), 0);
}

// Error feedback's running sum. With M'_t = fl(M_t + E_{t-1}) and E_t = fl(M'_t - out_t) on
// each rank (out_t the same on every rank), in exact arithmetic
//   sum_t out_t + mean_r E_T,r = sum_t mean_r M_t,r          (E_0 = 0; telescoping).
// In f32 each of the two roundings per step is at most u times its result, so per element
//   |lhs - rhs| <= mean_r sum_t u (|M'_t,r| + |E_t,r|)
// plus the test's own f64 sums (relative 1e-15 on a few terms; 1e-12 of their magnitudes is
// taken). Full-rank Gaussian inputs: the approximation is lossy and E carries real mass. An
// empty matrix (0 x 5) rides along.
TEST(PowerSgd, ErrorFeedbackKeepsTheRunningSum) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  const std::string spec = "powersgd:rank=2";
  const std::vector<std::pair<std::size_t, std::size_t>> shapes = {{37, 23}, {16, 48}, {1, 40}, {0, 5}};
  const int ranks = world_size();
  const int steps = 6;
  auto input_of = [](std::size_t count, int r, int step, std::size_t m) {
    return testing::gaussian_contribution(count, r, 1000u * step + m);
  };

  std::vector<std::vector<double>> output_sum, input_mean_sum, bound;
  for (const auto& [rows, cols] : shapes) {
    output_sum.emplace_back(rows * cols, 0.0);
    input_mean_sum.emplace_back(rows * cols, 0.0);
    bound.emplace_back(rows * cols, 0.0);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<Input> inputs;
    std::vector<std::vector<float>> m_prime;
    for (std::size_t m = 0; m < shapes.size(); ++m) {
      const auto [rows, cols] = shapes[m];
      const std::string name = "ef.w" + std::to_string(m);
      inputs.push_back({name, rows, cols, input_of(rows * cols, world_rank(), step, m)});
      std::vector<float> with_residual = inputs.back().data;
      if (step > 0 && rows * cols > 0) {
        const std::span<const float> residual = collectives::residuals_of(lane).residual("powersgd:" + name);
        for (std::size_t i = 0; i < with_residual.size(); ++i) with_residual[i] += residual[i];
      }
      m_prime.push_back(std::move(with_residual));
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float> theirs = input_of(rows * cols, r, step, m);
        for (std::size_t i = 0; i < theirs.size(); ++i) input_mean_sum[m][i] += theirs[i] / static_cast<double>(ranks);
      }
    }
    run_step(lane, inputs, spec, "ef", static_cast<std::uint32_t>(step));
    for (std::size_t m = 0; m < shapes.size(); ++m) {
      const Input& input = inputs[m];
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(input.data)));
      if (input.data.empty()) {
        EXPECT_FALSE(collectives::residuals_of(lane).contains("powersgd:" + input.name)) << "empty: no state";
        continue;
      }
      const std::span<const float> residual = collectives::residuals_of(lane).residual("powersgd:" + input.name);
      for (std::size_t i = 0; i < input.data.size(); ++i) {
        output_sum[m][i] += input.data[i];
        bound[m][i] += kUnitRoundoff * (std::abs(m_prime[m][i]) + std::abs(residual[i]));
      }
    }
  }
  for (std::size_t m = 0; m < shapes.size(); ++m) {
    const std::size_t count = output_sum[m].size();
    if (count == 0) continue;
    std::vector<double> residual_mean(count), bound_mean(count);
    const std::span<const float> residual = collectives::residuals_of(lane).residual("powersgd:ef.w" + std::to_string(m));
    for (std::size_t i = 0; i < count; ++i) residual_mean[i] = residual[i];
    MPI_Allreduce(MPI_IN_PLACE, residual_mean.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(bound[m].data(), bound_mean.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double residual_mass = 0.0, worst_ratio = 0.0;
    for (std::size_t i = 0; i < count; ++i) {
      residual_mean[i] /= ranks;
      const double allowed = bound_mean[i] / ranks +
                             1e-12 * (std::abs(output_sum[m][i]) + std::abs(residual_mean[i]) +
                                      std::abs(input_mean_sum[m][i]) + 1.0);
      const double deviation = std::abs(output_sum[m][i] + residual_mean[i] - input_mean_sum[m][i]);
      ASSERT_LE(deviation, allowed) << "matrix " << m << " element " << i;
      residual_mass += std::abs(residual_mean[i]);
      worst_ratio = std::max(worst_ratio, deviation / allowed);
    }
    if (std::min(shapes[m].first, shapes[m].second) > 2) {
      EXPECT_GT(residual_mass / static_cast<double>(count), 0.1) << "rank 2 of full-rank data is lossy";
    }
    if (world_rank() == 0 && m == 0)
      std::printf("[ measured ] running sum: worst deviation / bound %.3g, mean |E| %.3g\n",
                  worst_ratio, residual_mass / static_cast<double>(count));
  }
}

// Warm start is the power (subspace) iteration on B = A A^T (A = the mean; ef=off and the
// same inputs at both steps): the step-2 basis spans B span(P_hat_1). For B >= 0 and X with
// orthonormal columns, with M_k = X^T B^k X, the Gram matrices of (X, B^(1/2) X, B X, ...)
// give M_2 >= M_1^2 and M_3 >= M_2 M_1^-1 M_2 (Schur complements), so
//   tr(orth(BX)^T B orth(BX)) = tr(M_2^-1 M_3) >= tr(M_1^-1 M_2) >= tr(M_1) = tr(X^T B X),
// i.e. e_t^2 = ||A||^2 - tr(P_hat_t^T B P_hat_t) cannot grow: e_2 <= e_1, with e_t the
// Frobenius error of the step-t output against A. Checked: after step 1 the kept Q is the
// all-reduced Q (the same bytes on every rank; the f64 reference's A^T P_hat within its bound),
// each step's error is the reference's within its bound, the reference's errors decrease by
// more than both bounds together, and the implementation's errors decrease.
TEST(PowerSgd, WarmStartIsThePowerIteration) {
  const std::size_t rows = 37, cols = 23, rank = 3;
  const std::string spec = "powersgd:rank=3,ef=off,seed=11";
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  auto contribution = [&](int r) { return testing::gaussian_contribution(rows * cols, r, 77); };
  const std::vector<Mat> per_rank = all_ranks(rows, cols, contribution);
  const Mat mean = mean_of(per_rank);

  const std::vector<float> q0 = documented_first_q(11, "warm", cols, rank);
  ReferenceStep reference = reference_step(per_rank, from_column_major(q0, cols, rank), 0.0);
  std::vector<double> errors, reference_errors, bounds;
  for (std::uint32_t step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step == 1) reference = reference_step(per_rank, reference.q, reference.q_deviation);
    std::vector<Input> inputs = {{"warm", rows, cols, contribution(world_rank())}};
    run_step(lane, inputs, spec, "warm", step);
    const std::span<const float> kept = collectives::residuals_of(lane).residual("powersgd-q:warm");
    ASSERT_EQ(kept.size(), cols * rank);
    EXPECT_TRUE(identical_on_all_ranks(kept));
    EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(inputs[0].data)));
    EXPECT_LE(frobenius(subtract(from_column_major(kept, cols, rank), reference.q)), reference.q_deviation);
    const Mat output = from_row_major(inputs[0].data, rows, cols);
    errors.push_back(frobenius(subtract(output, mean)));
    reference_errors.push_back(frobenius(subtract(reference.output, mean)));
    bounds.push_back(reference.output_deviation);
    EXPECT_LE(std::abs(errors.back() - reference_errors.back()), bounds.back());
  }
  EXPECT_FALSE(collectives::residuals_of(lane).contains("powersgd:warm")) << "ef=off keeps no residual";
  EXPECT_GT(reference_errors[0] - reference_errors[1], bounds[0] + bounds[1]);
  EXPECT_LT(errors[1], errors[0]);
  if (world_rank() == 0)
    std::printf("[ measured ] warm start: error %.6g -> %.6g of |A| %.6g (bounds %.3g, %.3g)\n",
                errors[0], errors[1], frobenius(mean), bounds[0], bounds[1]);
}

// With ef=off no residual is created (Q is still kept); with the default ef=on both are.
TEST(PowerSgd, ResidualOnlyWithErrorFeedback) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  std::vector<Input> inputs = {{"off", 8, 6, testing::gaussian_contribution(48, world_rank(), 3)},
                               {"on", 8, 6, testing::gaussian_contribution(48, world_rank(), 4)}};
  std::vector<Input> first = {inputs[0]}, second = {inputs[1]};
  run_step(lane, first, "powersgd:rank=2,ef=off", "g-off", 0);
  run_step(lane, second, "powersgd:rank=2", "g-on", 0);
  error_feedback::ResidualStore& store = collectives::residuals_of(lane);
  EXPECT_FALSE(store.contains("powersgd:off"));
  ASSERT_TRUE(store.contains("powersgd-q:off"));
  EXPECT_EQ(store.residual("powersgd-q:off").size(), 6u * 2u);
  ASSERT_TRUE(store.contains("powersgd:on"));
  EXPECT_EQ(store.residual("powersgd:on").size(), 48u);
  EXPECT_EQ(store.residual("powersgd-q:on").size(), 6u * 2u);
  EXPECT_EQ(store.size(), 3u);
}

// A bad data size on rank 0 only: every rank throws invalid_argument (rank 0 its own error
// naming the matrix, the others rank 0's, quoted), and the ranks stay in step: the next call
// succeeds everywhere with the same bytes.
TEST(PowerSgd, WrongDataSizeOnOneRankFailsEveryRank) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  std::vector<Input> inputs = {{"bad.matrix", 5, 4, testing::gaussian_contribution(20, world_rank(), 1)}};
  if (world_rank() == 0) inputs[0].data.pop_back();
  const std::optional<Error> error = error_of([&] { run_step(lane, inputs, "powersgd", "bad", 0); });
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(error->what()).find("bad.matrix"), std::string::npos) << error->what();
  if (world_rank() != 0) {
    EXPECT_NE(std::string(error->what()).find("rank 0"), std::string::npos) << error->what();
  }
  if (world_rank() == 0) {
    EXPECT_FALSE(collectives::residuals_of(lane).contains("powersgd-q:bad.matrix")) << "the failing rank keeps no state";
  }

  inputs[0].data = testing::gaussian_contribution(20, world_rank(), 1);
  EXPECT_NO_THROW(run_step(lane, inputs, "powersgd", "bad", 0));
  EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(inputs[0].data)));
}

// A preset error on rank 0 only (a tensor never marked ready) fails the call on every rank.
TEST(PowerSgd, PresetErrorOnOneRankFailsEveryRank) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  std::vector<Input> inputs = {{"w", 6, 5, testing::gaussian_contribution(30, world_rank(), 2)}};
  const Error never_ready(ErrorCode::invalid_argument, "tensor 'w' was never marked ready");
  const std::optional<Error> error = error_of([&] {
    run_step(lane, inputs, "powersgd", "preset", 0, world_rank() == 0 ? &never_ready : nullptr);
  });
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(error->what()).find("never marked ready"), std::string::npos) << error->what();
}

// Arguments every rank gets wrong alike, and shape changes under both resize policies.
TEST(PowerSgd, SpecAndShapeChecks) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  std::vector<Input> inputs = {{"w", 6, 5, testing::gaussian_contribution(30, world_rank(), 2)}};
  {
    std::vector<PowerSgdMatrix> matrices = {{"w", inputs[0].data, 6, 5}};
    const std::optional<Error> error = error_of([&] {
      pipeline::powersgd_allreduce(lane, matrices, CompressionSpec::parse("topk"), "spec", 0, nullptr);
    });
    ASSERT_TRUE(error.has_value());
    EXPECT_EQ(error->code(), ErrorCode::invalid_argument);
  }
  {
    std::vector<Input> twice = {inputs[0], inputs[0]};
    const std::optional<Error> error = error_of([&] { run_step(lane, twice, "powersgd", "twice", 0); });
    ASSERT_TRUE(error.has_value());
    EXPECT_EQ(error->code(), ErrorCode::invalid_argument);
  }

  // ef_resize=error: Q (cols x R) and the residual change size -> size_mismatch everywhere.
  run_step(lane, inputs, "powersgd:rank=2", "shape", 0);
  std::vector<Input> reshaped = {{"w", 4, 7, testing::gaussian_contribution(28, world_rank(), 9)}};
  const std::optional<Error> error = error_of([&] { run_step(lane, reshaped, "powersgd:rank=2", "shape", 1); });
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), ErrorCode::size_mismatch);

  // ef_resize=reset: a fresh residual and first Q, i.e. the bytes of a fresh communicator's
  // first step.
  std::vector<Input> fresh_inputs = reshaped;
  run_step(lane, reshaped, "powersgd:rank=2,ef_resize=reset", "shape", 1);
  Communicator fresh = Communicator::world();
  run_step(fresh, fresh_inputs, "powersgd:rank=2,ef_resize=reset", "shape", 1);
  EXPECT_EQ(std::memcmp(reshaped[0].data.data(), fresh_inputs[0].data.data(), 28 * 4), 0);
  EXPECT_EQ(collectives::residuals_of(lane).residual("powersgd:w").size(), 28u);
  EXPECT_EQ(collectives::residuals_of(lane).residual("powersgd-q:w").size(), 7u * 2u);
}

// Stats: ratio = sum rows*cols / sum (rows+cols) R exactly (the same integer quotient), bytes
// and algorithms those of two plain all-reduces of the P and Q sizes, and an empty group still
// makes both calls.
TEST(PowerSgd, StatsCountTheMatricesAndBothCalls) {
  Communicator comm = Communicator::world();
  Communicator& lane = comm;
  const std::string spec = "powersgd:rank=4";
  const std::vector<std::pair<std::size_t, std::size_t>> shapes = {
      {37, 23}, {64, 64}, {1, 40}, {0, 5}, {5000, 10}};
  std::vector<Input> inputs;
  std::size_t elements = 0, factor_elements = 0, p_count = 0, q_count = 0;
  for (std::size_t m = 0; m < shapes.size(); ++m) {
    const auto [rows, cols] = shapes[m];
    const std::size_t rank = factor_rank(4, rows, cols);
    inputs.push_back({"s" + std::to_string(m), rows, cols,
                      testing::gaussian_contribution(rows * cols, world_rank(), m)});
    elements += rows * cols;
    factor_elements += (rows + cols) * rank;
    p_count += rows * rank;
    q_count += cols * rank;
  }
  const CollectiveStats stats = run_step(lane, inputs, spec, "stats", 3);
  EXPECT_EQ(stats.algorithm, "powersgd");
  EXPECT_EQ(stats.spec, CompressionSpec::parse(spec).to_string());
  EXPECT_EQ(stats.count, elements);
  EXPECT_EQ(stats.ranks, world_size());
  EXPECT_EQ(stats.encoded_input_bytes, 4u * elements);
  EXPECT_EQ(stats.encoded_message_bytes, 4u * factor_elements);
  EXPECT_EQ(stats.compression_ratio, static_cast<double>(elements) / static_cast<double>(factor_elements));
  EXPECT_GE(stats.total_seconds, stats.encode_seconds + stats.communicate_seconds + stats.decode_seconds - 1e-9);

  CompressionSpec dense;
  dense.seed = CompressionSpec::parse(spec).seed;
  std::vector<float> p(p_count, 0.0f), q(q_count, 0.0f);
  const CollectiveStats p_stats = collectives::allreduce_at_step(
      lane, host_view(p.data(), p.size()), "plain/P", dense, ReduceOp::average, 3, nullptr);
  const CollectiveStats q_stats = collectives::allreduce_at_step(
      lane, host_view(q.data(), q.size()), "plain/Q", dense, ReduceOp::average, 3, nullptr);
  EXPECT_EQ(stats.sent_bytes(), p_stats.sent_bytes() + q_stats.sent_bytes());
  EXPECT_EQ(stats.received_bytes, p_stats.received_bytes + q_stats.received_bytes);
  EXPECT_EQ(stats.note, "P: " + p_stats.algorithm + ", Q: " + q_stats.algorithm);
  if (world_size() > 1) {
    // Above min_bytes: one of gradzip's own algorithms (the model's choice for codec none),
    // not MPI's uncompressed all-reduce.
    EXPECT_NE(p_stats.algorithm, "mpi") << "5000 x 4 P floats exceed min_bytes";
    EXPECT_FALSE(p_stats.algorithm.empty());
  }

  // No matrix with elements: both calls still run, with 0 elements.
  std::vector<Input> empty_inputs = {{"e", 0, 5, {}}};
  const CollectiveStats empty = run_step(lane, empty_inputs, spec, "empty", 0);
  const CollectiveStats zero_stats = collectives::allreduce_at_step(
      lane, host_view(p.data(), 0), "plain/0", dense, ReduceOp::average, 0, nullptr);
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.compression_ratio, 1.0);
  EXPECT_EQ(empty.note, "P: " + zero_stats.algorithm + ", Q: " + zero_stats.algorithm);
  std::vector<Input> none;
  EXPECT_EQ(run_step(lane, none, spec, "none", 0).note, empty.note);
}

}  // namespace
}  // namespace gradzip
