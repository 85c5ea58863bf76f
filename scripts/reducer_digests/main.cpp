// Digests of the Reducer's results on fixed gradients, for scripts/prove_refactor.py: run under
// mpirun with the builds of two commits and compare the outputs to show that a refactor of the
// Reducer (pipeline/) changed no byte. Uses only the public API.
//
// For every spec (buckets of several tensors, chunks, two lanes, warm-up, ramp, per-tensor rules,
// PowerSGD), four steps of gradients that depend on the rank, the step and the element: rank 0
// prints per step the FNV-1a 64 of every tensor after wait() (every rank's must agree: it prints
// how many distinct digests the ranks hold), each group's effective spec, rule, algorithms and
// sent bytes, the skipped and fallback chunks. Error feedback's residuals show in the later
// steps' results. Every compressed group names its algorithm: algo=auto's choice depends on
// codec costs measured at run time, which differ from run to run (two builds of the same code
// chose the tree and the sparse all-reduce for one top-k chunk), and so does save_state()'s file,
// which holds them; the uncompressed groups under min_bytes take the transport's sum, no model.
// Timings are left out.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <gradzip/gradzip.h>

namespace {

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = 14695981039346656037ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

struct Tensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> values;
};

std::vector<std::uint64_t> gathered(std::uint64_t mine) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

void run(gradzip::Communicator& comm, const std::string& spec, int rank) {
  std::vector<Tensor> tensors = {{"layer0.weight", {256, 128}, {}}, {"layer0.bias", {128}, {}},
                                 {"layer1.weight", {128, 64}, {}},  {"layer1.bias", {64}, {}},
                                 {"head.weight", {64, 10}, {}},     {"head.bias", {10}, {}}};
  gradzip::ReducerOptions options;
  options.spec = spec;
  options.first_bucket_bytes = 32 << 10;
  options.bucket_bytes = 64 << 10;
  options.chunk_bytes = 16 << 10;
  options.lanes = 2;
  gradzip::Reducer reducer(comm, options);
  for (Tensor& t : tensors) {
    std::size_t count = 1;
    for (std::size_t d : t.shape) count *= d;
    t.values.resize(count);
    reducer.add(t.name, gradzip::host_view(t.values.data(), t.values.size()), t.shape);
  }
  for (int step = 0; step < 4; ++step) {
    for (std::size_t t = 0; t < tensors.size(); ++t)
      for (std::size_t i = 0; i < tensors[t].values.size(); ++i)
        tensors[t].values[i] = static_cast<float>(
            std::sin(0.37 * static_cast<double>(i) + 1.3 * rank + 0.71 * step + 2.1 * static_cast<double>(t)) *
            (1.0 + 0.5 * static_cast<double>(t)));
    for (auto t = tensors.rbegin(); t != tensors.rend(); ++t) reducer.mark_ready(t->name);
    reducer.wait();
    for (const Tensor& t : tensors) {
      const std::vector<std::uint64_t> all =
          gathered(fnv1a(t.values.data(), t.values.size() * sizeof(float)));
      if (rank == 0)
        std::printf("%s step %d %s %016llx ranks-agree %zu\n", spec.c_str(), step, t.name.c_str(),
                    static_cast<unsigned long long>(all[0]), std::set<std::uint64_t>(all.begin(), all.end()).size());
    }
    const gradzip::ReducerStats& stats = reducer.stats();
    if (rank == 0) {
      std::printf("%s step %d stats sent %llu skipped %llu fallback %llu\n", spec.c_str(), step,
                  static_cast<unsigned long long>(stats.sent_bytes),
                  static_cast<unsigned long long>(stats.skipped_chunks),
                  static_cast<unsigned long long>(stats.fallback_chunks));
      for (const gradzip::ReducerBucketStats& bucket : stats.buckets)
        for (const gradzip::ReducerGroupStats& group : bucket.groups) {
          std::string algorithms;
          for (const std::string& a : group.algorithms) algorithms += a + " ";
          std::printf("%s step %d bucket %zu group '%s' rule '%s' count %zu chunks %zu sent %llu algorithms %s\n",
                      spec.c_str(), step, bucket.index, group.spec.c_str(), group.rule.c_str(),
                      group.count, group.chunks, static_cast<unsigned long long>(group.sent_bytes),
                      algorithms.c_str());
        }
    }
    reducer.step();
  }
}

}  // namespace

int main() {
  gradzip::CommunicatorOptions options;
  options.link_latency_us = 20;
  options.link_gbps = 10;
  gradzip::Communicator comm = gradzip::Communicator::world(options);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0) std::printf("%d ranks\n", size);
  for (const char* spec :
       {"none:algo=ring", "fp16:algo=ring,min_bytes=0", "qsgd:bits=4,algo=sra,min_bytes=0",
        "sign:algo=rhd,min_bytes=0", "topk:ratio=0.01,warmup=1,ramp=2,algo=sparse,min_bytes=0",
        "randk:ratio=0.05,min_bytes=0", "terngrad:algo=tree,min_bytes=0", "powersgd:rank=2",
        "sign:algo=sra,min_bytes=0; name=*.bias->fp16:algo=ring,min_bytes=0",
        "qsgd:bits=2,ef=on,algo=ring,min_bytes=0; bytes<20000->none:algo=ring",
        "topk:ratio=0.05,algo=sparse,min_bytes=0", "qsgd:bits=4,min_bytes=100000"}) {
    try {
      run(comm, spec, rank);
    } catch (const gradzip::Error& error) {
      if (rank == 0) std::printf("%s error %s\n", spec, error.what());
    }
  }
  return 0;
}
