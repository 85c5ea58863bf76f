// gradzip-bench overlap: how much of the Reducer's communication backward hides. Run it under
// mpirun (one rank works too):
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bin/gradzip-bench overlap [options]
//
// Overlap needs something idle to overlap with. Over shared memory on a host whose cores all
// run backward, communication is CPU work that competes with backward, and overlapped ~=
// sequential; on slow links (benchmarks/emulated_cluster.sh) the ranks mostly wait for the wire,
// which backward can fill. With bucket_bytes B, the last bucket holds the first layers and
// starts when backward ends, so about B / (model bytes) of the communication cannot be hidden.
//
// The model. The layer shapes of a transformer's blocks, GPT-2 style, without the embeddings:
// per block, in forward (registration) order,
//   ln1 (norm, width d)  attn.qkv (linear d -> 3d)  attn.proj (linear d -> d)
//   ln2 (norm, width d)  mlp.fc1 (linear d -> 4d)   mlp.fc2 (linear 4d -> d)
// then a final norm ln_f. A linear layer d_in -> d_out has a weight of shape [d_out, d_in] and a
// bias [d_out]; a norm of width d a weight [d] and a bias [d]. Parameters:
//   blocks * (12 d^2 + 13 d) + 2 d
//   --model 25m:   d = 512, 8 blocks: 25,220,096 parameters (100.9 MB of f32 gradients)
//   --model small: d = 128, 2 blocks:    396,800 parameters (1.6 MB; for tests)
// (small's weight matrices are 64 KiB and more, so the default bytes<65536 rule leaves them to
// the codec.)
//
// Backward. Layers run in reverse order; each computes its gradients with real arithmetic from
// a saved input X (batch x d_in) and an output gradient dY (batch x d_out), both filled once
// with values in [-1, 1) seeded by (rank, layer), so every rank's gradients differ:
//   linear: dW = dY^T X (an Eigen f32 GEMM, 2 * batch * d_in * d_out flops), db = column sums of dY
//   norm:   dgamma = column sums of X .* dY, dbeta = column sums of dY
// (The input gradient dX = dY W^T, which a real backward also computes, is skipped: it is no
// parameter gradient. --batch scales the work instead.) The gradients land in the buffers
// registered with the Reducer, which reads them: the work cannot be optimised away.
//
// The measurement. For each --codec spec a Reducer is made with the options given (--lanes,
// --first-bucket-bytes, --bucket-bytes, --chunk-bytes) and the model's parameters registered
// in forward order. Each iteration runs the four phases below one after the other, each between
// two barriers that sleep while they wait (so that ranks waiting for the slowest one do not
// burn the CPU the others need); --warmup iterations run first untimed, then --iters timed ones. A phase's
// time in one iteration is the slowest rank's (max over ranks of each rank's wall time); the
// figure reported is the median over the timed iterations. reducer.step() follows every phase
// that uses the Reducer (outside the timed region), so the spec's step counter advances by 3
// per iteration.
//   compute_s     backward only, no Reducer calls
//   comm_s        the Reducer alone: mark_all_ready() then wait(), on gradients written by an
//                 untimed backward just before the barrier
//   sequential_s  backward, then mark_all_ready() and wait(): no overlap
//   overlapped_s  backward with mark_ready() of each gradient as soon as its layer has
//                 produced it, then wait()
//   exposed_comm_s     overlapped_s - compute_s (negative when noise makes it so)
//   reducer_exposed_s  median over the overlapped steps of ReducerStats::exposed_seconds (the
//                      time blocked in wait(), slowest rank)
//   overlap_vs_max     overlapped_s / max(compute_s, comm_s)   (1: perfect overlap)
//   overlap_vs_compute overlapped_s / compute_s
//   hidden_comm_fraction  (sequential_s - overlapped_s) / comm_s: the share of the
//                      communication that backward hid
//   hidden_fraction    (sequential_s - overlapped_s) / min(compute_s, comm_s): the share of the
//                      hideable time that was hidden
//   compute_cpu_core_s, comm_cpu_core_s  median busy core-seconds of the whole host during a
//                      compute-only / comm-only step (/proc/stat, read by rank 0 between the
//                      barriers; includes the kernel's TCP work, which on the emulated cluster
//                      runs on the cores backward uses). Meaningful when all ranks share a host.
//   cpu_bound_s        (compute_cpu_core_s + comm_cpu_core_s) / host cores: the shortest an
//                      overlapped step can be when the cores, not the links, are the bottleneck
// sent_bytes, compression_ratio, buckets and algorithms come from the Reducer's stats of the last
// overlapped step (sent_bytes: max over ranks; the others: rank 0's). The JSON keeps the raw
// per-iteration samples of every phase; what each sequential and overlapped step contained by
// the ranks' own clocks (sequential_contained_samples_s: backward plus the Reducer's
// communication that followed it; overlapped_backward_samples_s: backward; slowest rank); the
// Reducer's own communication_seconds of every comm-only step and exposed_seconds of every
// overlapped step; and rank 0's whole ReducerStats of the last overlapped step (bucket launch
// and done times: where the overlap went).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "benchmarks/bench_support.h"
#include "gradzip/error.h"

