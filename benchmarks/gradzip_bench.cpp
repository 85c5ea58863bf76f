// gradzip-bench: one binary, one subcommand per benchmark family.
//   gradzip-bench codecs [--size N] [--codec SPEC]... [--repeat R] [--json FILE]
//   mpirun -np P gradzip-bench allreduce [--size BYTES]... [--codec SPEC]... [--iters N] [--check]
//                                        [--json FILE]
//   mpirun -np P gradzip-bench overlap [--model small|25m] [--batch N] [--codec SPEC]...
//                                      [--iters N] [--json FILE]  (Reducer options: --help)
//   gradzip-bench kernels [--size N] [--repeat R] [--kernel NAME]... [--list] [--json FILE]
//   gradzip-bench model [--codec SPEC]... [--ranks LIST] [--gbps LIST] [--validate FILE]...
//   gradzip-bench preflight [--json FILE]
//   gradzip-bench calls [--size N] [--calls K] [--json FILE]
#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

#include "gradzip/error.h"

namespace gradzip::bench {
int run_codecs(int argc, char** argv);
int run_allreduce(int argc, char** argv);  // allreduce_bench.cpp; needs a build with MPI
int run_overlap(int argc, char** argv);    // overlap_bench.cpp; needs a build with MPI
int run_model(int argc, char** argv);      // model/model_bench.cpp
#if GRADZIP_HAVE_CUDA
int run_kernels(int argc, char** argv);    // kernels_bench.cpp, compiled only with CUDA
int run_preflight(int argc, char** argv);  // device_bench.cpp, compiled only with CUDA
int run_calls(int argc, char** argv);      // device_bench.cpp, compiled only with CUDA
#else
// The whole of `kernels` in a build without CUDA: nothing to measure, which is not an error
// (like a CUDA build on a machine without a device).
int run_kernels(int, char**) {
  std::printf("gradzip-bench kernels: no CUDA in this build (GRADZIP_WITH_CUDA=OFF, or nvcc was "
              "not found at configure time); nothing measured\n");
  return 0;
}
int run_preflight(int, char**) {
  std::printf("gradzip-bench preflight: no CUDA in this build; nothing to check\n");
  return 0;
}
int run_calls(int, char**) {
  std::printf("gradzip-bench calls: no CUDA in this build; nothing measured\n");
  return 0;
}
#endif
}

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: gradzip-bench SUBCOMMAND [options]\n"
               "subcommands:\n"
               "  codecs     compression ratio, encode/decode throughput and error of each codec,\n"
               "             next to memcpy of the same input measured in the same run\n"
               "  allreduce  compressed all-reduce against MPI_Allreduce of the same data,\n"
               "             measured in the same run: time, algbw/busbw, bytes sent against\n"
               "             theory, error (run under mpirun; needs a build with MPI)\n"
               "  overlap    the Reducer during an emulated backward (a GEMM per layer of a\n"
               "             25M-parameter model): compute-only, communication-only, sequential\n"
               "             and overlapped step times, measured in the same run (run under\n"
               "             mpirun; needs a build with MPI)\n"
               "  kernels    the CUDA kernels at 2^28 f32 elements: time, GB/s of the bytes each\n"
               "             must move, and the fraction of a device-to-device copy measured in\n"
               "             the same run (needs a build with CUDA; without a device, says why)\n"
               "  preflight  the CUDA device as gradzip uses it: properties, memory pools, an\n"
               "             allocation through gradzip's device runtime, a one-rank NCCL\n"
               "             communicator with one exact all-reduce (needs a build with CUDA)\n"
               "  calls      device allocations and host waits per steady-state all-reduce call\n"
               "             of a CUDA tensor, per codec, against their targets (needs CUDA)\n"
               "  model      the alpha-beta-gamma cost model: gamma of each codec measured here,\n"
               "             validation against measured all-reduce rows, projection to 4096\n"
               "             ranks and 400 Gbit/s, break-even link bandwidth per codec\n"
               "run 'gradzip-bench SUBCOMMAND --help' for its options\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string_view command = argv[1];
  try {
    if (command == "codecs") return gradzip::bench::run_codecs(argc - 1, argv + 1);
    if (command == "allreduce") return gradzip::bench::run_allreduce(argc - 1, argv + 1);
    if (command == "overlap") return gradzip::bench::run_overlap(argc - 1, argv + 1);
    if (command == "kernels") return gradzip::bench::run_kernels(argc - 1, argv + 1);
    if (command == "model") return gradzip::bench::run_model(argc - 1, argv + 1);
    if (command == "preflight") return gradzip::bench::run_preflight(argc - 1, argv + 1);
    if (command == "calls") return gradzip::bench::run_calls(argc - 1, argv + 1);
    if (command == "--help" || command == "-h") {
      print_usage(stdout);
      return 0;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gradzip-bench %s: %s\n", argv[1], error.what());
    return 1;
  }
  std::fprintf(stderr, "gradzip-bench: unknown subcommand '%s'\n", argv[1]);
  print_usage(stderr);
  return 2;
}
