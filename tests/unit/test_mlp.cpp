// The Fashion-MNIST example's MLP and optimizer: every gradient of a small network against
// central finite differences of an independent double-precision forward pass, the backward order
// of the "layer ready" callback with each layer's gradients final (and left alone) from then on,
// He initialisation as documented, exact prediction counting, and the momentum-SGD formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "examples/fashion_mnist/mlp.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using examples::MomentumSgd;
using examples::Mlp;
using testing::error_code_of;
using testing::gaussian;
using testing::same_bits;

std::vector<float> copy_of(const float* data, std::size_t n) { return std::vector<float>(data, data + n); }

// The network's parameters in double, written independently of mlp.cpp.
struct DoubleNet {
  std::vector<std::size_t> sizes;
  std::vector<std::vector<double>> weights, biases;  // weight l: sizes[l+1] x sizes[l] row-major

  explicit DoubleNet(const Mlp& model) : sizes(model.sizes()) {
    for (std::size_t l = 0; l < model.layer_count(); ++l) {
      weights.emplace_back(model.weight(l), model.weight(l) + model.weight_count(l));
      biases.emplace_back(model.bias(l), model.bias(l) + model.bias_count(l));
    }
  }

  // Mean softmax cross-entropy over the batch; `relu_mask` receives, for every hidden unit of
  // every image, whether its pre-activation is positive.
  double loss(const std::vector<float>& images, const std::vector<std::uint8_t>& labels,
              std::vector<bool>* relu_mask) const {
    const std::size_t batch = labels.size();
    const std::size_t layers = sizes.size() - 1;
    if (relu_mask) relu_mask->clear();
    double total = 0;
    for (std::size_t i = 0; i < batch; ++i) {
      std::vector<double> a(images.begin() + static_cast<std::ptrdiff_t>(i * sizes[0]),
                            images.begin() + static_cast<std::ptrdiff_t>((i + 1) * sizes[0]));
      for (std::size_t l = 0; l < layers; ++l) {
        std::vector<double> z(sizes[l + 1]);
        for (std::size_t o = 0; o < sizes[l + 1]; ++o) {
          double sum = biases[l][o];
          for (std::size_t k = 0; k < sizes[l]; ++k) sum += weights[l][o * sizes[l] + k] * a[k];
          z[o] = sum;
        }
        if (l + 1 < layers) {
          for (double& v : z) {
            if (relu_mask) relu_mask->push_back(v > 0);
            v = std::max(v, 0.0);
          }
        }
        a = std::move(z);
      }
      const double top = *std::max_element(a.begin(), a.end());
      double sum = 0;
      for (double v : a) sum += std::exp(v - top);
      total += std::log(sum) + top - a[labels[i]];
    }
    return total / static_cast<double>(batch);
  }
};

struct Batch {
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
};

Batch make_batch(std::size_t batch, std::size_t inputs, std::size_t classes, std::uint64_t seed) {
  Batch b;
  b.images = gaussian(batch * inputs, seed);
  for (std::size_t i = 0; i < batch; ++i) b.labels.push_back(static_cast<std::uint8_t>((i * 7 + seed) % classes));
  return b;
}

// A 6-5-4-3 network with non-zero biases, so that bias gradients are exercised too.
Mlp small_network(std::uint64_t seed) {
  Mlp model({6, 5, 4, 3}, seed);
  for (std::size_t l = 0; l < model.layer_count(); ++l) {
    const std::vector<float> b = gaussian(model.bias_count(l), seed + 100 + l, 0.3f);
    std::copy(b.begin(), b.end(), model.bias(l));
  }
  return model;
}