#if GRADZIP_HAVE_MPI
#include <mpi.h>

#include <Eigen/Dense>

#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/reducer.h"
#include "collectives/timeline.h"
#include "pipeline/model_spec.h"
#endif

namespace gradzip::bench {

#if !GRADZIP_HAVE_MPI

int run_overlap(int /*argc*/, char** /*argv*/) { return report_mpi_unavailable("overlap"); }

#else

namespace {

// The layer shapes of the model (see the top of this file).
struct ModelShape {
  std::string name;
  std::size_t width = 0;   // d
  std::size_t blocks = 0;
};

const std::vector<ModelShape> kModels = {{"small", 128, 2}, {"25m", 512, 8}};

struct Options {
  ModelShape model = kModels[1];
  std::size_t batch = 32;
  std::vector<std::string> specs;
  int iters = 10;
  int warmup = 2;
  ReducerOptions reducer;  // spec is set per --codec
  std::string json_path;
  std::string trace_path;  // --trace: the Reducer's timeline of the last overlapped step
  bool help = false;
};

const std::vector<std::string> kDefaultSpecs = {"none", "fp16", "topk:ratio=0.01"};

void print_help() {
  const ReducerOptions defaults;
  std::printf(
      "usage: mpirun -np P gradzip-bench overlap [--model small|25m] [--batch N]\n"
      "                                      [--codec SPEC]... [--iters N] [--warmup N] [--lanes N]\n"
      "                                      [--first-bucket-bytes B] [--bucket-bytes B]\n"
      "                                      [--chunk-bytes B] [--json FILE] [--trace FILE]\n"
      "  --model M     layer shapes of a transformer's blocks: 25m (d=512, 8 blocks, 25.2M\n"
      "                parameters; default) or small (d=128, 2 blocks, 0.4M)\n"
      "  --batch N     rows of the emulated activations; backward costs 2*N flops per weight\n"
      "                (default 32)\n"
      "  --codec SPEC  a Reducer model spec (ReducerOptions::spec, rules allowed); repeat for\n"
      "                several (default none, fp16, topk:ratio=0.01)\n"
      "  --iters N     timed iterations; medians are reported (default 10)\n"
      "  --warmup N    untimed iterations first (default 2)\n"
      "  --lanes N, --first-bucket-bytes B, --bucket-bytes B, --chunk-bytes B\n"
      "                ReducerOptions (defaults %d, %zu, %zu, %zu)\n"
      "  --json FILE   also write one JSON object per spec to FILE (rank 0)\n"
      "  --trace FILE  the Reducer's timeline (Chrome trace / Perfetto JSON) of the last\n"
      "                overlapped step, one file per rank (FILE with .rank<R> before its\n"
      "                extension; with several --codec, .spec<I> before that)\n"
      "Each iteration times, after a barrier each: backward alone (compute), the Reducer alone\n"
      "(comm), backward then the Reducer (sequential), backward marking gradients ready as they\n"
      "appear (overlapped). A time is the slowest rank's; the median over iterations is shown.\n",
      defaults.lanes, defaults.first_bucket_bytes, defaults.bucket_bytes, defaults.chunk_bytes);
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* {
      GZ_REQUIRE(i + 1 < argc, ErrorCode::invalid_argument, "overlap: ", arg, " needs a value");
      return argv[++i];
    };
    const auto positive = [&](const char* text) {
      const std::size_t count = parse_count("overlap", text, arg);
      GZ_REQUIRE(count >= 1, ErrorCode::invalid_argument, "overlap: ", arg, " must be >= 1");
      return count;
    };
    if (arg == "--model") {
      const std::string name = value();
      const auto found = std::find_if(kModels.begin(), kModels.end(),
                                      [&](const ModelShape& model) { return model.name == name; });
      GZ_REQUIRE(found != kModels.end(), ErrorCode::invalid_argument, "overlap: --model '", name,
                 "' is not one of small, 25m");
      options.model = *found;
    } else if (arg == "--batch") {
      options.batch = positive(value());
    } else if (arg == "--codec") {
      options.specs.emplace_back(value());
      // Bad specs fail here, before MPI starts, with the parser's message.
      pipeline::ModelSpec::parse(options.specs.back(), options.reducer.default_rules,
                                 CompressionSpec{});
    } else if (arg == "--iters") {
      options.iters = static_cast<int>(positive(value()));
    } else if (arg == "--warmup") {
      options.warmup = static_cast<int>(parse_count("overlap", value(), arg));
    } else if (arg == "--lanes") {
      options.reducer.lanes = static_cast<int>(positive(value()));
    } else if (arg == "--first-bucket-bytes") {
      options.reducer.first_bucket_bytes = positive(value());
    } else if (arg == "--bucket-bytes") {
      options.reducer.bucket_bytes = positive(value());
    } else if (arg == "--chunk-bytes") {
      options.reducer.chunk_bytes = positive(value());
    } else if (arg == "--json") {
      options.json_path = value();
    } else if (arg == "--trace") {
      options.trace_path = value();
    } else if (arg == "--help" || arg == "-h") {
      options.help = true;
    } else {
      GZ_THROW(ErrorCode::invalid_argument, "overlap: unknown option '", arg,
               "' (see gradzip-bench overlap --help)");
    }
  }
  if (options.specs.empty()) options.specs = kDefaultSpecs;
  return options;
}

// ---- the emulated model --------------------------------------------------------------------

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Parameter {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> gradient;
};

// One layer's backward: its saved input and the gradient arriving at its output, and the two
// parameters (weight, bias) whose gradients it produces.
struct Layer {
  enum class Kind { linear, norm };
  Kind kind = Kind::linear;
  std::size_t weight = 0;  // index into EmulatedModel::parameters()
  std::size_t bias = 0;
  Eigen::MatrixXf input;        // batch x d_in (norm: batch x d)
  Eigen::MatrixXf output_grad;  // batch x d_out (norm: batch x d)
};

class EmulatedModel {
 public:
  EmulatedModel(const ModelShape& shape, std::size_t batch, int rank) : batch_(batch) {
    const std::size_t d = shape.width;
    for (std::size_t b = 0; b < shape.blocks; ++b) {
      const std::string block = "blocks." + std::to_string(b) + ".";
      add_norm(block + "ln1", d, rank);
      add_linear(block + "attn.qkv", d, 3 * d, rank);
      add_linear(block + "attn.proj", d, d, rank);
      add_norm(block + "ln2", d, rank);
      add_linear(block + "mlp.fc1", d, 4 * d, rank);
      add_linear(block + "mlp.fc2", 4 * d, d, rank);
    }
    add_norm("ln_f", d, rank);
  }

