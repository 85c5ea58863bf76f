// gradzip-demo: one training step's gradient all-reduce of ResNet-50, compressed by each codec,
// next to MPI_Allreduce of the same gradients measured in the same run. Run it under mpirun:
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bin/gradzip-demo
//
// The gradients have the parameter shapes of torchvision's ResNet-50 (kResnet50 below: 161
// tensors, 25,557,032 parameters). Tensor t of rank r holds sigma_t * (s_t + z_{r,t}): a signal
// s_t shared by all ranks plus rank-local minibatch noise z_{r,t}, both N(0, 1), with
// sigma_t = 1 / sqrt(fan_in) (fan_in = the product of all dimensions but the first; 1 for
// biases and batch-norm parameters), so layers differ in scale the way real gradients do.
//
// For every codec, every tensor goes through Communicator::allreduce(ReduceOp::average) under
// its own name, in model order, with the codec's spec and gradzip's defaults (algo=auto, so
// tensors under min_bytes = 64 KiB take the uncompressed small-tensor path, "mpi"; 109 of the
// 161 tensors, 0.3% of the parameters). Printed from rank 0:
//   algorithms  which algorithm served how many tensors (CollectiveStats::algorithm)
//   ratio       bytes an uncompressed ring all-reduce sends per rank, sum_t 2(P-1)/P * 4 n_t,
//               over the bytes gradzip sent per rank (CollectiveStats::sent_bytes(), max over
//               ranks; for "mpi" tensors, whose bytes are MPI's, the uncompressed ring's count)
//   rel.error   ||avg - exact avg|| / ||exact avg|| over all 25.6M parameters, exact avg in f64,
//               after the first step (error-feedback residuals start at zero)
//   time_s      the slowest rank's time for all 161 all-reduces, best of kSteps steps
//   mpi_s       MPI_Allreduce of the same 161 tensors (sum, then / P), best of kSteps - 1 steps
//               run between gradzip's (same run, same load)
//   speedup     mpi_s / time_s
//   same        whether every rank ended with byte-identical averaged gradients
//   vs_none     the `none` row's time_s over this row's: >= 1 is at least as fast as gradzip
//               uncompressed
// `--json PATH` also writes the rows as JSON from rank 0 ({"ranks", "options", "rows": [{codec,
// algorithms, fallback_tensors, sent_bytes, ratio, relative_error, seconds, mpi_seconds,
// identical}]}) for benchmarks/fallback_demo.sh.
// `--options KEY=VALUE[,KEY=VALUE...]` appends spec options to every codec but `none` (which
// stays the baseline); e.g. `--options fallback=dense` lets algo=auto's model send a tensor
// dense when that is predicted no slower, and the algorithms column counts those tensors as
// "fallback".
// On one host the ranks talk through shared memory, where compression rarely pays: see
// benchmarks/emulated_cluster.sh for links of cluster bandwidth.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace {

struct Layer {
  const char* name;
  std::vector<std::size_t> shape;
};

