#include "examples/fashion_mnist/mlp.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "gradzip/error.h"

namespace gradzip::examples {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;

constexpr std::size_t kEvaluationBlock = 1000;

Eigen::Index index(std::size_t n) { return static_cast<Eigen::Index>(n); }

// Turns each row of `logits` (batch x classes) into softmax probabilities in place and returns
// the sum over rows of the cross-entropy -log p[label]. Each row is shifted by its maximum first,
// so exp never overflows; the loss of a row is log(sum exp(z - max)) - (z[label] - max).
double softmax_cross_entropy(MatrixMap logits, const std::uint8_t* labels) {
  const Eigen::VectorXf row_max = logits.rowwise().maxCoeff();
  logits.colwise() -= row_max;
  double loss = 0;
  for (Eigen::Index i = 0; i < logits.rows(); ++i) loss -= static_cast<double>(logits(i, labels[i]));
  logits = logits.array().exp().matrix();
  const Eigen::VectorXf row_sum = logits.rowwise().sum();
  for (Eigen::Index i = 0; i < logits.rows(); ++i) loss += static_cast<double>(std::log(row_sum(i)));
  logits.array().colwise() /= row_sum.array();
  return loss;
}

}  // namespace

Mlp::Mlp(std::vector<std::size_t> sizes, std::uint64_t seed) : sizes_(std::move(sizes)) {
  GZ_REQUIRE(sizes_.size() >= 2, ErrorCode::invalid_argument, "Mlp: ", sizes_.size(),
             " layer sizes, expected at least 2 (inputs and outputs)");
  for (std::size_t i = 0; i < sizes_.size(); ++i) {
    GZ_REQUIRE(sizes_[i] > 0, ErrorCode::invalid_argument, "Mlp: size ", i, " is 0");
  }
  std::mt19937_64 generator(seed);
  const std::size_t layers = layer_count();
  weights_.resize(layers);
  biases_.resize(layers);
  weight_grads_.resize(layers);
  bias_grads_.resize(layers);
  activations_.resize(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t in = sizes_[l];
    const std::size_t out = sizes_[l + 1];
    std::normal_distribution<float> normal(0.0f, static_cast<float>(std::sqrt(2.0 / static_cast<double>(in))));
    weights_[l].resize(out * in);
    for (float& w : weights_[l]) w = normal(generator);
    biases_[l].assign(out, 0.0f);
    weight_grads_[l].assign(out * in, 0.0f);
    bias_grads_[l].assign(out, 0.0f);
  }
}

std::size_t Mlp::layer_count() const noexcept { return sizes_.size() - 1; }
const std::vector<std::size_t>& Mlp::sizes() const noexcept { return sizes_; }

void Mlp::check_layer(std::size_t l) const {
  GZ_REQUIRE(l < layer_count(), ErrorCode::invalid_argument, "Mlp: layer ", l, " of a network with ",
             layer_count(), " layers");
}

float* Mlp::weight(std::size_t l) { check_layer(l); return weights_[l].data(); }
float* Mlp::bias(std::size_t l) { check_layer(l); return biases_[l].data(); }
float* Mlp::weight_grad(std::size_t l) { check_layer(l); return weight_grads_[l].data(); }
float* Mlp::bias_grad(std::size_t l) { check_layer(l); return bias_grads_[l].data(); }
const float* Mlp::weight(std::size_t l) const { check_layer(l); return weights_[l].data(); }
const float* Mlp::bias(std::size_t l) const { check_layer(l); return biases_[l].data(); }
std::size_t Mlp::weight_count(std::size_t l) const { check_layer(l); return weights_[l].size(); }
std::size_t Mlp::bias_count(std::size_t l) const { check_layer(l); return biases_[l].size(); }

void Mlp::check_labels(const std::uint8_t* labels, std::size_t n, const char* operation) const {
  const std::size_t classes = sizes_.back();
  for (std::size_t i = 0; i < n; ++i) {
    GZ_REQUIRE(labels[i] < classes, ErrorCode::invalid_argument, "Mlp::", operation, ": label ", i, " is ",
               static_cast<unsigned>(labels[i]), ", the network has ", classes, " classes");
  }
}

void Mlp::forward(const float* images, std::size_t batch, std::vector<std::vector<float>>& activations) const {
  const std::size_t layers = layer_count();
  activations.resize(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t in = sizes_[l];
    const std::size_t out = sizes_[l + 1];
    activations[l].resize(batch * out);
    const ConstMatrixMap x(l == 0 ? images : activations[l - 1].data(), index(batch), index(in));
    const ConstMatrixMap w(weights_[l].data(), index(out), index(in));
    MatrixMap z(activations[l].data(), index(batch), index(out));
    z.noalias() = x * w.transpose();
    z.rowwise() += ConstRowVectorMap(biases_[l].data(), index(out));
    if (l + 1 < layers) z = z.cwiseMax(0.0f);
  }
}

