// Data parallelism through the Reducer is exact: training with `none` on P ranks, each on its
// slice of every global batch, gives the weights a one-rank run over the same global batches
// gives, up to f32 reassociation (the P ranks' mean gradients are averaged instead of one mean
// being taken over the whole batch). At one rank the two runs are the same computation and
// must agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/transport/self_transport.h"
#include "examples/fashion_mnist/trainer.h"
#include "gradzip/communicator.h"
#include "tests/multirank/multirank_support.h"

namespace gradzip {
namespace {

using examples::ImageSet;
using examples::Mlp;

// 600 images of 28x28 with pixels in [0, 1] and labels 0..9, the same on every rank.
ImageSet synthetic_images(std::size_t count, std::uint64_t seed) {
  ImageSet set;
  set.count = count;
  set.rows = 28;
  set.cols = 28;
  set.pixels.resize(count * 28 * 28);
  set.labels.resize(count);
  std::uint64_t state = seed;
  const auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(state >> 33);
  };
  for (float& pixel : set.pixels) pixel = static_cast<float>(next() % 256) / 255.0f;
  for (std::uint8_t& label : set.labels) label = static_cast<std::uint8_t>(next() % 10);
  return set;
}

// Uncompressed training of `max_steps` steps over global batches of 60 images (divisible by
// 1 .. 5 ranks; 10 steps per epoch of the 600 synthetic images), no evaluation.
examples::TrainOptions uncompressed_steps(std::size_t max_steps) {
  examples::TrainOptions options;
  options.spec = "none";
  options.global_batch = 60;
  options.epochs = max_steps / 10 + 1;
  options.max_steps = max_steps;
  options.evaluate = false;
  return options;
}

TEST(FashionMnistTraining, DataParallelNoneEqualsOneRankOverTheSameGlobalBatches) {
  const ImageSet train = synthetic_images(600, 7);
  const ImageSet test = synthetic_images(100, 8);
  // Into the second epoch: a reshuffle too.
  const examples::TrainOptions options = uncompressed_steps(14);
  const std::vector<std::size_t> sizes = {784, 64, 32, 10};

  Communicator world = Communicator::world();
  Mlp parallel(sizes, 3);
  examples::train(world, parallel, train, test, options, [](const examples::EpochReport&) {});

  Communicator alone = collectives::make_communicator(std::make_unique<collectives::SelfTransport>());
  Mlp reference(sizes, 3);
  examples::train(alone, reference, train, test, options, [](const examples::EpochReport&) {});

  // Per element: |w_P - w_1| <= 1e-4 * max |w_1| of the tensor. f32 sums of 60 products
  // reassociated over P ranks differ by a few ulps per gradient element; 14 momentum steps at
  // lr 0.05 carry that to ~1e-6 of the weights' scale, far under the bound, while a rank that
  // trained on the wrong slice, or an average that is off by a factor, moves weights by ~1e-2.
  for (std::size_t l = 0; l < reference.layer_count(); ++l) {
    const auto check = [&](const float* got, const float* want, std::size_t count, const char* what) {
      float scale = 0;
      float worst = 0;
      for (std::size_t i = 0; i < count; ++i) {
        scale = std::max(scale, std::abs(want[i]));
        worst = std::max(worst, std::abs(got[i] - want[i]));
      }
      if (world.size() == 1) {
        EXPECT_EQ(worst, 0.0f) << what << " of layer " << l << " at one rank";
      } else {
        EXPECT_LE(worst, 1e-4f * scale) << what << " of layer " << l << " (scale " << scale << ")";
      }
    };
    check(parallel.weight(l), reference.weight(l), reference.weight_count(l), "weight");
    check(parallel.bias(l), reference.bias(l), reference.bias_count(l), "bias");
  }
  // The runs trained: the weights moved from their initial values.
  const Mlp initial(sizes, 3);
  float moved = 0;
  for (std::size_t i = 0; i < reference.weight_count(0); ++i)
    moved = std::max(moved, std::abs(reference.weight(0)[i] - initial.weight(0)[i]));
  EXPECT_GT(moved, 1e-3f);
}

// Momentum correction without compression is momentum on the averaged gradient: the average
// of the ranks' momenta u_r = m u_r + g_r is the momentum of the averaged gradient. So a
// P-rank run with it matches a one-rank run without it, up to f32 reassociation.
TEST(FashionMnistTraining, MomentumCorrectionWithoutCompressionIsGlobalMomentum) {
  const ImageSet train = synthetic_images(600, 11);
  const ImageSet test = synthetic_images(100, 12);
  examples::TrainOptions options = uncompressed_steps(8);
  const std::vector<std::size_t> sizes = {784, 32, 10};

  Communicator world = Communicator::world();
  options.momentum_correction = true;
  Mlp corrected(sizes, 5);
  examples::train(world, corrected, train, test, options, [](const examples::EpochReport&) {});

  Communicator alone = collectives::make_communicator(std::make_unique<collectives::SelfTransport>());
  options.momentum_correction = false;
  Mlp global(sizes, 5);
  examples::train(alone, global, train, test, options, [](const examples::EpochReport&) {});

  // The same bound and reasoning as above (u and v differ by reassociated sums only).
  for (std::size_t l = 0; l < global.layer_count(); ++l) {
    float scale = 0;
    float worst = 0;
    for (std::size_t i = 0; i < global.weight_count(l); ++i) {
      scale = std::max(scale, std::abs(global.weight(l)[i]));
      worst = std::max(worst, std::abs(corrected.weight(l)[i] - global.weight(l)[i]));
    }
    EXPECT_LE(worst, 1e-4f * scale) << "weight of layer " << l;
  }
}

}  // namespace
}  // namespace gradzip