// Every weight and bias gradient of a 6-5-4-3 network on a batch of 4 against central finite
// differences of DoubleNet::loss with step h = 1e-4, computed around the f32 parameters held
// exactly in double. The finite difference is accurate to ~h^2 |L'''| / 6 + eps_double / h,
// about 1e-8 here, so the comparison measures the f32 gradient's rounding. That gradient is a
// chain of about 50 f32 operations (three products of inner length <= 6 forward and back, the
// softmax's exp, sum and divide), each contributing at most u = 2^-24 of terms of size O(1), so
// its error is below ~50 u ~ 3e-6; the tolerance 1e-5 + 1e-4 |fd| leaves a factor of three over
// that and is still a thousand times below any real mistake (a dropped 1/batch, a wrong ReLU
// mask or a transposed product changes gradients by O(|g|) ~ 1e-2..1). The perturbation must
// not move any pre-activation across 0 (checked), where the loss has a kink.
TEST(Mlp, GradientsMatchCentralFiniteDifferences) {
  Mlp model = small_network(5);
  const Batch batch = make_batch(4, 6, 3, 11);
  const float loss = model.forward_backward(batch.images.data(), batch.labels.data(), 4, nullptr);

  const DoubleNet net(model);
  std::vector<bool> mask;
  const double reference_loss = net.loss(batch.images, batch.labels, &mask);
  EXPECT_NEAR(loss, reference_loss, 1e-5 * (1 + reference_loss));

  const double h = 1e-4;
  double worst = 0;
  std::size_t checked = 0, nonzero = 0;
  for (std::size_t l = 0; l < model.layer_count(); ++l) {
    for (int is_bias = 0; is_bias < 2; ++is_bias) {
      const std::size_t count = is_bias ? model.bias_count(l) : model.weight_count(l);
      const float* grad = is_bias ? model.bias_grad(l) : model.weight_grad(l);
      for (std::size_t p = 0; p < count; ++p) {
        DoubleNet plus = net, minus = net;
        (is_bias ? plus.biases : plus.weights)[l][p] += h;
        (is_bias ? minus.biases : minus.weights)[l][p] -= h;
        std::vector<bool> mask_plus, mask_minus;
        const double fd = (plus.loss(batch.images, batch.labels, &mask_plus) -
                           minus.loss(batch.images, batch.labels, &mask_minus)) / (2 * h);
        ASSERT_EQ(mask_plus, mask) << "layer " << l << " parameter " << p << " crosses a ReLU kink";
        ASSERT_EQ(mask_minus, mask) << "layer " << l << " parameter " << p << " crosses a ReLU kink";
        const double error = std::fabs(static_cast<double>(grad[p]) - fd);
        EXPECT_LE(error, 1e-5 + 1e-4 * std::fabs(fd))
            << "layer " << l << (is_bias ? " bias " : " weight ") << p << ": " << grad[p] << " vs " << fd;
        worst = std::max(worst, error);
        ++checked;
        nonzero += std::fabs(fd) > 1e-3;
      }
    }
  }
  EXPECT_EQ(checked, std::size_t{5 * 6 + 5 + 4 * 5 + 4 + 3 * 4 + 3});
  EXPECT_GE(nonzero, checked / 2) << "too many dead units for a meaningful check";
  std::printf("finite differences: %zu parameters, %zu with |grad| > 1e-3, worst |f32 - fd| = %.3g\n",
              checked, nonzero, worst);
}

// The gradient of the mean loss over a batch is the mean of its halves' gradients: what makes
// data parallelism (average of per-rank means over equal shards) exact up to rounding.
TEST(Mlp, BatchGradientIsTheMeanOfItsHalves) {
  Mlp model({20, 16, 8, 5}, 3);
  const Batch batch = make_batch(32, 20, 5, 4);
  model.forward_backward(batch.images.data(), batch.labels.data(), 32, nullptr);
  std::vector<std::vector<float>> whole, first, second;
  const auto grads = [&model] {
    std::vector<std::vector<float>> g;
    for (std::size_t l = 0; l < model.layer_count(); ++l) {
      g.push_back(copy_of(model.weight_grad(l), model.weight_count(l)));
      g.push_back(copy_of(model.bias_grad(l), model.bias_count(l)));
    }
    return g;
  };
  whole = grads();
  model.forward_backward(batch.images.data(), batch.labels.data(), 16, nullptr);
  first = grads();
  model.forward_backward(batch.images.data() + 16 * 20, batch.labels.data() + 16, 16, nullptr);
  second = grads();
  for (std::size_t t = 0; t < whole.size(); ++t) {
    for (std::size_t i = 0; i < whole[t].size(); ++i) {
      const float mean = (first[t][i] + second[t][i]) / 2;
      EXPECT_NEAR(whole[t][i], mean, 1e-6f + 1e-5f * std::fabs(mean)) << "tensor " << t << " element " << i;
    }
  }
}

