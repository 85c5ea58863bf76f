// gradzip-bench preflight and gradzip-bench calls: what the GPU check runs before anything else
// on a device, and the per-call cost in device allocations and host waits.
//
//   gradzip-bench preflight [--json FILE]
//     The device as gradzip will use it: name, compute capability, SMs, memory, whether it
//     supports stream-ordered memory pools (else gradzip falls back to cudaMalloc, see
//     kernels/cuda/device_runtime.h), one device allocation through gradzip's runtime layer,
//     and a one-rank NCCL communicator (bootstrapped over the in-process transport, connected
//     eagerly, one all-reduce checked exactly). Exit 1 naming the step that failed; exit 0 with
//     "skipped" when there is no device.
//   gradzip-bench calls [--size N] [--calls K] [--world] [--json FILE]
//     One-rank Communicator all-reduces (with --world: all-reduces over every rank of
//     MPI_COMM_WORLD, run under mpirun, each count the largest over the ranks, printed and
//     written by rank 0) of an N-element f32 CUDA tensor (default 2^22) over the
//     NCCL path, per spec (every codec whose message size follows from the element count, with
//     and without error feedback, and approximate top-k): 3 warm-up calls, then K (default 10)
//     calls whose device allocations, host waits and bytes copied between host and device
//     (kernels/cuda/device_runtime.h's counters) are divided by K. A call over NCCL runs
//     stream-ordered and ends with one completion wait (site "stream-ordered call: completion",
//     the wait that returns the blocking call's result and its checks), reported apart as
//     completion_waits_per_call; host_waits_per_call counts every other wait. Target for the
//     fixed-size codecs: 0 / 0 / 0 (allocations, other waits, bytes) per steady-state call. The
//     figures are printed against it, with the waits by site; missing it is reported, not an
//     error. Without a CUDA device the command runs itself again on the
//     emulated device (GRADZIP_DEVICE=emulated, said in the output and the JSON's "device"):
//     the counts are the library's, whatever executes the kernels.
// Both rewrite their --json file whole (written beside it, then renamed over it) after every
// step / row, with "complete": false until the end, so a hang or a kill keeps what was measured.
#include "kernels/device_api.h"

#if GRADZIP_HAVE_MPI
#include <mpi.h>
#endif
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/bench_support.h"
#include "collectives/communicator_state.h"
#include "collectives/device_memory.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "collectives/transport/self_transport.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/emulated/emulated_device.h"

namespace gradzip::bench {
namespace {

// Throws unsupported naming `what` unless status is cudaSuccess.
void check(cudaError_t status, const char* what) {
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported, what, ": ", cudaGetErrorString(status));
}

// The value after `flag` in argv, or nullptr.
const char* option(int argc, char** argv, const char* flag) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return argv[i + 1];
  return nullptr;
}

// The site of a stream-ordered call's one wait (collectives/transport/nccl/nccl_transport.cpp).
constexpr std::string_view kCompletionSite = "stream-ordered call: completion";

// "site a 2.00, site b 1.00": per call, the waits of every site whose count grew between two
// readings of collectives::device_wait_sites().
std::string wait_sites_per_call(const std::vector<std::pair<std::string, std::uint64_t>>& before,
                                const std::vector<std::pair<std::string, std::uint64_t>>& after,
                                int calls) {
  std::string out;
  for (const auto& [site, grown] : collectives::wait_sites_between(before, after)) {
    char figure[32];
    std::snprintf(figure, sizeof figure, "%.2f", static_cast<double>(grown) / calls);
    out += detail::concat(out.empty() ? "" : ", ", site, " ", figure);
  }
  return out.empty() ? "none" : out;
}

// Writes `body` to `path` unless no --json was given: beside it, then renamed over it, so that
// a reader (or a kill) never meets a half-written file.
void write_json_if_asked(const char* command, const std::string& path, const std::string& body) {
  if (path.empty()) return;
  const std::string part = path + ".part";
  write_json_file(command, part, body);
  GZ_REQUIRE(std::rename(part.c_str(), path.c_str()) == 0, ErrorCode::io_error, command,
             ": cannot rename '", part, "' to '", path, "'");
}