  // In forward order (the order the Reducer wants them registered).
  const std::vector<Parameter>& parameters() const { return parameters_; }

  std::size_t parameter_count() const {
    std::size_t count = 0;
    for (const Parameter& parameter : parameters_) count += parameter.gradient.size();
    return count;
  }

  // The GEMM flops of one backward: 2 * batch * d_in * d_out per linear layer (the column
  // sums, O(batch * d), are not counted).
  std::uint64_t gemm_flops() const { return gemm_flops_; }

  // Registers every gradient buffer with `reducer`, in forward order.
  void register_with(Reducer& reducer) {
    for (Parameter& parameter : parameters_)
      reducer.add(parameter.name, host_view(parameter.gradient.data(), parameter.gradient.size()),
                  parameter.shape);
  }

  // Runs backward, layers in reverse order; after each layer has written its gradients,
  // calls on_layer_done(weight name, bias name).
  template <typename OnLayerDone>
  void backward(OnLayerDone&& on_layer_done) {
    for (auto layer = layers_.rbegin(); layer != layers_.rend(); ++layer) {
      Parameter& weight = parameters_[layer->weight];
      Parameter& bias = parameters_[layer->bias];
      Eigen::Map<Eigen::RowVectorXf> bias_grad(bias.gradient.data(),
                                               static_cast<Eigen::Index>(bias.gradient.size()));
      if (layer->kind == Layer::Kind::linear) {
        Eigen::Map<RowMajorMatrix> weight_grad(weight.gradient.data(), layer->output_grad.cols(),
                                               layer->input.cols());
        weight_grad.noalias() = layer->output_grad.transpose() * layer->input;
      } else {
        Eigen::Map<Eigen::RowVectorXf> weight_grad(
            weight.gradient.data(), static_cast<Eigen::Index>(weight.gradient.size()));
        weight_grad = layer->input.cwiseProduct(layer->output_grad).colwise().sum();
      }
      bias_grad = layer->output_grad.colwise().sum();
      on_layer_done(weight.name, bias.name);
    }
  }