// on_layer_ready(l) comes for l = L-1 .. 0, with layer l's gradients already final: the callback
// doubles them in place (as a Reducer averaging in place would change them) and afterwards they
// are exactly twice what it saw, so the pass neither reads nor writes them after the call. The
// gradients of a previous batch are overwritten, not accumulated.
TEST(Mlp, LayerReadyInBackwardOrderWithFinalGradients) {
  Mlp model = small_network(8);
  const Batch first = make_batch(4, 6, 3, 21);
  const Batch second = make_batch(4, 6, 3, 22);
  model.forward_backward(first.images.data(), first.labels.data(), 4, nullptr);
  std::vector<std::vector<float>> first_grads;
  for (std::size_t l = 0; l < 3; ++l) first_grads.push_back(copy_of(model.weight_grad(l), model.weight_count(l)));
  const std::vector<float> weights_before = copy_of(model.weight(0), model.weight_count(0));

  // The untouched gradients of `second`, from a twin model.
  Mlp twin = small_network(8);
  twin.forward_backward(second.images.data(), second.labels.data(), 4, nullptr);

  std::vector<std::size_t> order;
  std::vector<std::vector<float>> seen_weight(3), seen_bias(3);
  model.forward_backward(second.images.data(), second.labels.data(), 4, [&](std::size_t l) {
    order.push_back(l);
    seen_weight[l] = copy_of(model.weight_grad(l), model.weight_count(l));
    seen_bias[l] = copy_of(model.bias_grad(l), model.bias_count(l));
    for (std::size_t i = 0; i < model.weight_count(l); ++i) model.weight_grad(l)[i] *= 2;
    for (std::size_t i = 0; i < model.bias_count(l); ++i) model.bias_grad(l)[i] *= 2;
  });
  EXPECT_EQ(order, (std::vector<std::size_t>{2, 1, 0}));
  for (std::size_t l = 0; l < 3; ++l) {
    SCOPED_TRACE(l);
    EXPECT_TRUE(same_bits(seen_weight[l], copy_of(twin.weight_grad(l), twin.weight_count(l))));
    EXPECT_TRUE(same_bits(seen_bias[l], copy_of(twin.bias_grad(l), twin.bias_count(l))));
    std::vector<float> doubled_weight = seen_weight[l], doubled_bias = seen_bias[l];
    for (float& g : doubled_weight) g *= 2;
    for (float& g : doubled_bias) g *= 2;
    EXPECT_TRUE(same_bits(copy_of(model.weight_grad(l), model.weight_count(l)), doubled_weight));
    EXPECT_TRUE(same_bits(copy_of(model.bias_grad(l), model.bias_count(l)), doubled_bias));
    EXPECT_FALSE(same_bits(seen_weight[l], first_grads[l])) << "the two batches must give different gradients";
  }
  EXPECT_TRUE(same_bits(copy_of(model.weight(0), model.weight_count(0)), weights_before));
}

TEST(Mlp, HeInitialisationAsDocumented) {
  // The exact sequence: one mt19937_64(seed), layer 0's weights row-major, then layer 1's.
  Mlp small({3, 2, 4}, 42);
  std::mt19937_64 generator(42);
  std::normal_distribution<float> first(0.0f, static_cast<float>(std::sqrt(2.0 / 3.0)));
  std::vector<float> expected0(6), expected1(8);
  for (float& w : expected0) w = first(generator);
  std::normal_distribution<float> second(0.0f, static_cast<float>(std::sqrt(2.0 / 2.0)));
  for (float& w : expected1) w = second(generator);
  EXPECT_TRUE(same_bits(copy_of(small.weight(0), 6), expected0));
  EXPECT_TRUE(same_bits(copy_of(small.weight(1), 8), expected1));
  EXPECT_EQ(small.layer_count(), 2u);
  EXPECT_EQ(small.weight_count(1), 8u);
  EXPECT_EQ(small.bias_count(1), 4u);

  // Statistics of a large layer: 784 x 256 = 200704 samples of N(0, 2/784). The sample variance's
  // standard deviation is var * sqrt(2/n) = 0.32% of var; the mean's is sqrt(var/n) ~ 1.1e-4.
  Mlp model({784, 256, 10}, 1);
  const std::size_t n = model.weight_count(0);
  double sum = 0, squares = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sum += model.weight(0)[i];
    squares += static_cast<double>(model.weight(0)[i]) * model.weight(0)[i];
  }
  const double variance = 2.0 / 784;
  EXPECT_NEAR(sum / static_cast<double>(n), 0.0, 5 * std::sqrt(variance / static_cast<double>(n)));
  EXPECT_NEAR(squares / static_cast<double>(n), variance, 5 * variance * std::sqrt(2.0 / static_cast<double>(n)));
  for (std::size_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(same_bits(copy_of(model.bias(l), model.bias_count(l)), std::vector<float>(model.bias_count(l), 0.0f)));
    EXPECT_TRUE(same_bits(copy_of(model.weight_grad(l), model.weight_count(l)),
                          std::vector<float>(model.weight_count(l), 0.0f)));
  }
  const Mlp same({784, 256, 10}, 1), other({784, 256, 10}, 2);
  EXPECT_TRUE(same_bits(copy_of(same.weight(1), 2560), copy_of(model.weight(1), 2560)));
  EXPECT_FALSE(same_bits(copy_of(other.weight(1), 2560), copy_of(model.weight(1), 2560)));
}