// torchvision.models.resnet50() parameters, in named_parameters() order.
const std::vector<Layer> kResnet50 = {
    {"conv1.weight", {64, 3, 7, 7}},
    {"bn1.weight", {64}},
    {"bn1.bias", {64}},
    {"layer1.0.conv1.weight", {64, 64, 1, 1}},
    {"layer1.0.bn1.weight", {64}},
    {"layer1.0.bn1.bias", {64}},
    {"layer1.0.conv2.weight", {64, 64, 3, 3}},
    {"layer1.0.bn2.weight", {64}},
    {"layer1.0.bn2.bias", {64}},
    {"layer1.0.conv3.weight", {256, 64, 1, 1}},
    {"layer1.0.bn3.weight", {256}},
    {"layer1.0.bn3.bias", {256}},
    {"layer1.0.downsample.0.weight", {256, 64, 1, 1}},
    {"layer1.0.downsample.1.weight", {256}},
    {"layer1.0.downsample.1.bias", {256}},
    {"layer1.1.conv1.weight", {64, 256, 1, 1}},
    {"layer1.1.bn1.weight", {64}},
    {"layer1.1.bn1.bias", {64}},
    {"layer1.1.conv2.weight", {64, 64, 3, 3}},
    {"layer1.1.bn2.weight", {64}},
    {"layer1.1.bn2.bias", {64}},
    {"layer1.1.conv3.weight", {256, 64, 1, 1}},
    {"layer1.1.bn3.weight", {256}},
    {"layer1.1.bn3.bias", {256}},
    {"layer1.2.conv1.weight", {64, 256, 1, 1}},
    {"layer1.2.bn1.weight", {64}},
    {"layer1.2.bn1.bias", {64}},
    {"layer1.2.conv2.weight", {64, 64, 3, 3}},
    {"layer1.2.bn2.weight", {64}},
    {"layer1.2.bn2.bias", {64}},
    {"layer1.2.conv3.weight", {256, 64, 1, 1}},
    {"layer1.2.bn3.weight", {256}},
    {"layer1.2.bn3.bias", {256}},
    {"layer2.0.conv1.weight", {128, 256, 1, 1}},
    {"layer2.0.bn1.weight", {128}},
    {"layer2.0.bn1.bias", {128}},
    {"layer2.0.conv2.weight", {128, 128, 3, 3}},
    {"layer2.0.bn2.weight", {128}},
    {"layer2.0.bn2.bias", {128}},
    {"layer2.0.conv3.weight", {512, 128, 1, 1}},
    {"layer2.0.bn3.weight", {512}},
    {"layer2.0.bn3.bias", {512}},
    {"layer2.0.downsample.0.weight", {512, 256, 1, 1}},
    {"layer2.0.downsample.1.weight", {512}},
    {"layer2.0.downsample.1.bias", {512}},
    {"layer2.1.conv1.weight", {128, 512, 1, 1}},
    {"layer2.1.bn1.weight", {128}},
    {"layer2.1.bn1.bias", {128}},
    {"layer2.1.conv2.weight", {128, 128, 3, 3}},
    {"layer2.1.bn2.weight", {128}},
    {"layer2.1.bn2.bias", {128}},
    {"layer2.1.conv3.weight", {512, 128, 1, 1}},
    {"layer2.1.bn3.weight", {512}},
    {"layer2.1.bn3.bias", {512}},
    {"layer2.2.conv1.weight", {128, 512, 1, 1}},
    {"layer2.2.bn1.weight", {128}},
    {"layer2.2.bn1.bias", {128}},
    {"layer2.2.conv2.weight", {128, 128, 3, 3}},
    {"layer2.2.bn2.weight", {128}},
    {"layer2.2.bn2.bias", {128}},
    {"layer2.2.conv3.weight", {512, 128, 1, 1}},
    {"layer2.2.bn3.weight", {512}},
    {"layer2.2.bn3.bias", {512}},
    {"layer2.3.conv1.weight", {128, 512, 1, 1}},
    {"layer2.3.bn1.weight", {128}},
    {"layer2.3.bn1.bias", {128}},
    {"layer2.3.conv2.weight", {128, 128, 3, 3}},
    {"layer2.3.bn2.weight", {128}},
    {"layer2.3.bn2.bias", {128}},
    {"layer2.3.conv3.weight", {512, 128, 1, 1}},
    {"layer2.3.bn3.weight", {512}},
    {"layer2.3.bn3.bias", {512}},
    {"layer3.0.conv1.weight", {256, 512, 1, 1}},
    {"layer3.0.bn1.weight", {256}},
    {"layer3.0.bn1.bias", {256}},
    {"layer3.0.conv2.weight", {256, 256, 3, 3}},
    {"layer3.0.bn2.weight", {256}},
    {"layer3.0.bn2.bias", {256}},
    {"layer3.0.conv3.weight", {1024, 256, 1, 1}},
    {"layer3.0.bn3.weight", {1024}},
    {"layer3.0.bn3.bias", {1024}},
    {"layer3.0.downsample.0.weight", {1024, 512, 1, 1}},
    {"layer3.0.downsample.1.weight", {1024}},
    {"layer3.0.downsample.1.bias", {1024}},
    {"layer3.1.conv1.weight", {256, 1024, 1, 1}},
    {"layer3.1.bn1.weight", {256}},
    {"layer3.1.bn1.bias", {256}},
    {"layer3.1.conv2.weight", {256, 256, 3, 3}},
    {"layer3.1.bn2.weight", {256}},
    {"layer3.1.bn2.bias", {256}},
    {"layer3.1.conv3.weight", {1024, 256, 1, 1}},
    {"layer3.1.bn3.weight", {1024}},
    {"layer3.1.bn3.bias", {1024}},
    {"layer3.2.conv1.weight", {256, 1024, 1, 1}},
    {"layer3.2.bn1.weight", {256}},
    {"layer3.2.bn1.bias", {256}},
    {"layer3.2.conv2.weight", {256, 256, 3, 3}},
    {"layer3.2.bn2.weight", {256}},
    {"layer3.2.bn2.bias", {256}},
    {"layer3.2.conv3.weight", {1024, 256, 1, 1}},
    {"layer3.2.bn3.weight", {1024}},
    {"layer3.2.bn3.bias", {1024}},
    {"layer3.3.conv1.weight", {256, 1024, 1, 1}},
    {"layer3.3.bn1.weight", {256}},
    {"layer3.3.bn1.bias", {256}},
    {"layer3.3.conv2.weight", {256, 256, 3, 3}},
    {"layer3.3.bn2.weight", {256}},
    {"layer3.3.bn2.bias", {256}},
    {"layer3.3.conv3.weight", {1024, 256, 1, 1}},
    {"layer3.3.bn3.weight", {1024}},
    {"layer3.3.bn3.bias", {1024}},
    {"layer3.4.conv1.weight", {256, 1024, 1, 1}},
    {"layer3.4.bn1.weight", {256}},
    {"layer3.4.bn1.bias", {256}},
    {"layer3.4.conv2.weight", {256, 256, 3, 3}},
    {"layer3.4.bn2.weight", {256}},
    {"layer3.4.bn2.bias", {256}},
    {"layer3.4.conv3.weight", {1024, 256, 1, 1}},
    {"layer3.4.bn3.weight", {1024}},
    {"layer3.4.bn3.bias", {1024}},
    {"layer3.5.conv1.weight", {256, 1024, 1, 1}},
    {"layer3.5.bn1.weight", {256}},
    {"layer3.5.bn1.bias", {256}},
    {"layer3.5.conv2.weight", {256, 256, 3, 3}},
    {"layer3.5.bn2.weight", {256}},
    {"layer3.5.bn2.bias", {256}},
    {"layer3.5.conv3.weight", {1024, 256, 1, 1}},
    {"layer3.5.bn3.weight", {1024}},
    {"layer3.5.bn3.bias", {1024}},
    {"layer4.0.conv1.weight", {512, 1024, 1, 1}},
    {"layer4.0.bn1.weight", {512}},
    {"layer4.0.bn1.bias", {512}},
    {"layer4.0.conv2.weight", {512, 512, 3, 3}},
    {"layer4.0.bn2.weight", {512}},
    {"layer4.0.bn2.bias", {512}},
    {"layer4.0.conv3.weight", {2048, 512, 1, 1}},
    {"layer4.0.bn3.weight", {2048}},
    {"layer4.0.bn3.bias", {2048}},
    {"layer4.0.downsample.0.weight", {2048, 1024, 1, 1}},
    {"layer4.0.downsample.1.weight", {2048}},
    {"layer4.0.downsample.1.bias", {2048}},
    {"layer4.1.conv1.weight", {512, 2048, 1, 1}},
    {"layer4.1.bn1.weight", {512}},
    {"layer4.1.bn1.bias", {512}},
    {"layer4.1.conv2.weight", {512, 512, 3, 3}},
    {"layer4.1.bn2.weight", {512}},
    {"layer4.1.bn2.bias", {512}},
    {"layer4.1.conv3.weight", {2048, 512, 1, 1}},
    {"layer4.1.bn3.weight", {2048}},
    {"layer4.1.bn3.bias", {2048}},
    {"layer4.2.conv1.weight", {512, 2048, 1, 1}},
    {"layer4.2.bn1.weight", {512}},
    {"layer4.2.bn1.bias", {512}},
    {"layer4.2.conv2.weight", {512, 512, 3, 3}},
    {"layer4.2.bn2.weight", {512}},
    {"layer4.2.bn2.bias", {512}},
    {"layer4.2.conv3.weight", {2048, 512, 1, 1}},
    {"layer4.2.bn3.weight", {2048}},
    {"layer4.2.bn3.bias", {2048}},
    {"fc.weight", {1000, 2048}},
    {"fc.bias", {1000}},
};