 private:
  void add_linear(const std::string& name, std::size_t in, std::size_t out, int rank) {
    add_layer(Layer::Kind::linear, name, {out, in}, in, out, rank);
    gemm_flops_ += 2ull * batch_ * in * out;
  }
  void add_norm(const std::string& name, std::size_t width, int rank) {
    add_layer(Layer::Kind::norm, name, {width}, width, width, rank);
  }

  void add_layer(Layer::Kind kind, const std::string& name, std::vector<std::size_t> weight_shape,
                 std::size_t in, std::size_t out, int rank) {
    std::size_t weight_count = 1;
    for (const std::size_t extent : weight_shape) weight_count *= extent;
    Layer layer;
    layer.kind = kind;
    layer.weight = parameters_.size();
    parameters_.push_back(
        {name + ".weight", std::move(weight_shape), std::vector<float>(weight_count)});
    layer.bias = parameters_.size();
    parameters_.push_back({name + ".bias", {out}, std::vector<float>(out)});
    // Values in [-1, 1), different for every (rank, layer).
    std::mt19937 engine(static_cast<std::uint32_t>(1000003u * static_cast<unsigned>(rank) +
                                                   static_cast<unsigned>(layers_.size())));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const auto rows = static_cast<Eigen::Index>(batch_);
    layer.input = Eigen::MatrixXf::NullaryExpr(rows, static_cast<Eigen::Index>(in),
                                               [&] { return uniform(engine); });
    layer.output_grad = Eigen::MatrixXf::NullaryExpr(rows, static_cast<Eigen::Index>(out),
                                                     [&] { return uniform(engine); });
    layers_.push_back(std::move(layer));
  }

