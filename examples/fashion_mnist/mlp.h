// A small fully connected network for the Fashion-MNIST example, its backward pass with a
// per-layer "gradients ready" callback (the point where a data-parallel loop hands a layer to
// gradzip::Reducer), and SGD with momentum.
//
//   Mlp model({784, 512, 256, 10}, /*seed=*/1);
//   MomentumSgd optimizer(0.05f, 0.9f);
//   float loss = model.forward_backward(images, labels, batch, [&](std::size_t l) { /* reduce layer l */ });
//   optimizer.step(model);
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace gradzip::examples {

// A fully connected network: layer l maps sizes[l] -> sizes[l+1]; ReLU between layers, softmax
// cross-entropy on the last. Parameters live in one contiguous f32 array per tensor so that the
// Reducer can reduce them in place: weight(l) is sizes[l+1] x sizes[l] row-major, bias(l) sizes[l+1].
// The arrays never move after construction. Accessors throw ErrorCode::invalid_argument for
// l >= layer_count().
class Mlp {
 public:
  // He initialisation: weights ~ N(0, 2 / fan_in) from std::mt19937_64(seed) (one generator, layers in
  // order, each weight matrix in row-major order), biases 0; gradients 0. The same seed gives the
  // same weights on every rank and run (of one standard library). Throws ErrorCode::invalid_argument
  // for fewer than two sizes or a zero size.
  Mlp(std::vector<std::size_t> sizes, std::uint64_t seed);

  std::size_t layer_count() const noexcept;                 // sizes.size() - 1
  const std::vector<std::size_t>& sizes() const noexcept;
  float* weight(std::size_t l);
  float* bias(std::size_t l);
  float* weight_grad(std::size_t l);
  float* bias_grad(std::size_t l);
  const float* weight(std::size_t l) const;
  const float* bias(std::size_t l) const;
  std::size_t weight_count(std::size_t l) const;
  std::size_t bias_count(std::size_t l) const;

  // Forward and backward on `batch` images (batch x sizes[0] row-major) with their labels: fills every
  // gradient with d(mean loss over the batch)/d(param), calling on_layer_ready(l) as soon as layer l's
  // weight and bias gradients are final (l = L-1 first, down to 0: backward order), and returns the mean
  // cross-entropy loss of the batch. Uses Eigen (Map over the arrays) with f32 arithmetic.
  // After on_layer_ready(l) the pass never touches layer l's gradients again, so the callback may
  // hand them to another thread; it reads only the weights. ReLU'(0) is taken as 0. Throws
  // ErrorCode::invalid_argument for batch 0 or a label >= sizes.back() (before any gradient changes).
  float forward_backward(const float* images, const std::uint8_t* labels, std::size_t batch,
                         const std::function<void(std::size_t layer)>& on_layer_ready);

  // Mean loss and number of correct argmax predictions over n images (evaluated in blocks of 1000,
  // no gradients). A prediction is the index of the largest logit, the lowest index on a tie.
  // Throws ErrorCode::invalid_argument for n 0 or a label >= sizes.back().
  struct Evaluation {
    double mean_loss = 0;
    std::size_t correct = 0;
  };
  Evaluation evaluate(const float* images, const std::uint8_t* labels, std::size_t n) const;

 private:
  void check_layer(std::size_t l) const;
  void check_labels(const std::uint8_t* labels, std::size_t n, const char* operation) const;
  // Runs the layers on `batch` images: activations[l] (batch x sizes[l+1]) receives layer l's
  // output, after ReLU for every layer but the last, whose entry holds the logits.
  void forward(const float* images, std::size_t batch, std::vector<std::vector<float>>& activations) const;

  std::vector<std::size_t> sizes_;
  std::vector<std::vector<float>> weights_, biases_, weight_grads_, bias_grads_;
  std::vector<std::vector<float>> activations_;  // forward_backward's scratch, kept between calls
  std::vector<float> backward_scratch_;
};

// SGD with momentum (PyTorch's form): v = momentum * v + g (+ weight_decay * w); w -= lr * v.
// Per element, in f32: d = g + weight_decay * w (d = g when weight_decay is 0); v = momentum * v + d;
// w = w - lr * v. The velocities start at 0 and belong to the first model stepped; stepping a
// model of other sizes throws ErrorCode::invalid_argument.
class MomentumSgd {
 public:
  MomentumSgd(float lr, float momentum, float weight_decay = 0.0f);
  void step(Mlp& model);   // uses the gradients currently in the model
  // The learning rate of the following steps (schedules change it between steps).
  void set_learning_rate(float lr) noexcept { lr_ = lr; }

 private:
  float lr_, momentum_, weight_decay_;
  std::vector<std::size_t> sizes_;                       // of the model the velocities belong to
  std::vector<std::vector<float>> weight_velocity_, bias_velocity_;
};

}  // namespace gradzip::examples