float Mlp::forward_backward(const float* images, const std::uint8_t* labels, std::size_t batch,
                            const std::function<void(std::size_t layer)>& on_layer_ready) {
  GZ_REQUIRE(batch > 0, ErrorCode::invalid_argument, "Mlp::forward_backward: a batch of 0 images");
  check_labels(labels, batch, "forward_backward");
  forward(images, batch, activations_);
  const std::size_t layers = layer_count();
  const std::size_t classes = sizes_.back();

  // d(mean loss)/d(logits) = (softmax - one_hot(label)) / batch, built in place of the logits.
  MatrixMap last(activations_[layers - 1].data(), index(batch), index(classes));
  const double loss_sum = softmax_cross_entropy(last, labels);
  for (std::size_t i = 0; i < batch; ++i) last(index(i), labels[i]) -= 1.0f;
  last *= 1.0f / static_cast<float>(batch);

  // activations_[l] holds the gradient with respect to layer l's pre-activation output when
  // layer l is reached; its input is activations_[l - 1] (the images for layer 0).
  for (std::size_t l = layers; l-- > 0;) {
    const std::size_t in = sizes_[l];
    const std::size_t out = sizes_[l + 1];
    const ConstMatrixMap delta(activations_[l].data(), index(batch), index(out));
    const ConstMatrixMap x(l == 0 ? images : activations_[l - 1].data(), index(batch), index(in));
    MatrixMap(weight_grads_[l].data(), index(out), index(in)).noalias() = delta.transpose() * x;
    RowVectorMap(bias_grads_[l].data(), index(out)).noalias() = delta.colwise().sum();
    if (on_layer_ready) on_layer_ready(l);
    if (l == 0) break;
    // Through the weights, then through the ReLU: its output is positive exactly where its
    // input was, so the stored activation is the mask.
    backward_scratch_.resize(batch * in);
    MatrixMap through_weights(backward_scratch_.data(), index(batch), index(in));
    through_weights.noalias() = delta * ConstMatrixMap(weights_[l].data(), index(out), index(in));
    MatrixMap below(activations_[l - 1].data(), index(batch), index(in));
    below = (below.array() > 0.0f).select(through_weights, 0.0f);
  }
  return static_cast<float>(loss_sum / static_cast<double>(batch));
}

Mlp::Evaluation Mlp::evaluate(const float* images, const std::uint8_t* labels, std::size_t n) const {
  GZ_REQUIRE(n > 0, ErrorCode::invalid_argument, "Mlp::evaluate: 0 images");
  check_labels(labels, n, "evaluate");
  const std::size_t inputs = sizes_.front();
  const std::size_t classes = sizes_.back();
  std::vector<std::vector<float>> activations;
  double loss_sum = 0;
  Evaluation result;
  for (std::size_t first = 0; first < n; first += kEvaluationBlock) {
    const std::size_t block = std::min(kEvaluationBlock, n - first);
    forward(images + first * inputs, block, activations);
    MatrixMap logits(activations.back().data(), index(block), index(classes));
    for (std::size_t i = 0; i < block; ++i) {
      Eigen::Index predicted = 0;
      logits.row(index(i)).maxCoeff(&predicted);  // the first maximum
      if (static_cast<std::size_t>(predicted) == labels[first + i]) ++result.correct;
    }
    loss_sum += softmax_cross_entropy(logits, labels + first);
  }
  result.mean_loss = loss_sum / static_cast<double>(n);
  return result;
}

MomentumSgd::MomentumSgd(float lr, float momentum, float weight_decay)
    : lr_(lr), momentum_(momentum), weight_decay_(weight_decay) {}

void MomentumSgd::step(Mlp& model) {
  if (sizes_.empty()) {
    sizes_ = model.sizes();
    weight_velocity_.resize(model.layer_count());
    bias_velocity_.resize(model.layer_count());
    for (std::size_t l = 0; l < model.layer_count(); ++l) {
      weight_velocity_[l].assign(model.weight_count(l), 0.0f);
      bias_velocity_[l].assign(model.bias_count(l), 0.0f);
    }
  }
  GZ_REQUIRE(model.sizes() == sizes_, ErrorCode::invalid_argument,
             "MomentumSgd::step: a model of other sizes than the one its velocities belong to");
  const auto update = [this](float* w, const float* g, std::vector<float>& velocity) {
    float* v = velocity.data();
    for (std::size_t i = 0; i < velocity.size(); ++i) {
      const float d = weight_decay_ != 0.0f ? g[i] + weight_decay_ * w[i] : g[i];
      v[i] = momentum_ * v[i] + d;
      w[i] = w[i] - lr_ * v[i];
    }
  };
  for (std::size_t l = 0; l < model.layer_count(); ++l) {
    update(model.weight(l), model.weight_grad(l), weight_velocity_[l]);
    update(model.bias(l), model.bias_grad(l), bias_velocity_[l]);
  }
}

}  // namespace gradzip::examples
