// Data-parallel training of the MLP on Fashion-MNIST through gradzip's Reducer: the loop that
// examples/train_fashion_mnist.cpp runs and tests/multirank/test_fashion_mnist_training.cpp
// checks. Copy it into a training loop of your own: register every parameter's gradient once,
// mark each layer ready as backward produces it, wait, step the optimizer, step the Reducer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "examples/fashion_mnist/idx.h"
#include "examples/fashion_mnist/mlp.h"
#include "gradzip/communicator.h"

namespace gradzip::examples {

struct TrainOptions {
  std::string spec = "none";          // the Reducer's model spec (default rules apply)
  std::size_t epochs = 5;
  std::size_t global_batch = 240;     // images per step over all ranks; a multiple of the rank count
  float lr = 0.1f;                    // peak learning rate
  // "cosine": lr * (1 + cos(pi * t / T)) / 2 at step t of T (the run's steps), which ends the run
  // near lr 0 so the final accuracy is not the noise of one large step; "constant": lr.
  std::string schedule = "cosine";
  float momentum = 0.9f;
  std::uint64_t seed = 1;             // weights and the shuffle of every epoch
  // Momentum correction (Lin et al., "Deep Gradient Compression", ICLR 2018): every rank keeps
  // its own momentum u = momentum * u + g and hands u, not g, to the Reducer; the update is then
  // plain SGD on the averaged u. Without compression this is the same as momentum on the
  // averaged gradient (the average of the ranks' u is the global momentum); with sparsifying
  // codecs and error feedback it keeps the momentum from amplifying the delayed residuals.
  bool momentum_correction = false;
  std::size_t max_steps = 0;          // stop after this many steps in all (0: no limit)
  int lanes = 2;                      // the Reducer's communication threads
  bool evaluate = true;               // test loss and accuracy after every epoch
};

struct EpochReport {
  std::size_t epoch = 0;              // 1-based
  std::size_t step = 0;               // steps done so far
  double train_loss = 0;              // mean over this epoch's steps of the global batch's mean loss
  double test_loss = 0;
  double test_accuracy = 0;           // in [0, 1]
  std::uint64_t bytes_sent = 0;       // by this rank since the start (ReducerStats::sent_bytes)
  double compression_ratio = 1;       // f32 bytes over message bytes of compressed chunks so far
  double wall_seconds = 0;            // since the start
};

// Trains `model` on `train` with every rank of `communicator` (a collective: every rank calls it
// with the same options, data and initial model). Each epoch shuffles the training images with
// a permutation drawn from (seed, epoch), the same on every rank; step s takes the next
// global_batch images of it, and rank r trains on its slice [r B / P, (r + 1) B / P), so the
// ranks' slices together are exactly the batch a one-rank run takes. Gradients are averaged by
// a Reducer with options.spec; backward marks each layer ready as soon as its gradients exist.
// After every epoch `on_epoch` gets the report (every rank evaluates the whole test set: the
// weights are identical on every rank). Throws gradzip::Error for bad options.
void train(Communicator& communicator, Mlp& model, const ImageSet& train, const ImageSet& test,
           const TrainOptions& options, const std::function<void(const EpochReport&)>& on_epoch);

// The names the Reducer knows layer l's parameters by: "fc<l+1>.weight", "fc<l+1>.bias".
std::string weight_name(std::size_t layer);
std::string bias_name(std::size_t layer);

}  // namespace gradzip::examples