bool no_device(const char* command, const std::string& json_path) {
  const char* reason = nullptr;
  if (kernels::cuda::device_count(&reason) > 0) return false;
  std::printf("gradzip-bench %s: no CUDA device (%s): skipped\n", command, reason);
  write_json_if_asked(command, json_path,
                      detail::concat("{\"benchmark\": ", json_string(command), ", \"skipped\": ",
                                     json_string(reason), "}\n"));
  return true;
}

}  // namespace

int run_preflight(int argc, char** argv) {
  const char* json_flag = option(argc, argv, "--json");
  const std::string json_path = json_flag ? json_flag : "";
  if (no_device("preflight", json_path)) return 0;
  std::string json = "{\"benchmark\": \"preflight\"";
  std::string step = "device properties";
  // What is known so far, before each step: a step that hangs leaves the file naming it.
  const auto progress = [&] {
    write_json_if_asked("preflight", json_path,
                        json + detail::concat(", \"running\": ", json_string(step), ", \"complete\": false}\n"));
  };
  try {
    progress();
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    cudaDeviceProp props{};
    check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
    // gradzip's own answer (the one its allocations follow), not a second query of CUDA's.
    const bool pools = kernels::cuda::device_memory_pools_supported(0, "preflight");
    int driver = 0;
    int runtime = 0;
    check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
    check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
    std::printf("device 0: %s, compute %d.%d, %d SMs, %.1f GiB, %d-bit memory bus; driver %d, runtime %d\n",
                props.name, props.major, props.minor, props.multiProcessorCount,
                static_cast<double>(props.totalGlobalMem) / (1 << 30), props.memoryBusWidth, driver,
                runtime);
    std::printf("memory pools: %s\n", pools ? "supported (gradzip's own pool, release threshold max)"
                                            : "NOT supported: gradzip falls back to cudaMalloc");
    json += detail::concat(", \"device\": ", json_string(props.name), ", \"compute\": \"",
                           props.major, ".", props.minor, "\", \"sms\": ", props.multiProcessorCount,
                           ", \"memory_bytes\": ", props.totalGlobalMem, ", \"driver\": ", driver,
                           ", \"runtime\": ", runtime, ", \"memory_pools\": ", pools ? "true" : "false");

    step = "an allocation through gradzip's device runtime";
    progress();
    const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
    { const collectives::DeviceAllocation block(1 << 20, 0, "preflight"); }
    { const collectives::DeviceAllocation again(1 << 20, 0, "preflight"); }
    const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
    std::printf("device runtime: 2 allocations of 1 MiB -> %llu from CUDA, %llu from the cache\n",
                static_cast<unsigned long long>(after.allocations - before.allocations),
                static_cast<unsigned long long>(after.cache_hits - before.cache_hits));
    GZ_REQUIRE(after.allocations - before.allocations == 1 && after.cache_hits - before.cache_hits == 1,
               ErrorCode::internal, "the second allocation of the same size did not come from the cache");

    step = "a one-rank NCCL communicator";
    json += detail::concat(", \"nccl_built\": ", collectives::nccl_transport_built() ? "true" : "false");
    progress();
    if (collectives::nccl_transport_built()) {
      collectives::SelfTransport bootstrap;
      std::unique_ptr<collectives::Transport> nccl = collectives::make_nccl_transport(bootstrap, 0);
      nccl->connect_eagerly();
      const std::vector<float> values = {1.5f, -2.0f, 3.25f};
      collectives::DeviceAllocation data(values.size() * sizeof(float), 0, "preflight");
      collectives::copy_host_to_device(data.data(), values.data(), values.size() * sizeof(float), 0,
                                       "preflight");
      nccl->allreduce_f32_sum({reinterpret_cast<float*>(data.data()), values.size()});
      std::vector<float> back(values.size());
      collectives::copy_device_to_host(back.data(), data.data(), back.size() * sizeof(float), 0,
                                       "preflight");
      GZ_REQUIRE(std::memcmp(back.data(), values.data(), back.size() * sizeof(float)) == 0,
                 ErrorCode::internal, "a one-rank NCCL all-reduce changed its data");
      std::printf("NCCL: %s, connected, one all-reduce exact\n", nccl->describe().c_str());
    } else {
      std::printf("NCCL: not in this build (CUDA tensors are staged through host memory)\n");
    }
  } catch (const std::exception& error) {
    std::printf("gradzip-bench preflight: FAILED at %s: %s\n", step.c_str(), error.what());
    write_json_if_asked("preflight", json_path,
                        json + detail::concat(", \"failed\": ", json_string(step + ": " + error.what()),
                                              ", \"complete\": true}\n"));
    return 1;
  }
  write_json_if_asked("preflight", json_path, json + ", \"complete\": true}\n");
  std::printf("gradzip-bench preflight: OK\n");
  return 0;
}

