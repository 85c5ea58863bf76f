// One training-like run of a Reducer (every codec family, PowerSGD included) and of direct
// Communicator calls (stochastic codecs with error feedback), for the checkpoint/restart test
// (tests/lifecycle/run_restart_test.sh):
//
//   restart_run full   DIR S T   steps 0 .. S+T-1 in one process set; prints the hashes of
//                                steps S .. S+T-1
//   restart_run save   DIR S T   steps 0 .. S-1, then checkpoints the Reducer and the
//                                Communicator into DIR (one file each per rank) and exits
//   restart_run resume DIR S T   new processes: loads DIR, runs steps S .. S+T-1, prints hashes
//   restart_run cold   DIR S T   the control: steps S .. S+T-1 from step S without loading
//
// Every rank prints "rank R step N hash H" per printed step, H being FNV-1a 64 over every
// reduced tensor of that step, so the driver compares the two runs line by line. A load that
// is refused prints "rank R refused: <code>: <message>" and exits with status 3.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"

namespace {

using gradzip::Communicator;
using gradzip::Reducer;

struct Parameter {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> gradient;
};

// The Reducer's model: rules route each tensor family to another codec. Algorithms are pinned
// here and below: algo=auto chooses from the link and γ a process measures, which the
// uninterrupted run and the saving run measure each for itself (a restart makes the saving
// run's choices: the checkpoint carries its measurements, which test_communicator checks).
constexpr const char* kModelSpec =
    "topk:ratio=0.05,warmup=2,min_bytes=0,seed=11,algo=sparse;"
    "name=fc1.*->qsgd:bits=4,ef=on,min_bytes=0,seed=12,algo=sra;"
    "name=embed.*->randk:ratio=0.1,min_bytes=0,seed=13;"
    "name=fc2.weight->powersgd:rank=2,seed=14;"
    "name=norm.*->sign:min_bytes=0,algo=sra";

std::vector<Parameter> make_model() {
  return {{"embed.weight", {64, 96}, {}}, {"fc1.weight", {96, 128}, {}},
          {"fc1.bias", {128}, {}},        {"fc2.weight", {128, 10}, {}},
          {"fc2.bias", {10}, {}},         {"norm.scale", {96, 2}, {}},
          {"head.weight", {10, 300}, {}}};
}

// Direct Communicator calls: name and spec.
const std::vector<std::pair<std::string, std::string>> kDirectCalls = {
    {"direct.qsgd", "qsgd:bits=2,ef=on,min_bytes=0,seed=21,algo=sra"},
    {"direct.randk", "randk:ratio=0.05,min_bytes=0,seed=22"},
    {"direct.sign", "sign:algo=sra,min_bytes=0"},
    {"direct.topk", "topk:ratio=0.02,min_bytes=0,warmup=3,algo=sparse"}};
constexpr std::size_t kDirectCount = 2049;

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Values in [-1, 1), deterministic in (rank, step, which).
void fill_gradient(std::vector<float>& values, int rank, std::uint64_t step, std::uint64_t which) {
  std::uint64_t state = (static_cast<std::uint64_t>(rank) << 48) ^ (step << 16) ^ which;
  for (float& v : values)
    v = static_cast<float>(static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-52 - 1.0);
}

class Fnv1a64 {
 public:
  void add(const std::vector<float>& values) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (std::size_t i = 0; i < values.size() * sizeof(float); ++i) {
      hash_ ^= bytes[i];
      hash_ *= 0x100000001b3ull;
    }
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

std::string checkpoint_path(const std::string& dir, const char* what, int rank) {
  return dir + "/" + what + "-rank" + std::to_string(rank) + ".gzef";
}

int run(const std::string& mode, const std::string& dir, std::uint64_t save_step,
        std::uint64_t continue_steps) {
  Communicator comm = Communicator::world();
  const int rank = comm.rank();
  std::vector<Parameter> model = make_model();
  gradzip::ReducerOptions options;
  options.spec = kModelSpec;
  options.chunk_bytes = 16 << 10;  // several chunks per group, both lanes busy
  options.first_bucket_bytes = 8 << 10;
  options.bucket_bytes = 32 << 10;
  Reducer reducer(comm, options);
  for (Parameter& p : model) {
    std::size_t count = 1;
    for (std::size_t d : p.shape) count *= d;
    p.gradient.resize(count);
    reducer.add(p.name, gradzip::host_view(p.gradient.data(), count), p.shape);
  }
  std::vector<std::vector<float>> direct(kDirectCalls.size(), std::vector<float>(kDirectCount));

  std::uint64_t first = 0;
  std::uint64_t end = save_step + continue_steps;
  if (mode == "save") end = save_step;
  if (mode == "resume") {
    try {
      reducer.load_state(checkpoint_path(dir, "reducer", rank));
      comm.load_residuals(checkpoint_path(dir, "communicator", rank));
    } catch (const gradzip::Error& error) {
      std::printf("rank %d refused: %s: %s\n", rank, gradzip::error_code_name(error.code()),
                  error.what());
      std::fflush(stdout);
      return 3;
    }
    if (reducer.current_step() != save_step) {
      std::printf("rank %d resumed at step %llu, expected %llu\n", rank,
                  static_cast<unsigned long long>(reducer.current_step()),
                  static_cast<unsigned long long>(save_step));
      return 1;
    }
    first = save_step;
  }
  if (mode == "cold") {
    reducer.set_step(save_step);
    first = save_step;
  }
  for (std::uint64_t step = first; step < end; ++step) {
    Fnv1a64 hash;
    for (std::size_t t = 0; t < model.size(); ++t) fill_gradient(model[t].gradient, rank, step, t);
    reducer.mark_all_ready();
    reducer.wait();
    reducer.step();
    for (const Parameter& p : model) hash.add(p.gradient);
    for (std::size_t c = 0; c < kDirectCalls.size(); ++c) {
      fill_gradient(direct[c], rank, step, 100 + c);
      comm.allreduce(gradzip::host_view(direct[c].data(), kDirectCount), kDirectCalls[c].first,
                     kDirectCalls[c].second, gradzip::ReduceOp::average);
      hash.add(direct[c]);
    }
    if (step >= save_step)
      std::printf("rank %d step %llu hash %016llx\n", rank, static_cast<unsigned long long>(step),
                  static_cast<unsigned long long>(hash.value()));
  }
  if (mode == "save") {
    reducer.save_state(checkpoint_path(dir, "reducer", rank));
    comm.save_residuals(checkpoint_path(dir, "communicator", rank));
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 || (std::strcmp(argv[1], "full") != 0 && std::strcmp(argv[1], "save") != 0 &&
                    std::strcmp(argv[1], "resume") != 0 && std::strcmp(argv[1], "cold") != 0)) {
    std::fprintf(stderr, "usage: %s full|save|resume|cold DIR SAVE_STEP CONTINUE_STEPS\n", argv[0]);
    return 2;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  try {
    status = run(argv[1], argv[2], std::strtoull(argv[3], nullptr, 10),
                 std::strtoull(argv[4], nullptr, 10));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "restart_run: %s\n", error.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