// A hand-made 2-2-2 network: hidden = relu(x), logits = (relu(x1) + 0.5, relu(x0)). The 0.5
// keeps the logits apart (they are integers and integers + 0.5), so the prediction is exact:
// class 0 iff relu(x1) + 0.5 > relu(x0). Labels agree with it except for every third image, so
// exactly 2345 - ceil(2345 / 3) = 1563 of 2345 are correct, over three evaluation blocks.
TEST(Mlp, EvaluateCountsCorrectPredictionsExactly) {
  Mlp model({2, 2, 2}, 0);
  const float identity[] = {1, 0, 0, 1};
  const float swap[] = {0, 1, 1, 0};
  std::copy(std::begin(identity), std::end(identity), model.weight(0));
  std::copy(std::begin(swap), std::end(swap), model.weight(1));
  model.bias(1)[0] = 0.5f;
  model.bias(1)[1] = 0.0f;
  const std::size_t n = 2345;
  std::vector<float> images(2 * n);
  std::vector<std::uint8_t> labels(n);
  double reference_loss = 0;
  std::size_t relu_decides = 0;  // images a network without the ReLU would classify otherwise
  for (std::size_t i = 0; i < n; ++i) {
    const double x0 = static_cast<double>(i % 7) - 3, x1 = static_cast<double>((i / 7) % 5) - 2;
    images[2 * i] = static_cast<float>(x0);
    images[2 * i + 1] = static_cast<float>(x1);
    const double logit0 = std::max(x1, 0.0) + 0.5, logit1 = std::max(x0, 0.0);
    const std::uint8_t predicted = logit0 > logit1 ? 0 : 1;
    relu_decides += predicted != (x1 + 0.5 > x0 ? 0 : 1);
    labels[i] = static_cast<std::uint8_t>(i % 3 == 0 ? 1 - predicted : predicted);
    const double top = std::max(logit0, logit1);
    reference_loss += std::log(std::exp(logit0 - top) + std::exp(logit1 - top)) + top - (labels[i] ? logit1 : logit0);
  }
  ASSERT_GT(relu_decides, 100u);
  const Mlp::Evaluation evaluation = model.evaluate(images.data(), labels.data(), n);
  EXPECT_EQ(evaluation.correct, 1563u);
  EXPECT_NEAR(evaluation.mean_loss, reference_loss / n, 1e-6 * reference_loss / n);

  // Equal logits: the lowest class is the prediction.
  const float tied[] = {1, 1, 2, 2};
  const std::uint8_t tied_labels[] = {0, 1};
  Mlp linear({2, 2}, 0);
  std::copy(std::begin(identity), std::end(identity), linear.weight(0));
  EXPECT_EQ(linear.evaluate(tied, tied_labels, 2).correct, 1u);
  EXPECT_NEAR(linear.evaluate(tied, tied_labels, 2).mean_loss, std::log(2.0), 1e-7);
}

// Dyadic values, so every step is exact: lr = 0.5, momentum = 0.5, w = 1, g1 = 0.25, g2 = 0.5:
// v1 = 0.25, w1 = 1 - 0.125 = 0.875; v2 = 0.125 + 0.5 = 0.625, w2 = 0.875 - 0.3125 = 0.5625.
TEST(MomentumSgd, DyadicStepsAreExact) {
  Mlp model({3, 2}, 0);
  MomentumSgd optimizer(0.5f, 0.5f);
  std::fill_n(model.weight(0), 6, 1.0f);
  std::fill_n(model.bias(0), 2, 1.0f);
  std::fill_n(model.weight_grad(0), 6, 0.25f);
  std::fill_n(model.bias_grad(0), 2, 0.25f);
  optimizer.step(model);
  EXPECT_TRUE(same_bits(copy_of(model.weight(0), 6), std::vector<float>(6, 0.875f)));
  EXPECT_TRUE(same_bits(copy_of(model.bias(0), 2), std::vector<float>(2, 0.875f)));
  std::fill_n(model.weight_grad(0), 6, 0.5f);
  std::fill_n(model.bias_grad(0), 2, 0.5f);
  optimizer.step(model);
  EXPECT_TRUE(same_bits(copy_of(model.weight(0), 6), std::vector<float>(6, 0.5625f)));
  EXPECT_TRUE(same_bits(copy_of(model.bias(0), 2), std::vector<float>(2, 0.5625f)));
}