const std::vector<std::string> kCodecs = {"none",        "fp16",     "bf16",           "qsgd:bits=8",
                                          "qsgd:bits=4", "terngrad", "sign",           "topk:ratio=0.01",
                                          "randk:ratio=0.01"};

// The model's gradients laid out back to back, one view per tensor.
struct Gradients {
  std::vector<std::size_t> begin;  // tensor t is values[begin[t], begin[t + 1])
  std::vector<float> values;

  std::size_t tensors() const { return begin.size() - 1; }
  std::size_t count(std::size_t t) const { return begin[t + 1] - begin[t]; }
  float* tensor(std::size_t t) { return values.data() + begin[t]; }
};

std::size_t element_count(const Layer& layer) {
  std::size_t count = 1;
  for (const std::size_t dim : layer.shape) count *= dim;
  return count;
}

// Draws N(0, 1) values fast: a table of 2^20 samples (std::normal_distribution, the same on
// every rank), indexed by a SplitMix64 stream. Gradient generation would otherwise take
// longer than the all-reduces it feeds.
class NormalStream {
 public:
  NormalStream(const std::vector<float>& table, std::uint64_t seed) : table_(table), state_(seed) {}
  float next() {
    if (left_ == 0) {
      bits_ = splitmix64();
      left_ = 3;  // three 20-bit indices per 64-bit draw
    }
    const float value = table_[bits_ & kMask];
    bits_ >>= kIndexBits;
    --left_;
    return value;
  }