  std::size_t batch_;
  std::vector<Parameter> parameters_;
  std::vector<Layer> layers_;  // forward order
  std::uint64_t gemm_flops_ = 0;
};

// ---- measurement ---------------------------------------------------------------------------

enum class Phase { compute, comm, sequential, overlapped };
constexpr Phase kPhases[] = {Phase::compute, Phase::comm, Phase::sequential, Phase::overlapped};

// What one rank saw in one step of a phase; max_over_ranks() turns it into the slowest rank's.
struct StepSample {
  double step_seconds = 0;             // the timed region
  // What this rank timed inside the step, by its own clock (0 for compute and comm): backward
  // (overlapped), backward plus the Reducer's communication_seconds that followed it
  // (sequential). At most step_seconds on every rank, so also after max_over_ranks: a check
  // that each step really contains its phases, immune to load that slows one step against
  // another.
  double contained_seconds = 0;
  double reducer_comm_seconds = 0;     // ReducerStats::communication_seconds (0 for compute)
  double reducer_exposed_seconds = 0;  // ReducerStats::exposed_seconds (0 for compute)
  // ReducerStats::last_ready_seconds (0 for compute): > 0 when a bucket went out before
  // backward's last mark_ready. Combined over ranks by its minimum, not its maximum.
  double reducer_last_ready_seconds = 0;
  // Core-seconds the whole host was busy (user, system, interrupts: /proc/stat) from the
  // barrier before the step to a barrier after it, read by rank 0 (the others report 0). It
  // covers the kernel's TCP work, which on the emulated cluster runs on the same cores as
  // backward. Meaningful when every rank shares rank 0's host; -1 when /proc/stat is missing.
  double host_busy_core_seconds = 0;
};

// bench::max_over_ranks(double / uint64): the StepSample overload declared in this namespace
// would otherwise hide them from the calls below.
using bench::max_over_ranks;

StepSample max_over_ranks(StepSample mine) {
  // The last value is negated, so that MPI_MAX gives the minimum over ranks.
  double values[6] = {mine.step_seconds,
                      mine.contained_seconds,
                      mine.reducer_comm_seconds,
                      mine.reducer_exposed_seconds,
                      mine.host_busy_core_seconds,
                      -mine.reducer_last_ready_seconds};
  MPI_Allreduce(MPI_IN_PLACE, values, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  StepSample slowest;
  slowest.step_seconds = values[0];
  slowest.contained_seconds = values[1];
  slowest.reducer_comm_seconds = values[2];
  slowest.reducer_exposed_seconds = values[3];
  slowest.host_busy_core_seconds = values[4];
  slowest.reducer_last_ready_seconds = -values[5];
  return slowest;
}

// Busy core-seconds of the host since boot (all /proc/stat "cpu" fields but idle and iowait),
// or -1 when /proc/stat cannot be read.
double host_busy_core_seconds() {
  std::ifstream stat("/proc/stat");
  std::string label;
  double fields[10] = {};
  if (!(stat >> label) || label != "cpu") return -1;
  for (double& field : fields)
    if (!(stat >> field)) field = 0;
  // user nice system idle iowait irq softirq steal (guest and guest_nice are inside user).
  const double busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7];
  static const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  return busy / ticks_per_second;
}

// A barrier that sleeps while it waits (MPI_Barrier spins): the host's busy time around a
// phase then counts the phase's work, not ranks spinning until the slowest one arrives.
void quiet_barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// This rank's sample of one step of `phase`. Every rank starts the timed region right after a
// barrier; reducer.step() and reading the stats happen after it.
StepSample run_step(Phase phase, EmulatedModel& model, Reducer& reducer) {
  const auto no_reducer = [](const std::string&, const std::string&) {};
  // The comm-only phase reduces fresh gradients, as the other phases do.
  if (phase == Phase::comm) model.backward(no_reducer);
  quiet_barrier();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool reads_host = rank == 0;
  const double busy_before = reads_host ? host_busy_core_seconds() : 0.0;
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point from) {
    return std::chrono::duration<double>(Clock::now() - from).count();
  };
  const auto start = Clock::now();
  double backward_seconds = 0;
  switch (phase) {
    case Phase::compute:
      model.backward(no_reducer);
      break;
    case Phase::comm:
      reducer.mark_all_ready();
      reducer.wait();
      break;
    case Phase::sequential:
      model.backward(no_reducer);
      backward_seconds = seconds_since(start);
      reducer.mark_all_ready();
      reducer.wait();
      break;
    case Phase::overlapped:
      model.backward([&](const std::string& weight, const std::string& bias) {
        reducer.mark_ready(weight);
        reducer.mark_ready(bias);
      });
      backward_seconds = seconds_since(start);
      reducer.wait();
      break;
  }
  StepSample sample;
  sample.step_seconds = seconds_since(start);
  sample.contained_seconds = backward_seconds;
  quiet_barrier();
  if (reads_host) {
    const double busy_after = host_busy_core_seconds();
    sample.host_busy_core_seconds = busy_before < 0 || busy_after < 0 ? -1.0 : busy_after - busy_before;
  }
  if (phase != Phase::compute) {
    reducer.step();
    sample.reducer_comm_seconds = reducer.stats().communication_seconds;
    sample.reducer_exposed_seconds = reducer.stats().exposed_seconds;
    sample.reducer_last_ready_seconds = reducer.stats().last_ready_seconds;
    // The sequential step's communication starts at mark_all_ready(), after backward.
    if (phase == Phase::sequential) sample.contained_seconds += sample.reducer_comm_seconds;
  }
  return sample;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

struct Row {
  std::string spec;
  int ranks = 1;
  // Slowest-rank step times of the timed iterations, by phase (kPhases order).
  std::vector<double> samples[4];
  std::vector<double> host_busy_samples[4];     // host busy core-seconds, by phase
  std::vector<double> reducer_comm_samples;     // comm-only steps
  std::vector<double> reducer_exposed_samples;  // overlapped steps
  std::vector<double> reducer_last_ready_samples;  // overlapped steps, minimum over ranks
  std::vector<double> contained_samples[4];     // StepSample::contained_seconds, by phase
  std::uint64_t sent_bytes = 0;
  std::uint64_t gradient_bytes = 0;
  double compression_ratio = 1;
  std::size_t buckets = 0;
  std::vector<std::string> algorithms;
  std::string reducer_stats_json;  // ReducerStats::to_json() of the last overlapped step