// General values with weight decay: three steps against the documented per-element f32 formula
// d = g + wd * w; v = momentum * v + d; w = w - lr * v, bit for bit.
TEST(MomentumSgd, MatchesTheFormulaWithWeightDecay) {
  const float lr = 0.05f, momentum = 0.9f, decay = 1e-3f;
  Mlp model({4, 3, 2}, 9);
  MomentumSgd optimizer(lr, momentum, decay);
  std::vector<std::vector<float>> w, v;
  for (std::size_t l = 0; l < 2; ++l) {
    const std::vector<float> b = gaussian(model.bias_count(l), 50 + l);
    std::copy(b.begin(), b.end(), model.bias(l));
    w.push_back(copy_of(model.weight(l), model.weight_count(l)));
    w.push_back(copy_of(model.bias(l), model.bias_count(l)));
    v.emplace_back(model.weight_count(l), 0.0f);
    v.emplace_back(model.bias_count(l), 0.0f);
  }
  for (std::uint64_t step = 0; step < 3; ++step) {
    for (std::size_t t = 0; t < 4; ++t) {
      float* grad = t % 2 ? model.bias_grad(t / 2) : model.weight_grad(t / 2);
      const std::vector<float> g = gaussian(w[t].size(), 1000 * step + t);
      std::copy(g.begin(), g.end(), grad);
      for (std::size_t i = 0; i < g.size(); ++i) {
        const float d = g[i] + decay * w[t][i];
        v[t][i] = momentum * v[t][i] + d;
        w[t][i] = w[t][i] - lr * v[t][i];
      }
    }
    optimizer.step(model);
    for (std::size_t l = 0; l < 2; ++l) {
      SCOPED_TRACE(step);
      EXPECT_TRUE(same_bits(copy_of(model.weight(l), model.weight_count(l)), w[2 * l]));
      EXPECT_TRUE(same_bits(copy_of(model.bias(l), model.bias_count(l)), w[2 * l + 1]));
    }
  }
  Mlp other({4, 3, 3}, 9);
  EXPECT_EQ(error_code_of([&] { optimizer.step(other); }), ErrorCode::invalid_argument);
}

// A few dozen steps of the optimizer on one batch of the small network: the loss falls.
TEST(Mlp, TrainingReducesTheLossOfABatch) {
  Mlp model = small_network(13);
  const Batch batch = make_batch(12, 6, 3, 14);
  MomentumSgd optimizer(0.1f, 0.9f);
  const float initial = model.forward_backward(batch.images.data(), batch.labels.data(), 12, nullptr);
  float loss = initial;
  for (int step = 0; step < 100; ++step) {
    optimizer.step(model);
    loss = model.forward_backward(batch.images.data(), batch.labels.data(), 12, nullptr);
  }
  std::printf("loss of a fixed batch of 12: %.4f -> %.4f after 100 steps\n", initial, loss);
  EXPECT_LT(loss, initial / 2);
}

TEST(Mlp, RejectsBadArguments) {
  EXPECT_EQ(error_code_of([] { Mlp({5}, 1); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([] { Mlp({5, 0, 3}, 1); }), ErrorCode::invalid_argument);
  Mlp model({2, 3}, 1);
  EXPECT_EQ(error_code_of([&] { model.weight(1); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { model.bias_count(1); }), ErrorCode::invalid_argument);
  const float images[] = {1, 2, 3, 4};
  const std::uint8_t labels[] = {2, 3};
  std::string message;
  EXPECT_EQ(error_code_of([&] { model.forward_backward(images, labels, 2, nullptr); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("label 1 is 3"), std::string::npos) << message;
  EXPECT_TRUE(same_bits(copy_of(model.weight_grad(0), 6), std::vector<float>(6, 0.0f)));
  EXPECT_EQ(error_code_of([&] { model.forward_backward(images, labels, 0, nullptr); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { model.evaluate(images, labels, 2); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { model.evaluate(images, labels, 0); }), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace gradzip