  static constexpr int kIndexBits = 20;
  static constexpr std::uint64_t kMask = (std::uint64_t{1} << kIndexBits) - 1;

 private:
  std::uint64_t splitmix64() {
    std::uint64_t x = (state_ += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

  const std::vector<float>& table_;
  std::uint64_t state_;
  std::uint64_t bits_ = 0;
  int left_ = 0;
};

Gradients make_gradients(int rank) {
  std::vector<float> table(std::size_t{1} << NormalStream::kIndexBits);
  std::mt19937_64 engine(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& value : table) value = normal(engine);

  Gradients grads;
  grads.begin.push_back(0);
  for (const Layer& layer : kResnet50) grads.begin.push_back(grads.begin.back() + element_count(layer));
  grads.values.resize(grads.begin.back());
  for (std::size_t t = 0; t < kResnet50.size(); ++t) {
    const Layer& layer = kResnet50[t];
    const double fan_in =
        static_cast<double>(element_count(layer)) / static_cast<double>(layer.shape.front());
    const float sigma = static_cast<float>(1.0 / std::sqrt(fan_in));
    NormalStream shared(table, 1000 + t);                                         // every rank
    NormalStream local(table, (static_cast<std::uint64_t>(rank) + 1) << 32 | t);  // this rank
    float* out = grads.tensor(t);
    for (std::size_t i = 0; i < grads.count(t); ++i) out[i] = sigma * (shared.next() + local.next());
  }
  return grads;
}

double slowest_rank(double seconds) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

// True when `values` hash the same on every rank (a 64-bit multiply-xorshift hash of the
// bits, min and max compared over ranks).
bool identical_on_all_ranks(const std::vector<float>& values) {
  std::uint64_t hash = 0x6772617A7A697021ull;
  for (const float value : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    hash = (hash ^ bits) * 0x9E3779B97F4A7C15ull;
    hash ^= hash >> 29;
  }
  std::uint64_t low = hash, high = hash;
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return low == high;
}

// ||result - exact|| / ||exact||, computed in f64 on rank 0 (the only rank holding `exact`;
// the others return 0).
double relative_error(const std::vector<float>& result, const std::vector<double>& exact) {
  if (exact.empty()) return 0;
  double error_sq = 0, norm_sq = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    const double diff = static_cast<double>(result[i]) - exact[i];
    error_sq += diff * diff;
    norm_sq += exact[i] * exact[i];
  }
  return std::sqrt(error_sq / norm_sq);
}

struct Row {
  std::string codec;
  std::string algorithms;
  int fallback_tensors = 0;  // tensors fallback=dense sent uncompressed
  std::uint64_t sent_bytes = 0;  // per rank, max over ranks
  double relative_error = 0;
  double seconds = 0;      // gradzip's step, best of kSteps
  double mpi_seconds = 0;  // MPI_Allreduce's step, best of kSteps - 1 interleaved with gradzip's
  bool identical = false;
};

// Timed steps per codec. The first also gives the error and the bytes; MPI_Allreduce's steps
// run between gradzip's, so that both see the same load on a shared machine.
constexpr int kSteps = 3;

using Clock = std::chrono::steady_clock;

// One step: every tensor all-reduced (average) with `spec`; returns the slowest rank's time.
double allreduce_step(gradzip::Communicator& comm, const std::string& spec, Gradients& work,
                      std::vector<gradzip::CollectiveStats>* stats) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (std::size_t t = 0; t < work.tensors(); ++t) {
    gradzip::CollectiveStats s =
        comm.allreduce(gradzip::host_view(work.tensor(t), work.count(t)), kResnet50[t].name, spec,
                       gradzip::ReduceOp::average);
    if (stats != nullptr) stats->push_back(std::move(s));
  }
  return slowest_rank(std::chrono::duration<double>(Clock::now() - start).count());
}