int run_calls(int argc, char** argv) {
  const char* json_flag = option(argc, argv, "--json");
  const std::string json_path = json_flag ? json_flag : "";
  const char* size_flag = option(argc, argv, "--size");
  const char* calls_flag = option(argc, argv, "--calls");
  const std::size_t count = size_flag ? parse_count("calls", size_flag, "--size") : (std::size_t{1} << 22);
  const int calls = calls_flag ? static_cast<int>(parse_count("calls", calls_flag, "--calls")) : 10;
  bool world = false;
  for (int i = 1; i < argc; ++i) world = world || std::string_view(argv[i]) == "--world";
  GZ_REQUIRE(count > 0 && calls > 0, ErrorCode::invalid_argument, "gradzip-bench calls: --size and --calls must be positive");
#if !GRADZIP_HAVE_MPI
  GZ_REQUIRE(!world, ErrorCode::unsupported,
             "gradzip-bench calls --world: this build has no MPI (configure with Open MPI)");
#endif
  const char* reason = nullptr;
  if (kernels::cuda::device_count(&reason) == 0 && !kernels::emulated::active()) {
    // The counts are the library's: measure them on the emulated device (a process reads
    // GRADZIP_DEVICE once, so this takes a new process image).
    std::printf("gradzip-bench calls: no CUDA device (%s): running on the emulated device\n", reason);
    std::fflush(stdout);
    ::setenv("GRADZIP_DEVICE", "emulated", 1);
    ::execv("/proc/self/exe", argv - 1);  // argv[-1] is "gradzip-bench" (gradzip_bench.cpp)
    std::printf("gradzip-bench calls: cannot run again on the emulated device: %s\n", std::strerror(errno));
    return 1;
  }
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  int ranks = 1, rank = 0;
#if GRADZIP_HAVE_MPI
  if (world) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      std::atexit([] { MPI_Finalize(); });
    }
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
#endif
  // Only rank 0 prints and writes.
  const auto say = [rank](const char* format, auto... values) {
    if (rank == 0) std::printf(format, values...);
  };
  // Fixed-size codecs: their messages' sizes are known on the host, so a call needs at most the
  // one host wait that returns its result.
  struct Row {
    const char* spec;
    bool fixed_size;
  };
  const Row rows[] = {{"none", true},
                      {"fp16", true},
                      {"fp16:ef=on", true},
                      {"bf16", true},
                      {"qsgd:bits=4", true},
                      {"qsgd:bits=4,ef=on", true},
                      {"sign:ef=off", true},
                      {"sign:ef=on", true},
                      {"terngrad:ef=off", true},
                      {"terngrad:ef=on", true},
                      {"randk:ratio=0.01", true},
                      {"topk:ratio=0.01,ef=off", true},
                      {"topk:ratio=0.01,ef=on", true},
                      {"topk:ratio=0.01,approx=on,ef=on", false}};
  const bool emulated = kernels::emulated::active();
  float* tensor = nullptr;
  check(cudaMalloc(&tensor, count * sizeof(float)), "cudaMalloc of the tensor");
  std::vector<float> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  collectives::set_wait_site_counting(true);  // a measurement: the waits by site too
  say("%d-rank all-reduce of %zu f32 elements on cuda:0, %d steady-state calls after 3 warm-up calls%s\n",
      ranks, count, calls, world ? " (each count: the largest over the ranks)" : "");
  if (emulated) say("on the emulated device (GRADZIP_DEVICE=emulated): the library's counts, CPU timing\n");
  say("%-34s %-10s %11s %11s %11s %13s %11s  target\n", "spec", "algorithm", "allocs/call",
      "waits/call", "completion", "h<->d B/call", "cache/call");
  std::string json = detail::concat("{\"benchmark\": \"calls\", \"device\": ",
                                    json_string(emulated ? "emulated" : "cuda"), ", \"ranks\": ", ranks,
                                    ", \"size\": ", count, ", \"calls\": ", calls, ", \"rows\": [");
  const std::string written_path = rank == 0 ? json_path : "";
  // The largest value over the ranks (every rank takes part; one rank: the value).
  const auto largest = [world](double value) {
#if GRADZIP_HAVE_MPI
    if (world) MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#else
    (void)world;
#endif
    return value;
  };
  int status = 0;
  bool first = true;
  write_json_if_asked("calls", written_path, json + "], \"complete\": false}\n");
  for (const Row& row : rows) {
    try {
      CommunicatorOptions options;
      options.cuda_path = CudaPath::automatic;
      Communicator communicator =
          world ? Communicator::world(options)
                : collectives::make_communicator(std::make_unique<collectives::SelfTransport>(), options);
      const TensorView view{tensor, count, DType::f32, Device{DeviceKind::cuda, 0}};
      CollectiveStats stats;
      for (int warm = 0; warm < 3; ++warm) {
        check(cudaMemcpy(tensor, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "upload");
        stats = communicator.allreduce(view, "g", row.spec);
      }
      check(cudaMemcpy(tensor, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "upload");
      check(cudaStreamSynchronize(nullptr), "upload");
      const auto sites_before = collectives::device_wait_sites();
      const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
      for (int call = 0; call < calls; ++call) stats = communicator.allreduce(view, "g", row.spec);
      const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
      const std::string sites = wait_sites_per_call(sites_before, collectives::device_wait_sites(), calls);
      const double allocations = largest(static_cast<double>(after.allocations - before.allocations) / calls);
      std::uint64_t completion_count = 0;
      for (const auto& [site, grown] :
           collectives::wait_sites_between(sites_before, collectives::device_wait_sites()))
        if (site == kCompletionSite) completion_count = grown;
      const double completions = largest(static_cast<double>(completion_count) / calls);
      const double waits = largest(
          static_cast<double>(after.synchronizations - before.synchronizations - completion_count) / calls);
      const double hits = largest(static_cast<double>(after.cache_hits - before.cache_hits) / calls);
      const double copied =
          largest(static_cast<double>(after.host_device_bytes - before.host_device_bytes) / calls);
      const bool met = !row.fixed_size || (allocations == 0 && waits == 0 && copied == 0);
      say("%-34s %-10s %11.2f %11.2f %11.2f %13.1f %11.2f  %s: %s\n", row.spec,
          stats.algorithm.c_str(), allocations, waits, completions, copied, hits,
          row.fixed_size ? "0/0/0" : "(none)", met ? "met" : "NOT met");
      say("%-34s waits per call by site (rank 0): %s\n", "", sites.c_str());
      json += detail::concat(first ? "" : ", ", "{\"spec\": ", json_string(row.spec), ", \"algorithm\": ",
                             json_string(stats.algorithm), ", \"note\": ", json_string(stats.note),
                             ", \"allocations_per_call\": ", json_number(allocations), ", \"host_waits_per_call\": ",
                             json_number(waits), ", \"completion_waits_per_call\": ", json_number(completions),
                             ", \"host_device_bytes_per_call\": ", json_number(copied),
                             ", \"cache_hits_per_call\": ", json_number(hits),
                             ", \"wait_sites\": ", json_string(sites), ", \"fixed_size\": ",
                             row.fixed_size ? "true" : "false", ", \"target_met\": ", met ? "true" : "false", "}");
    } catch (const std::exception& error) {
      std::printf("%-24s FAILED: %s\n", row.spec, error.what());
      json += detail::concat(first ? "" : ", ", "{\"spec\": ", json_string(row.spec), ", \"failed\": ",
                             json_string(error.what()), "}");
      status = 1;
    }
    first = false;
    write_json_if_asked("calls", written_path, json + "], \"complete\": false}\n");  // every row at once
  }
  cudaFree(tensor);
  write_json_if_asked("calls", written_path, json + "], \"complete\": true}\n");
  return status;
}

}  // namespace gradzip::bench
