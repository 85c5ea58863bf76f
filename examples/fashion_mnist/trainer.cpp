#include "examples/fashion_mnist/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "gradzip/error.h"
#include "gradzip/reducer.h"

namespace gradzip::examples {
namespace {

// A permutation of 0 .. n-1 from (seed, epoch): Fisher-Yates with our own bounded draws, so
// every rank and every standard library gives the same order.
std::vector<std::uint32_t> epoch_order(std::size_t n, std::uint64_t seed, std::size_t epoch) {
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + epoch + 1;
  const auto next = [&state] {  // splitmix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (std::size_t i = n; i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(next() % i);  // bias < 2^-40 for n = 60000
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace

std::string weight_name(std::size_t layer) { return "fc" + std::to_string(layer + 1) + ".weight"; }
std::string bias_name(std::size_t layer) { return "fc" + std::to_string(layer + 1) + ".bias"; }

void train(Communicator& communicator, Mlp& model, const ImageSet& train, const ImageSet& test,
           const TrainOptions& options, const std::function<void(const EpochReport&)>& on_epoch) {
  const std::size_t ranks = static_cast<std::size_t>(communicator.size());
  const std::size_t rank = static_cast<std::size_t>(communicator.rank());
  const std::size_t features = model.sizes().front();
  GZ_REQUIRE(options.global_batch > 0 && options.global_batch % ranks == 0,
             ErrorCode::invalid_argument, "train: a global batch of ", options.global_batch,
             " images does not split evenly over ", ranks, " ranks");
  GZ_REQUIRE(train.rows * train.cols == features && test.rows * test.cols == features,
             ErrorCode::invalid_argument, "train: images of ", train.rows, "x", train.cols,
             " pixels for a model with ", features, " inputs");
  GZ_REQUIRE(train.count >= options.global_batch, ErrorCode::invalid_argument, "train: ",
             train.count, " training images for a global batch of ", options.global_batch);
  const std::size_t local_batch = options.global_batch / ranks;
  const std::size_t steps_per_epoch = train.count / options.global_batch;
  GZ_REQUIRE(options.schedule == "cosine" || options.schedule == "constant",
             ErrorCode::invalid_argument, "train: learning-rate schedule '", options.schedule,
             "' (accepted: cosine, constant)");
  std::size_t total_steps = steps_per_epoch * options.epochs;
  if (options.max_steps != 0) total_steps = std::min(total_steps, options.max_steps);
  const auto learning_rate = [&](std::size_t step) {
    if (options.schedule == "constant" || total_steps == 0) return options.lr;
    const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
    return static_cast<float>(options.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
  };

  ReducerOptions reducer_options;
  reducer_options.spec = options.spec;
  reducer_options.lanes = options.lanes;
  Reducer reducer(communicator, reducer_options);
  const std::size_t layers = model.layer_count();
  for (std::size_t l = 0; l < layers; ++l) {  // forward order
    const std::size_t out = model.sizes()[l + 1];
    const std::size_t in = model.sizes()[l];
    reducer.add(weight_name(l), host_view(model.weight_grad(l), model.weight_count(l)), {out, in});
    reducer.add(bias_name(l), host_view(model.bias_grad(l), model.bias_count(l)), {out});
  }
  // With momentum correction the momentum lives in `local_velocity` (per rank, before the
  // Reducer) and the optimizer is plain SGD on what the Reducer averaged.
  MomentumSgd optimizer(options.lr, options.momentum_correction ? 0.0f : options.momentum);
  std::vector<std::vector<float>> local_velocity;
  if (options.momentum_correction) {
    for (std::size_t l = 0; l < layers; ++l) {
      local_velocity.emplace_back(model.weight_count(l), 0.0f);
      local_velocity.emplace_back(model.bias_count(l), 0.0f);
    }
  }
  // The gradient buffer of layer l's weight (part 0) or bias (part 1) becomes the rank's
  // momentum u = momentum * u + g.
  const auto correct_momentum = [&](std::size_t layer) {
    for (std::size_t part = 0; part < 2; ++part) {
      std::vector<float>& velocity = local_velocity[2 * layer + part];
      float* const gradient = part == 0 ? model.weight_grad(layer) : model.bias_grad(layer);
      for (std::size_t i = 0; i < velocity.size(); ++i) {
        velocity[i] = options.momentum * velocity[i] + gradient[i];
        gradient[i] = velocity[i];
      }
    }
  };

  std::vector<float> batch_images(local_batch * features);
  std::vector<std::uint8_t> batch_labels(local_batch);
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t bytes_sent = 0;
  std::uint64_t encoded_input = 0;
  std::uint64_t encoded_message = 0;
  std::size_t step = 0;
  for (std::size_t epoch = 0; epoch < options.epochs; ++epoch) {
    const std::vector<std::uint32_t> order = epoch_order(train.count, options.seed, epoch);
    double loss_sum = 0;
    std::size_t epoch_steps = 0;
    for (std::size_t s = 0; s < steps_per_epoch; ++s) {
      if (options.max_steps != 0 && step >= options.max_steps) break;
      // This rank's slice of the step's global batch.
      const std::size_t first = s * options.global_batch + rank * local_batch;
      for (std::size_t i = 0; i < local_batch; ++i) {
        const std::size_t image = order[first + i];
        std::copy_n(train.pixels.data() + image * features, features,
                    batch_images.data() + i * features);
        batch_labels[i] = train.labels[image];
      }
      // Backward hands each layer to the Reducer as soon as its gradients exist.
      const float loss = model.forward_backward(
          batch_images.data(), batch_labels.data(), local_batch, [&](std::size_t layer) {
            if (options.momentum_correction) correct_momentum(layer);
            reducer.mark_ready(weight_name(layer));
            reducer.mark_ready(bias_name(layer));
          });
      reducer.wait();  // every gradient is now the average over the ranks
      optimizer.set_learning_rate(learning_rate(step));
      optimizer.step(model);
      const ReducerStats& stats = reducer.stats();
      bytes_sent += stats.sent_bytes;
      for (const ReducerBucketStats& bucket : stats.buckets) {
        for (const ReducerGroupStats& group : bucket.groups) {
          encoded_input += group.encoded_input_bytes;
          encoded_message += group.encoded_message_bytes;
        }
      }
      reducer.step();
      loss_sum += loss;
      ++epoch_steps;
      ++step;
    }
    EpochReport report;
    report.epoch = epoch + 1;
    report.step = step;
    // The ranks' batch losses differ; their mean is the global batch's loss.
    std::vector<float> mean_loss = {static_cast<float>(epoch_steps ? loss_sum / static_cast<double>(epoch_steps) : 0.0)};
    communicator.allreduce(host_view(mean_loss.data(), 1), "train_loss", "none", ReduceOp::average);
    report.train_loss = mean_loss[0];
    if (options.evaluate) {
      const Mlp::Evaluation evaluation = model.evaluate(test.pixels.data(), test.labels.data(), test.count);
      report.test_loss = evaluation.mean_loss;
      report.test_accuracy = static_cast<double>(evaluation.correct) / static_cast<double>(test.count);
    }
    report.bytes_sent = bytes_sent;
    report.compression_ratio = encoded_message > 0 ? static_cast<double>(encoded_input) /
                                                         static_cast<double>(encoded_message)
                                                   : 1.0;
    report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    on_epoch(report);
    if (options.max_steps != 0 && step >= options.max_steps) break;
  }
}

}  // namespace gradzip::examples