double mpi_step(Gradients& work, int ranks) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  const float scale = 1.0f / static_cast<float>(ranks);
  for (std::size_t t = 0; t < work.tensors(); ++t) {
    float* data = work.tensor(t);
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(work.count(t)), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    for (std::size_t i = 0; i < work.count(t); ++i) data[i] *= scale;
  }
  return slowest_rank(std::chrono::duration<double>(Clock::now() - start).count());
}

std::string algorithm_summary(const std::vector<gradzip::CollectiveStats>& stats) {
  std::map<std::string, int> tensors_by_algorithm;
  for (const auto& s : stats) ++tensors_by_algorithm[s.fallback ? "fallback" : s.algorithm];
  std::string summary;
  for (const auto& [algorithm, tensors] : tensors_by_algorithm)
    summary += (summary.empty() ? "" : " + ") + algorithm + " " + std::to_string(tensors);
  return summary;
}

// Bytes one rank of an uncompressed ring all-reduce sends: 2 (P - 1) / P of the f32 tensor.
std::uint64_t uncompressed_ring_bytes(std::size_t count, int ranks) {
  return 2 * static_cast<std::uint64_t>(ranks - 1) * count * sizeof(float) /
         static_cast<std::uint64_t>(ranks);
}

Row run_codec(const std::string& spec, const Gradients& grads, const std::vector<double>& exact) {
  // A communicator per codec: error-feedback residuals start at zero for each.
  gradzip::Communicator comm = gradzip::Communicator::world();
  Row row;
  row.codec = spec;
  Gradients work = grads;
  std::vector<gradzip::CollectiveStats> stats;
  row.seconds = allreduce_step(comm, spec, work, &stats);
  row.relative_error = relative_error(work.values, exact);
  row.identical = identical_on_all_ranks(work.values);
  row.algorithms = algorithm_summary(stats);
  for (const auto& s : stats) row.fallback_tensors += s.fallback ? 1 : 0;
  for (const auto& s : stats) {
    // Tensors under min_bytes go through MPI_Allreduce, whose bytes gradzip does not count:
    // count what an uncompressed ring sends for them, as in the baseline.
    row.sent_bytes += s.algorithm == "mpi" ? uncompressed_ring_bytes(s.count, s.ranks)
                                           : s.sent_bytes();
  }
  MPI_Allreduce(MPI_IN_PLACE, &row.sent_bytes, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  row.mpi_seconds = HUGE_VAL;
  for (int step = 1; step < kSteps; ++step) {
    work.values = grads.values;
    row.mpi_seconds = std::min(row.mpi_seconds, mpi_step(work, comm.size()));
    work.values = grads.values;
    row.seconds = std::min(row.seconds, allreduce_step(comm, spec, work, nullptr));
  }
  return row;
}

// The codec column's width: the longest spec, at least 18.
int codec_width = 18;

void print_row(const Row& row, double ring_bytes, double none_seconds) {
  char ratio[16] = "-";
  if (row.sent_bytes > 0)
    std::snprintf(ratio, sizeof ratio, "%.2f", ring_bytes / static_cast<double>(row.sent_bytes));
  char vs_none[16] = "-";
  if (none_seconds > 0) std::snprintf(vs_none, sizeof vs_none, "%.2f", none_seconds / row.seconds);
  std::printf("%-*s %-24s %8s %10.2e %8.3f %8.3f %8.2f %5s %8s\n", codec_width, row.codec.c_str(),
              row.algorithms.c_str(), ratio, row.relative_error, row.seconds, row.mpi_seconds,
              row.mpi_seconds / row.seconds, row.identical ? "yes" : "NO", vs_none);
  std::fflush(stdout);
}

// `codec` with `options` appended ("" leaves it alone).
std::string with_options(const std::string& codec, const std::string& options) {
  if (options.empty() || codec == "none") return codec;
  return codec + (codec.find(':') == std::string::npos ? ":" : ",") + options;
}

// `text` as a JSON string. Only specs (which gradzip parsed: no quote, backslash or control
// character gets through the parser) and algorithm names reach here, so quoting is enough.
std::string json_string(const std::string& text) { return "\"" + text + "\""; }

void write_json(const std::string& path, int ranks, const std::string& options,
                const std::vector<Row>& rows, double ring_bytes) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  GZ_REQUIRE(file != nullptr, gradzip::ErrorCode::io_error, "gradzip-demo: cannot write '", path,
             "': ", std::strerror(errno));
  std::fprintf(file, "{\"ranks\": %d, \"options\": %s, \"rows\": [", ranks,
               json_string(options).c_str());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::fprintf(file,
                 "%s\n  {\"codec\": %s, \"algorithms\": %s, \"fallback_tensors\": %d, "
                 "\"sent_bytes\": %llu, \"ratio\": %.6g, \"relative_error\": %.6g, "
                 "\"seconds\": %.6g, \"mpi_seconds\": %.6g, \"identical\": %s}",
                 i == 0 ? "" : ",", json_string(row.codec).c_str(),
                 json_string(row.algorithms).c_str(), row.fallback_tensors,
                 static_cast<unsigned long long>(row.sent_bytes),
                 row.sent_bytes > 0 ? ring_bytes / static_cast<double>(row.sent_bytes) : 0.0,
                 row.relative_error, row.seconds, row.mpi_seconds, row.identical ? "true" : "false");
  }
  std::fprintf(file, "\n]}\n");
  GZ_REQUIRE(std::fclose(file) == 0, gradzip::ErrorCode::io_error, "gradzip-demo: cannot write '",
             path, "'");
}