  double compute_s() const { return median(samples[0]); }
  double comm_s() const { return median(samples[1]); }
  double sequential_s() const { return median(samples[2]); }
  double overlapped_s() const { return median(samples[3]); }
  double exposed_comm_s() const { return overlapped_s() - compute_s(); }
  double reducer_exposed_s() const { return median(reducer_exposed_samples); }
  double overlap_vs_max() const { return overlapped_s() / std::max(compute_s(), comm_s()); }
  double overlap_vs_compute() const { return overlapped_s() / compute_s(); }
  double compute_cpu_core_s() const { return median(host_busy_samples[0]); }
  double comm_cpu_core_s() const { return median(host_busy_samples[1]); }
  double overlapped_cpu_core_s() const { return median(host_busy_samples[3]); }
  // The shortest an overlapped step can be when the host's cores are the bottleneck: all the
  // CPU work of backward and of communication (kernel TCP included) spread over every core.
  double cpu_bound_s() const {
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    return (compute_cpu_core_s() + comm_cpu_core_s()) / cores;
  }
  double hidden_comm_fraction() const { return (sequential_s() - overlapped_s()) / comm_s(); }
  double hidden_fraction() const {
    return (sequential_s() - overlapped_s()) / std::min(compute_s(), comm_s());
  }
};

// --trace FILE for the spec at `spec_index`: FILE itself with one spec, else FILE with
// ".spec<I>" before its extension.
std::string trace_path_of(const Options& options, std::size_t spec_index) {
  if (options.specs.size() == 1) return options.trace_path;
  return collectives::insert_before_extension(options.trace_path,
                                              ".spec" + std::to_string(spec_index));
}

Row measure(const std::string& spec, std::size_t spec_index, const Options& options,
            EmulatedModel& model, Communicator& communicator) {
  ReducerOptions reducer_options = options.reducer;
  reducer_options.spec = spec;
  if (!options.trace_path.empty()) {
    // Every iteration steps the Reducer 3 times (comm, sequential, overlapped): the last
    // overlapped step is the last step of all.
    reducer_options.timeline_path = trace_path_of(options, spec_index);
    reducer_options.timeline_first_step = 3 * static_cast<std::uint64_t>(options.warmup + options.iters) - 1;
    reducer_options.timeline_steps = 1;
  }
  // A Reducer per spec: error-feedback residuals and the step counter start afresh.
  Reducer reducer(communicator, reducer_options);
  model.register_with(reducer);

  Row row;
  row.spec = spec;
  row.ranks = communicator.size();
  for (int iteration = -options.warmup; iteration < options.iters; ++iteration) {
    for (std::size_t p = 0; p < 4; ++p) {
      const StepSample slowest = max_over_ranks(run_step(kPhases[p], model, reducer));
      if (iteration < 0) continue;
      row.samples[p].push_back(slowest.step_seconds);
      row.host_busy_samples[p].push_back(slowest.host_busy_core_seconds);
      row.contained_samples[p].push_back(slowest.contained_seconds);
      if (kPhases[p] == Phase::comm)
        row.reducer_comm_samples.push_back(slowest.reducer_comm_seconds);
      if (kPhases[p] == Phase::overlapped) {
        row.reducer_exposed_samples.push_back(slowest.reducer_exposed_seconds);
        row.reducer_last_ready_samples.push_back(slowest.reducer_last_ready_seconds);
      }
    }
  }
  // The stats of the last step: an overlapped one.
  const ReducerStats& stats = reducer.stats();
  row.sent_bytes = max_over_ranks(stats.sent_bytes);
  row.gradient_bytes = stats.gradient_bytes;
  row.compression_ratio = stats.compression_ratio;
  row.buckets = stats.buckets.size();
  std::set<std::string> algorithms;
  for (const ReducerBucketStats& bucket : stats.buckets)
    for (const ReducerGroupStats& group : bucket.groups)
      algorithms.insert(group.algorithms.begin(), group.algorithms.end());
  row.algorithms.assign(algorithms.begin(), algorithms.end());
  row.reducer_stats_json = stats.to_json();
  return row;
}

// ---- output --------------------------------------------------------------------------------

void print_header(int spec_width) {
  std::printf("%-*s %9s %9s %9s %9s %9s %9s %8s %8s %7s %8s %10s %7s %7s %8s %8s %8s\n",
              spec_width, "spec", "compute_s", "comm_s", "seq_s", "ovl_s", "exposed", "red_exp",
              "ovl/max", "ovl/cmp", "hidden", "hid/comm", "sent/rank", "ratio", "buckets", "cpu_cmp",
              "cpu_comm", "cpu_bnd");
}

void print_row(const Row& row, int spec_width) {
  std::printf("%-*s %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %8.3f %8.3f %7.2f %8.2f %10s %7.2f %7zu "
              "%8.3f %8.3f %8.3f\n",
              spec_width, row.spec.c_str(), row.compute_s(), row.comm_s(), row.sequential_s(),
              row.overlapped_s(), row.exposed_comm_s(), row.reducer_exposed_s(),
              row.overlap_vs_max(), row.overlap_vs_compute(), row.hidden_fraction(),
              row.hidden_comm_fraction(),
              human_bytes(static_cast<double>(row.sent_bytes)).c_str(), row.compression_ratio,
              row.buckets, row.compute_cpu_core_s(), row.comm_cpu_core_s(), row.cpu_bound_s());
  std::fflush(stdout);
}

std::string json_numbers(const std::vector<double>& values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + json_number(values[i]);
  return text + "]";
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Options& options,
                const EmulatedModel& model) {
  std::ofstream json(path);
  GZ_REQUIRE(json.good(), ErrorCode::io_error, "overlap: cannot write --json file '", path, "'");
  json << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::string algorithms = "[";
    for (std::size_t a = 0; a < r.algorithms.size(); ++a)
      algorithms += (a ? ", " : "") + json_string(r.algorithms[a]);
    algorithms += "]";
    json << "  {\"spec\": " << json_string(r.spec) << ", \"ranks\": " << r.ranks
         << ", \"model\": " << json_string(options.model.name)
         << ", \"params\": " << model.parameter_count() << ", \"batch\": " << options.batch
         << ", \"gemm_flops\": " << model.gemm_flops() << ", \"iters\": " << options.iters
         << ", \"warmup\": " << options.warmup << ", \"lanes\": " << options.reducer.lanes
         << ", \"first_bucket_bytes\": " << options.reducer.first_bucket_bytes
         << ", \"bucket_bytes\": " << options.reducer.bucket_bytes
         << ", \"chunk_bytes\": " << options.reducer.chunk_bytes
         << ",\n   \"compute_s\": " << json_number(r.compute_s())
         << ", \"comm_s\": " << json_number(r.comm_s())
         << ", \"sequential_s\": " << json_number(r.sequential_s())
         << ", \"overlapped_s\": " << json_number(r.overlapped_s())
         << ", \"exposed_comm_s\": " << json_number(r.exposed_comm_s())
         << ", \"reducer_exposed_s\": " << json_number(r.reducer_exposed_s())
         << ",\n   \"overlap_vs_max\": " << json_number(r.overlap_vs_max())
         << ", \"overlap_vs_compute\": " << json_number(r.overlap_vs_compute())
         << ", \"hidden_comm_fraction\": " << json_number(r.hidden_comm_fraction())
         << ", \"hidden_fraction\": " << json_number(r.hidden_fraction())
         << ", \"sent_bytes\": " << r.sent_bytes << ", \"gradient_bytes\": " << r.gradient_bytes
         << ", \"compression_ratio\": " << json_number(r.compression_ratio)
         << ", \"buckets\": " << r.buckets << ", \"algorithms\": " << algorithms
         << ",\n   \"compute_cpu_core_s\": " << json_number(r.compute_cpu_core_s())
         << ", \"comm_cpu_core_s\": " << json_number(r.comm_cpu_core_s())
         << ", \"overlapped_cpu_core_s\": " << json_number(r.overlapped_cpu_core_s())
         << ", \"host_cores\": " << std::max(1u, std::thread::hardware_concurrency())
         << ", \"cpu_bound_s\": " << json_number(r.cpu_bound_s())
         << ",\n   \"compute_samples_s\": " << json_numbers(r.samples[0])
         << ",\n   \"comm_samples_s\": " << json_numbers(r.samples[1])
         << ",\n   \"sequential_samples_s\": " << json_numbers(r.samples[2])
         << ",\n   \"overlapped_samples_s\": " << json_numbers(r.samples[3])
         << ",\n   \"reducer_comm_samples_s\": " << json_numbers(r.reducer_comm_samples)
         << ",\n   \"reducer_exposed_samples_s\": " << json_numbers(r.reducer_exposed_samples)
         << ",\n   \"reducer_last_ready_samples_s\": "
         << json_numbers(r.reducer_last_ready_samples)
         << ",\n   \"sequential_contained_samples_s\": " << json_numbers(r.contained_samples[2])
         << ",\n   \"overlapped_backward_samples_s\": " << json_numbers(r.contained_samples[3])
         << ",\n   \"reducer_stats\": " << r.reducer_stats_json << "}"
         << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  json << "]\n";
}

int run(const Options& options) {
  Communicator communicator = Communicator::world();
  const bool root = communicator.rank() == 0;
  EmulatedModel model(options.model, options.batch, communicator.rank());
  int spec_width = 16;
  for (const std::string& spec : options.specs)
    spec_width = std::max(spec_width, static_cast<int>(spec.size()));
  if (root) {
    const std::size_t params = model.parameter_count();
    std::printf("gradzip-bench overlap: %d ranks; model %s (d=%zu, %zu blocks): %zu parameters, "
                "%s of f32 gradients in %zu tensors\n",
                communicator.size(), options.model.name.c_str(), options.model.width,
                options.model.blocks, params,
                human_bytes(static_cast<double>(params * sizeof(float))).c_str(),
                model.parameters().size());
    std::printf("backward: batch %zu, %.3g GEMM flops per step; Reducer: lanes %d, first bucket "
                "%s, buckets %s, chunks %s\n",
                options.batch, static_cast<double>(model.gemm_flops()), options.reducer.lanes,
                human_bytes(static_cast<double>(options.reducer.first_bucket_bytes)).c_str(),
                human_bytes(static_cast<double>(options.reducer.bucket_bytes)).c_str(),
                human_bytes(static_cast<double>(options.reducer.chunk_bytes)).c_str());
    std::printf("times: median over %d iterations (after %d untimed) of the slowest rank's step; "
                "exposed = ovl - compute; red_exp = Reducer's time blocked in wait();\n"
                "hidden = (seq - ovl) / min(compute, comm), hid/comm = (seq - ovl) / comm; "
                "sent = Reducer bytes sent per rank "
                "(max over ranks), ratio = its compression ratio;\n"
                "cpu_cmp / cpu_comm = host busy core-seconds of a compute-only / comm-only step "
                "(/proc/stat, all ranks on one host), cpu_bnd = (cpu_cmp + cpu_comm) / %u cores: "
                "the shortest overlapped step the host's CPUs allow\n\n",
                options.iters, options.warmup, std::max(1u, std::thread::hardware_concurrency()));
    print_header(spec_width);
  }
  std::vector<Row> rows;
  for (std::size_t i = 0; i < options.specs.size(); ++i) {
    const std::string& spec = options.specs[i];
    rows.push_back(measure(spec, i, options, model, communicator));
    if (root) print_row(rows.back(), spec_width);
  }
  if (root && !options.json_path.empty()) write_json(options.json_path, rows, options, model);
  return 0;
}

}  // namespace

int run_overlap(int argc, char** argv) {
  return run_mpi_command("overlap", argc, argv, parse_options, print_help, run);
}

#endif

}  // namespace gradzip::bench