int run(const std::string& options, const std::string& json_path) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const Gradients grads = make_gradients(rank);
  // The exact average, in f64, on rank 0 (which reports the errors).
  const std::vector<double> mine(grads.values.begin(), grads.values.end());
  std::vector<double> exact(rank == 0 ? mine.size() : 0);
  MPI_Reduce(mine.data(), exact.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM, 0,
             MPI_COMM_WORLD);
  for (double& value : exact) value /= ranks;

  double ring_bytes = 0;  // the baseline of the ratio column
  for (std::size_t t = 0; t < grads.tensors(); ++t)
    ring_bytes += static_cast<double>(uncompressed_ring_bytes(grads.count(t), ranks));

  // MPI_Allreduce's own result: its error and whether its ranks agree.
  Gradients work = grads;
  Row mpi;
  mpi.codec = "MPI_Allreduce";
  mpi.algorithms = "Open MPI (f32)";
  mpi.seconds = mpi.mpi_seconds = mpi_step(work, ranks);
  mpi.relative_error = relative_error(work.values, exact);
  mpi.identical = identical_on_all_ranks(work.values);

  std::vector<std::string> specs;
  for (const std::string& codec : kCodecs) {
    specs.push_back(with_options(codec, options));
    codec_width = std::max(codec_width, static_cast<int>(specs.back().size()));
  }
  if (rank == 0) {
    std::printf("gradzip-demo: averaging one step's ResNet-50 gradients (%zu tensors, %zu "
                "parameters, %.1f MiB f32) over %d ranks\n\n",
                grads.tensors(), grads.values.size(),
                static_cast<double>(grads.values.size() * sizeof(float)) / (1 << 20), ranks);
    std::printf("%-*s %-24s %8s %10s %8s %8s %8s %5s %8s\n", codec_width, "codec",
                "algorithms (tensors)", "ratio", "rel.error", "time_s", "mpi_s", "speedup", "same",
                "vs_none");
    print_row(mpi, ring_bytes, 0);
  }
  std::vector<Row> rows{mpi};
  bool all_identical = true;
  double none_seconds = 0;  // kCodecs starts with none
  for (const std::string& spec : specs) {
    const Row row = run_codec(spec, grads, exact);
    if (spec == "none") none_seconds = row.seconds;
    all_identical = all_identical && row.identical;
    if (rank == 0) print_row(row, ring_bytes, none_seconds);
    rows.push_back(row);
  }
  if (rank == 0 && !json_path.empty()) write_json(json_path, ranks, options, rows, ring_bytes);
  if (rank == 0) {
    std::printf(
        "\nratio: bytes an uncompressed ring sends per rank over the bytes gradzip sent (headers "
        "included);\nrel.error: ||avg - exact avg|| / ||exact avg|| after one step; time_s: the "
        "slowest rank's step, best of %d;\nmpi_s: MPI_Allreduce of the same gradients, best of "
        "%d steps run between gradzip's; speedup = mpi_s / time_s;\nsame: byte-identical on "
        "every rank; vs_none: none's time_s / time_s.\n",
        kSteps, kSteps - 1);
  }
  return all_identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 1;
  std::string options, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--options" && i + 1 < argc) {
      options = argv[++i];
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0)
        std::fprintf(stderr, "gradzip-demo: unknown argument '%s'; usage: gradzip-demo "
                             "[--options KEY=VALUE[,KEY=VALUE...]] [--json PATH]\n", arg.c_str());
      MPI_Finalize();
      return 2;
    }
  }
  try {
    status = run(options, json_path);
  } catch (const std::exception& error) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "gradzip-demo (rank %d): %s\n", rank, error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks would wait in a collective forever
  }
  MPI_Finalize();
  return status;
}
