// gradzip-bench kernels: the CUDA kernels on --size f32 elements of N(0, 1) data (default 2^28,
// 1 GiB; never less than the L2 floor below). For each kernel of the table below:
//   time_s            median over --repeat timed launches, each timed with CUDA events on one
//                     stream, after one untimed warm-up launch
//   bytes             the minimum bytes the kernel must move: its input read once plus its output
//                     written once (what an ideal kernel touches in device memory; for gathers
//                     and scatters, the elements they touch, 4 bytes each)
//   gbps              bytes / time_s / 1e9
//   copy_bytes        the bytes of the copy baseline: the kernel's input for encoders, casts to
//                     16 bits, error feedback and top-k; the f32 output it writes (n * 4 bytes)
//                     for decoders (qsgd / sign decode, casts to f32, sparse decode-add, random-k
//                     scatter-add), not their smaller payload; and never less than 4x the
//                     device's L2 cache (cudaDevAttrL2CacheSize, read at run time), so that the
//                     copy runs at device-memory speed instead of partly in L2
//   copy_time_s       median time of a device-to-device cudaMemcpyAsync of copy_bytes, measured
//                     the same way in the same run, just before the kernel
//   copy_gbps         2 * copy_bytes / copy_time_s / 1e9 (a copy reads and writes its bytes: the
//                     same count as `bytes`, so the two rates compare directly)
//   fraction_of_copy  gbps / copy_gbps
// The L2 floor: --size is raised, when smaller, to the smallest power of two whose f32 bytes are
// at least 4x the L2 cache (said so on stdout; "size_requested" in the JSON); --size auto asks
// for exactly that size, at least 2^24 (a short run: gpu-check.sh --quick).
// The JSON also holds input_copy_gbps: the same measure for a copy of the whole f32 input, and
// "nccl": the NCCL library gradzip's loader takes in this process (nccl_api(): path, the search
// step that found it, version), or why none.
// The --json file is rewritten (whole, as valid JSON: written beside it and renamed over it)
// before the first kernel and after every kernel, with "complete": false until the last one is
// done, so a run that hangs or is killed keeps every row already measured.
// After its timed runs, a kernel with a cheap result check (a decoder's status, top-k's entry
// count) is checked; a kernel that fails to launch or fails its check is listed under "failed"
// and makes the exit status 1. Correctness itself is the gpu tests' job (tests/gpu).
// Without a CUDA device it prints why and exits 0 (with --json, it writes {"skipped": reason}).
//
// --nccl-library prints the NCCL library gradzip's loader takes here (path, how it was found,
// version) and exits: 0 when one loads, 1 when none does (the error names every place tried),
// 3 in a build without NCCL. It needs no device.
//
// Adding a kernel: one entry in make_table(): a name, and a setup function that receives the
// shared device inputs (and an arena for any buffers or workspace of its own) and returns the
// bytes it moves, the bytes of its copy baseline (its input; a decoder's f32 output), the launch
// to time and optionally a check.
#include "kernels/device_api.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmarks/bench_support.h"
#include "gradzip/error.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/ef_cuda.h"
#include "compressors/qsgd/cuda/qsgd_kernels.h"
#include "compressors/randk/cuda/randk_kernels.h"
#include "compressors/sign/cuda/sign_kernels.h"
#include "kernels/cuda/sparse_cuda.h"
#include "compressors/topk/cuda/topk_kernels.h"
#include "compressors/topk/cuda/topk_plan.h"

// The NCCL loader's own answer (nccl_api()) needs NCCL's header, which the build puts on this
// file's include path when it comes with the CUDA toolkit (gpu-check.sh adds it otherwise), and
// the toolkit's CUDA runtime header (CUDART_VERSION; the toolkit-free build's stand-in has none
// and never loads NCCL).
#if defined(GRADZIP_HAVE_NCCL) && defined(CUDART_VERSION) && __has_include(<nccl.h>)
#define GRADZIP_BENCH_NCCL_API 1
#include "collectives/transport/nccl/nccl_library.h"
#else
#define GRADZIP_BENCH_NCCL_API 0
#endif

namespace gradzip::bench {
namespace {

#define GZ_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    const cudaError_t gz_status_ = (call);                                                     \
    GZ_REQUIRE(gz_status_ == cudaSuccess, ErrorCode::unsupported, "kernels: ", #call, ": ",    \
               cudaGetErrorString(gz_status_));                                                \
  } while (0)

struct Options {
  std::size_t size = std::size_t{1} << 28;
  bool size_auto = false;  // --size auto: the L2 floor itself
  int repeat = 20;
  std::vector<std::string> kernels;  // empty: all
  std::string json_path;
  bool list = false;
  bool nccl_library = false;
  bool help = false;
};

void print_help() {
  std::printf(
      "usage: gradzip-bench kernels [--size N|auto] [--repeat R] [--kernel NAME]... [--list] "
      "[--json FILE] [--nccl-library]\n"
      "  --size N       f32 elements of N(0,1) data (default 268435456 = 2^28); raised to the\n"
      "                 L2 floor when smaller: the smallest power of two of at least 4x the\n"
      "                 device's L2 cache in f32 bytes; 'auto': that floor (at least 2^24)\n"
      "  --repeat R     timed launches per kernel, the median is reported (default 20)\n"
      "  --kernel NAME  measure only this kernel; repeat for several (default: all; --list)\n"
      "  --list         print the kernel names and exit\n"
      "  --json FILE    also write the results as one JSON object to FILE, rewritten after\n"
      "                 every kernel (\"complete\": false until the last)\n"
      "  --nccl-library print the NCCL library gradzip's loader takes here (path, how found,\n"
      "                 version) and exit: 0 loaded, 1 none loads, 3 no NCCL in this build\n"
      "Each kernel is reported next to a device-to-device copy measured in the same run: of\n"
      "its input, or for decoders of the f32 output they write; at least 4x the L2 cache.\n"
      "Without a CUDA device, prints why and exits 0.\n");
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* {
      GZ_REQUIRE(i + 1 < argc, ErrorCode::invalid_argument, "kernels: ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--size") {
      const std::string text = value();
      options.size_auto = text == "auto";
      if (!options.size_auto) {
        options.size = parse_count("kernels", text.c_str(), arg);
        GZ_REQUIRE(options.size >= 1, ErrorCode::invalid_argument, "kernels: --size must be >= 1");
      }
    } else if (arg == "--repeat") {
      options.repeat = static_cast<int>(parse_count("kernels", value(), arg));
      GZ_REQUIRE(options.repeat >= 1, ErrorCode::invalid_argument, "kernels: --repeat must be >= 1");
    } else if (arg == "--kernel") {
      options.kernels.emplace_back(value());
    } else if (arg == "--json") {
      options.json_path = value();
    } else if (arg == "--list") {
      options.list = true;
    } else if (arg == "--nccl-library") {
      options.nccl_library = true;
    } else if (arg == "--help" || arg == "-h") {
      options.help = true;
    } else {
      GZ_THROW(ErrorCode::invalid_argument, "kernels: unknown option '", arg,
               "' (see gradzip-bench kernels --help)");
    }
  }
  return options;
}

// Device allocations that live until the end of the run.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (void* pointer : allocations_) cudaFree(pointer);
  }
  template <typename T>
  T* alloc(std::size_t count) {
    void* pointer = nullptr;
    const std::size_t bytes = std::max<std::size_t>(count * sizeof(T), 1);
    GZ_CUDA_CHECK(cudaMalloc(&pointer, bytes));
    allocations_.push_back(pointer);
    return static_cast<T*>(pointer);
  }

 private:
  std::vector<void*> allocations_;
};

// The inputs every kernel may read, and outputs it may overwrite: all of `n` elements.
struct Inputs {
  std::size_t n = 0;
  const float* x = nullptr;               // N(0, 1)
  const std::uint16_t* x_f16 = nullptr;   // f16 bits of x
  const std::uint16_t* x_bf16 = nullptr;  // bf16 bits of x
  float* out_f32 = nullptr;
  std::uint16_t* out_u16 = nullptr;
};

using Launch = std::function<void(cudaStream_t)>;

struct Prepared {
  std::size_t bytes = 0;       // minimum bytes moved: input read + output written
  // The bytes the copy baseline copies (raised to the L2 floor when smaller): the kernel's
  // input, or for a decoder the f32 output it writes (n * 4), not its payload.
  std::size_t copy_bytes = 0;
  Launch launch;
  // Optional, after the timed runs: throws gradzip::Error when the result is not what a
  // working kernel leaves (a decoder's status, top-k's entry count).
  std::function<void()> check;
};

struct Entry {
  std::string name;
  std::function<Prepared(const Inputs&, Arena&)> setup;
};

template <typename T>
T read_device(const T* d_value) {
  T value{};
  GZ_CUDA_CHECK(cudaMemcpy(&value, d_value, sizeof(T), cudaMemcpyDeviceToHost));
  return value;
}

std::function<void()> expect_status_zero(const int* d_status, const char* what) {
  return [d_status, what] {
    const int status = read_device(d_status);
    GZ_REQUIRE(status == 0, ErrorCode::internal, "kernels: ", what, " reported status ", status,
               " on a payload its encoder wrote");
  };
}

constexpr std::size_t kF32 = sizeof(float), kU16 = sizeof(std::uint16_t);
constexpr std::size_t kBucket = 512;           // CompressionSpec's default qsgd / sign bucket
constexpr std::size_t kSparseRanks = 4;        // payloads summed by sparse.decode_add
const kernels::cuda::QsgdEncodeParams kQsgdParams{1, 1, 7, 0};  // seed, step, tensor id, offset
const kernels::RandkKey kRandkKey{1, 1, 7, 0};

// ceil(n / 100): the spec's k at ratio 0.01.
std::size_t one_percent(std::size_t n) { return (n + 99) / 100; }

Entry cast_entry(const char* name, bool narrow, bool bf16) {
  return {name, [narrow, bf16](const Inputs& in, Arena&) {
            namespace k = kernels::cuda;
            // Narrowing: a copy of the f32 input; widening (a decoder): of the f32 output.
            Prepared p{in.n * (kF32 + kU16), in.n * kF32, nullptr, nullptr};
            if (narrow && !bf16) p.launch = [&in](cudaStream_t s) { k::f32_to_f16(in.x, in.out_u16, in.n, s); };
            if (narrow && bf16) p.launch = [&in](cudaStream_t s) { k::f32_to_bf16(in.x, in.out_u16, in.n, s); };
            if (!narrow && !bf16) p.launch = [&in](cudaStream_t s) { k::f16_to_f32(in.x_f16, in.out_f32, in.n, s); };
            if (!narrow && bf16) p.launch = [&in](cudaStream_t s) { k::bf16_to_f32(in.x_bf16, in.out_f32, in.n, s); };
            return p;
          }};
}

// qsgd and sign rows: the default (fast) kernels as "qsgd.encode.bits8", ...; the reference
// kernels (kernels/cuda/kernel_variant.h) as "qsgd.encode.bits8.reference", "sign.encode.reference".
using kernels::cuda::KernelVariant;

Entry qsgd_entry(int bits, bool encode, KernelVariant variant = KernelVariant::fast) {
  const char* variant_part = variant == KernelVariant::reference ? ".reference" : "";
  return {std::string("qsgd.") + (encode ? "encode" : "decode") + ".bits" + std::to_string(bits) + variant_part,
          [bits, encode, variant](const Inputs& in, Arena& arena) {
            namespace k = kernels::cuda;
            const std::size_t payload_bytes = k::qsgd_payload_bytes(in.n, bits, kBucket);
            std::byte* payload = arena.alloc<std::byte>(payload_bytes);
            k::qsgd_encode(in.x, in.n, bits, kBucket, kQsgdParams, payload, nullptr, nullptr, nullptr,
                           variant);
            if (encode) {
              return Prepared{in.n * kF32 + payload_bytes, in.n * kF32, [&in, bits, payload, variant](cudaStream_t s) {
                                k::qsgd_encode(in.x, in.n, bits, kBucket, kQsgdParams, payload, nullptr,
                                               nullptr, s, variant);
                              }, nullptr};
            }
            int* status = arena.alloc<int>(1);
            // A decoder: against a copy of the f32 output it writes, not of its payload.
            return Prepared{payload_bytes + in.n * kF32, in.n * kF32,
                            [&in, bits, payload, status, variant](cudaStream_t s) {
                              k::qsgd_decode(payload, in.n, bits, kBucket, in.out_f32, false, status, s,
                                             variant);
                            },
                            expect_status_zero(status, "qsgd_decode")};
          }};
}

Entry sign_entry(bool encode, KernelVariant variant = KernelVariant::fast) {
  const char* variant_part = variant == KernelVariant::reference ? ".reference" : "";
  return {std::string(encode ? "sign.encode" : "sign.decode") + variant_part,
          [encode, variant](const Inputs& in, Arena& arena) {
            namespace k = kernels::cuda;
            const std::size_t payload_bytes = k::sign_payload_bytes(in.n, kBucket);
            std::byte* payload = arena.alloc<std::byte>(payload_bytes);
            k::sign_encode(in.x, in.n, kBucket, payload, nullptr, nullptr, nullptr, variant);
            if (encode) {
              return Prepared{in.n * kF32 + payload_bytes, in.n * kF32, [&in, payload, variant](cudaStream_t s) {
                                k::sign_encode(in.x, in.n, kBucket, payload, nullptr, nullptr, s, variant);
                              }, nullptr};
            }
            int* status = arena.alloc<int>(1);
            // A decoder: against a copy of the f32 output it writes, not of its payload.
            return Prepared{payload_bytes + in.n * kF32, in.n * kF32,
                            [&in, payload, status, variant](cudaStream_t s) {
                              k::sign_decode(payload, in.n, kBucket, in.out_f32, false, status, s, variant);
                            },
                            expect_status_zero(status, "sign_decode")};
          }};
}

// Error feedback: ef.compensate (c = g + e), ef.update (e = c - D), ef.cast_fused.f16/bf16.
Entry ef_entry(const char* name, int which) {
  return {name, [which](const Inputs& in, Arena& arena) {
            namespace k = kernels::cuda;
            float* residual = arena.alloc<float>(in.n);
            GZ_CUDA_CHECK(cudaMemset(residual, 0, in.n * kF32));
            if (which == 0) {
              return Prepared{3 * in.n * kF32, 2 * in.n * kF32, [&in, residual](cudaStream_t s) {
                                k::ef_compensate(in.x, residual, in.out_f32, in.n, s);
                              }, nullptr};
            }
            if (which == 1) {
              return Prepared{3 * in.n * kF32, 2 * in.n * kF32, [&in, residual](cudaStream_t s) {
                                k::ef_update(in.x, in.out_f32, residual, in.n, s);
                              }, nullptr};
            }
            const bool bf16 = which == 3;
            return Prepared{2 * in.n * kF32 + in.n * (kF32 + kU16), 2 * in.n * kF32,
                            [&in, residual, bf16](cudaStream_t s) {
                              k::ef_cast_fused(in.x, residual, in.out_u16, bf16, in.n, s);
                            }, nullptr};
          }};
}

// Top-k of 1%: "topk.exact.1pct" / "topk.approx.1pct" run the default (fast, one-pass
// compactions); the ".reference" rows the two-pass compactions (count, scan, write).
Entry topk_entry(bool approx, kernels::cuda::KernelVariant variant) {
  const bool reference = variant == kernels::cuda::KernelVariant::reference;
  return {std::string(approx ? "topk.approx.1pct" : "topk.exact.1pct") + (reference ? ".reference" : ""),
          [approx, variant](const Inputs& in, Arena& arena) {
            namespace k = kernels::cuda;
            const std::uint64_t n = in.n, topk = one_percent(in.n);
            k::TopkCudaOptions options;
            options.variant = variant;
            options.approx = approx;
            options.seed = 1;
            options.step = 1;
            options.tensor_id = 7;
            const std::size_t payload_bytes = k::topk_payload_bytes(n, topk, false);
            std::byte* payload = arena.alloc<std::byte>(payload_bytes);
            auto* entries = arena.alloc<std::uint64_t>(1);
            std::size_t workspace_bytes = 0;
            k::topk_select(in.x, n, topk, options, payload, entries, nullptr, &workspace_bytes, nullptr);
            void* workspace = arena.alloc<std::byte>(workspace_bytes);
            return Prepared{in.n * kF32 + payload_bytes, in.n * kF32,
                            [&in, topk, options, payload, entries, workspace, workspace_bytes](cudaStream_t s) {
                              std::size_t bytes = workspace_bytes;
                              k::topk_select(in.x, in.n, topk, options, payload, entries, workspace, &bytes, s);
                            },
                            [entries, topk, approx] {
                              const std::uint64_t m = read_device(entries);
                              GZ_REQUIRE(approx ? (m >= (topk + 1) / 2 && m <= topk) : m == topk,
                                         ErrorCode::internal, "kernels: topk_select kept ", m,
                                         " entries for k = ", topk);
                            }};
          }};
}

Entry randk_entry(bool gather) {
  return {gather ? "randk.gather.1pct" : "randk.scatter_add.1pct", [gather](const Inputs& in, Arena& arena) {
            namespace k = kernels::cuda;
            const std::size_t kept = one_percent(in.n);
            std::byte* values = arena.alloc<std::byte>(k::randk_values_bytes(kept, false));
            k::randk_gather(in.x, in.n, kRandkKey, kept, false, values, nullptr);
            if (gather) {
              return Prepared{2 * kept * kF32, kept * kF32, [&in, kept, values](cudaStream_t s) {
                                k::randk_gather(in.x, in.n, kRandkKey, kept, false, values, s);
                              }, nullptr};
            }
            // A decoder: against a copy of the f32 output it adds into.
            return Prepared{3 * kept * kF32, in.n * kF32, [&in, kept, values](cudaStream_t s) {
                              k::randk_scatter_add(values, kept, false, kRandkKey, in.n, in.out_f32, s);
                            }, nullptr};
          }};
}

// sparse.decode_add of kSparseRanks payloads of ceil(n / 100) entries each (one index in each
// stride of n / m elements, different on every rank), f32 values.
Entry sparse_entry() {
  return {"sparse.decode_add.4x1pct", [](const Inputs& in, Arena& arena) {
            namespace k = kernels::cuda;
            const std::size_t m = one_percent(in.n), stride = in.n / m;
            const bool wide = in.n > (std::uint64_t{1} << 32);
            const std::size_t index_bytes = wide ? 8 : 4;
            const std::size_t payload_bytes = k::sparse_payload_bytes(m, wide, false);
            auto payloads = std::make_shared<std::vector<const std::byte*>>();
            auto entries = std::make_shared<std::vector<std::uint64_t>>(kSparseRanks, m);
            std::vector<std::byte> host(payload_bytes);
            for (std::size_t r = 0; r < kSparseRanks; ++r) {
              for (std::size_t j = 0; j < m; ++j) {
                const std::uint64_t index = j * stride + (j * 2654435761u + r * 97) % stride;
                const float value = static_cast<float>(j % 1000) * 0.001f - 0.5f;
                if (wide) std::memcpy(host.data() + j * 8, &index, 8);
                else {
                  const auto narrow = static_cast<std::uint32_t>(index);
                  std::memcpy(host.data() + j * 4, &narrow, 4);
                }
                std::memcpy(host.data() + m * index_bytes + j * kF32, &value, kF32);
              }
              std::byte* payload = arena.alloc<std::byte>(payload_bytes);
              GZ_CUDA_CHECK(cudaMemcpy(payload, host.data(), payload_bytes, cudaMemcpyHostToDevice));
              payloads->push_back(payload);
            }
            int* status = arena.alloc<int>(1);
            // A decoder: against a copy of the f32 output it adds into.
            return Prepared{kSparseRanks * (payload_bytes + 2 * m * kF32), in.n * kF32,
                            [&in, payloads, entries, wide, status](cudaStream_t s) {
                              k::sparse_decode_add(payloads->data(), entries->data(), payloads->size(),
                                                   wide, false, in.n, in.out_f32, status, s);
                            },
                            expect_status_zero(status, "sparse_decode_add")};
          }};
}

// The kernels measured. Setup runs only for the kernels selected, before any of them is timed;
// workspace (two-phase convention) is sized and allocated there, never inside the launch.
std::vector<Entry> make_table() {
  std::vector<Entry> table;
  table.push_back(cast_entry("cast.f32_to_f16", true, false));
  table.push_back(cast_entry("cast.f32_to_bf16", true, true));
  table.push_back(cast_entry("cast.f16_to_f32", false, false));
  table.push_back(cast_entry("cast.bf16_to_f32", false, true));
  for (const int bits : {8, 4, 2}) table.push_back(qsgd_entry(bits, true));
  for (const int bits : {8, 4, 2}) table.push_back(qsgd_entry(bits, false));
  table.push_back(sign_entry(true));
  table.push_back(sign_entry(false));
  for (const int bits : {8, 4, 2}) table.push_back(qsgd_entry(bits, true, KernelVariant::reference));
  for (const int bits : {8, 4, 2}) table.push_back(qsgd_entry(bits, false, KernelVariant::reference));
  table.push_back(sign_entry(true, KernelVariant::reference));
  table.push_back(sign_entry(false, KernelVariant::reference));
  table.push_back(ef_entry("ef.compensate", 0));
  table.push_back(ef_entry("ef.update", 1));
  table.push_back(ef_entry("ef.cast_fused.f16", 2));
  table.push_back(ef_entry("ef.cast_fused.bf16", 3));
  for (const bool approx : {false, true}) {
    table.push_back(topk_entry(approx, kernels::cuda::KernelVariant::fast));
    table.push_back(topk_entry(approx, kernels::cuda::KernelVariant::reference));
  }
  table.push_back(randk_entry(true));
  table.push_back(randk_entry(false));
  table.push_back(sparse_entry());
  return table;
}

// N(0, 1) values, generated on all host cores (one engine per slice, fixed seeds).
std::vector<float> normal_data(std::size_t n) {
  std::vector<float> data(n);
  const std::size_t threads = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  const std::size_t slice = (n + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&data, n, slice, t] {
      std::mt19937_64 engine(2024 + t);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (std::size_t i = t * slice; i < std::min(n, (t + 1) * slice); ++i) data[i] = normal(engine);
    });
  }
  for (std::thread& worker : workers) worker.join();
  return data;
}

// Median of `repeat` event-timed runs of `launch` on `stream`, after one untimed warm-up.
double median_seconds(cudaStream_t stream, int repeat, const Launch& launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  GZ_CUDA_CHECK(cudaEventCreate(&start));
  GZ_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> seconds;
  try {
    launch(stream);
    GZ_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < repeat; ++r) {
      GZ_CUDA_CHECK(cudaEventRecord(start, stream));
      launch(stream);
      GZ_CUDA_CHECK(cudaEventRecord(stop, stream));
      GZ_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      GZ_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      seconds.push_back(ms * 1e-3);
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(seconds.begin(), seconds.end());
  const std::size_t mid = seconds.size() / 2;
  return seconds.size() % 2 == 1 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
}

double gbps(double bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }

struct Row {
  std::string name;
  double time_s = 0;
  std::size_t bytes = 0;
  std::size_t copy_bytes = 0;
  double copy_time_s = 0;
  double gbps_value() const { return gbps(static_cast<double>(bytes), time_s); }
  double copy_gbps() const { return gbps(2.0 * static_cast<double>(copy_bytes), copy_time_s); }
  double fraction_of_copy() const {
    return copy_gbps() > 0 ? gbps_value() / copy_gbps() : 0.0;
  }
};

// ---- the NCCL library gradzip's loader takes in this process ---------------------------------

struct NcclInfo {
  bool loaded = false;
  std::string path;
  std::string found_by;
  int version = 0;    // ncclGetVersion's code, 22809 for 2.28.9
  std::string error;  // why none, when !loaded
  int exit_code = 0;  // of --nccl-library: 0 loaded, 1 none loads, 3 none in this build
};

NcclInfo nccl_library_info() {
  NcclInfo info;
#if GRADZIP_BENCH_NCCL_API
  try {
    const collectives::NcclApi& api = collectives::nccl_api();
    info.loaded = true;
    info.path = api.path;
    info.found_by = api.found_by;
    info.version = api.version;
  } catch (const std::exception& error) {
    info.error = error.what();
    info.exit_code = 1;
  }
#elif defined(GRADZIP_HAVE_NCCL) && !defined(CUDART_VERSION)
  info.error = "a build without the CUDA toolkit: the emulated device never loads NCCL";
  info.exit_code = 3;
#elif defined(GRADZIP_HAVE_NCCL)
  info.error = "gradzip-bench was compiled without NCCL's header (nccl.h) on its include path, so "
               "it cannot ask gradzip's NCCL loader (build with that folder in CPLUS_INCLUDE_PATH, "
               "as scripts/gpu-check.sh does)";
  info.exit_code = 3;
#else
  info.error = "this gradzip was built without NCCL (GRADZIP_HAVE_NCCL off: no nccl.h / libnccl "
               "found at configure time)";
  info.exit_code = 3;
#endif
  return info;
}

// NCCL's version code as text: 22809 -> "2.28.9" (the encoding of NCCL 2.9 and later).
std::string nccl_version_text(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

std::string nccl_json(const NcclInfo& info) {
  if (!info.loaded) return "{\"loaded\": false, \"error\": " + json_string(info.error) + "}";
  return "{\"loaded\": true, \"path\": " + json_string(info.path) + ", \"found_by\": " +
         json_string(info.found_by) + ", \"version\": " + std::to_string(info.version) +
         ", \"version_text\": " + json_string(nccl_version_text(info.version)) + "}";
}

void print_nccl(const NcclInfo& info) {
  if (info.loaded) {
    std::printf("NCCL library (gradzip's loader): %s (found by: %s), version %s (%d)\n",
                info.path.c_str(), info.found_by.c_str(), nccl_version_text(info.version).c_str(),
                info.version);
  } else {
    std::printf("NCCL library (gradzip's loader): none: %s\n", info.error.c_str());
  }
  std::fflush(stdout);
}

// ---- JSON, rewritten whole after every kernel --------------------------------------------------

// Writes `body` next to `path` and renames it over `path`: a reader (or a kill) never meets a
// half-written file.
void write_json(const std::string& path, const std::string& body) {
  const std::string part = path + ".part";
  write_json_file("kernels", part, body);
  GZ_REQUIRE(std::rename(part.c_str(), path.c_str()) == 0, ErrorCode::io_error,
             "kernels: cannot rename '", part, "' to '", path, "'");
}

// What the JSON holds besides the rows.
struct RunInfo {
  std::string device;
  int sms = 0;
  std::size_t size = 0;
  std::size_t size_requested = 0;  // 0 with --size auto
  std::size_t l2_bytes = 0;
  std::size_t copy_floor_bytes = 0;  // 4 * l2_bytes: no copy baseline is smaller
  int repeat = 0;
  std::optional<double> input_copy_gbps;  // not yet measured: null
  std::string nccl;                       // nccl_json()
};

std::string rows_json(const RunInfo& run, const std::vector<Row>& rows,
                      const std::vector<std::pair<std::string, std::string>>& failed, bool complete) {
  std::string text = "{\"benchmark\": \"kernels\", \"complete\": " + std::string(complete ? "true" : "false") +
                     ", \"device\": " + json_string(run.device) + ", \"sm_count\": " + std::to_string(run.sms) +
                     ", \"size\": " + std::to_string(run.size) +
                     ", \"size_requested\": " + (run.size_requested ? std::to_string(run.size_requested) : "\"auto\"") +
                     ", \"l2_bytes\": " + std::to_string(run.l2_bytes) +
                     ", \"copy_floor_bytes\": " + std::to_string(run.copy_floor_bytes) +
                     ", \"repeat\": " + std::to_string(run.repeat) + ", \"input_copy_gbps\": " +
                     (run.input_copy_gbps ? json_number(*run.input_copy_gbps) : "null") +
                     ",\n \"nccl\": " + run.nccl + ",\n \"kernels\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    text += "  {\"name\": " + json_string(r.name) + ", \"time_s\": " + json_number(r.time_s) +
            ", \"bytes\": " + std::to_string(r.bytes) + ", \"gbps\": " + json_number(r.gbps_value()) +
            ", \"copy_bytes\": " + std::to_string(r.copy_bytes) +
            ", \"copy_time_s\": " + json_number(r.copy_time_s) +
            ", \"copy_gbps\": " + json_number(r.copy_gbps()) +
            ", \"fraction_of_copy\": " + json_number(r.fraction_of_copy()) + "}" +
            (i + 1 < rows.size() ? "," : "") + "\n";
  }
  text += " ],\n \"failed\": [";
  for (std::size_t i = 0; i < failed.size(); ++i) {
    text += std::string(i ? ",\n  " : "\n  ") + "{\"name\": " + json_string(failed[i].first) +
            ", \"error\": " + json_string(failed[i].second) + "}";
  }
  return text + "]}\n";
}

// The smallest power of two of f32 elements whose bytes are at least `floor_bytes`.
std::size_t floor_elements(std::size_t floor_bytes) {
  std::size_t n = 1;
  while (n * sizeof(float) < floor_bytes) n *= 2;
  return n;
}

}  // namespace

int run_kernels(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "gradzip-bench kernels: %s\n", error.what());
    return 2;
  }
  if (options.help) {
    print_help();
    return 0;
  }
  if (options.nccl_library) {  // needs no device
    const NcclInfo info = nccl_library_info();
    print_nccl(info);
    return info.exit_code;
  }
  const std::vector<Entry> table = make_table();
  if (options.list) {
    for (const Entry& entry : table) std::printf("%s\n", entry.name.c_str());
    return 0;
  }
  std::vector<const Entry*> selected;
  for (const Entry& entry : table) {
    if (options.kernels.empty() ||
        std::find(options.kernels.begin(), options.kernels.end(), entry.name) != options.kernels.end())
      selected.push_back(&entry);
  }
  for (const std::string& name : options.kernels) {
    const bool known = std::any_of(table.begin(), table.end(),
                                   [&](const Entry& entry) { return entry.name == name; });
    if (!known) {
      std::fprintf(stderr, "gradzip-bench kernels: unknown kernel '%s' (see --list)\n", name.c_str());
      return 2;
    }
  }

  // Before measuring: which NCCL this process would use (the kernels do not use it).
  const NcclInfo nccl = nccl_library_info();
  print_nccl(nccl);

  const char* reason = nullptr;
  if (kernels::cuda::device_count(&reason) == 0) {
    std::printf("gradzip-bench kernels: no CUDA device (%s); nothing measured\n",
                reason != nullptr ? reason : "unknown reason");
    if (!options.json_path.empty()) {
      write_json(options.json_path,
                 std::string("{\"benchmark\": \"kernels\", \"complete\": true, \"skipped\": ") +
                     json_string(std::string("no CUDA device: ") +
                                 (reason != nullptr ? reason : "unknown reason")) +
                     ", \"nccl\": " + nccl_json(nccl) + ", \"kernels\": []}\n");
    }
    return 0;
  }

  cudaDeviceProp device{};
  GZ_CUDA_CHECK(cudaGetDeviceProperties(&device, 0));
  int l2_bytes = 0;
  GZ_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  RunInfo run;
  run.device = device.name;
  run.sms = device.multiProcessorCount;
  run.l2_bytes = static_cast<std::size_t>(std::max(l2_bytes, 0));
  run.copy_floor_bytes = 4 * run.l2_bytes;
  run.repeat = options.repeat;
  run.nccl = nccl_json(nccl);
  // The L2 floor: the f32 input, and so every decoder's f32 output, at least 4x the L2 cache.
  const std::size_t floor_n = floor_elements(run.copy_floor_bytes);
  if (options.size_auto) {
    run.size = std::max(floor_n, std::size_t{1} << 24);
  } else {
    run.size_requested = options.size;
    run.size = options.size;
    if (options.size < floor_n) {
      run.size = floor_n;
      std::printf("gradzip-bench kernels: --size %zu raised to %zu: the f32 data (and every "
                  "decoder's output) must be at least 4x the L2 cache\n",
                  options.size, run.size);
    }
  }
  const std::size_t n = run.size;
  std::vector<Row> rows;
  std::vector<std::pair<std::string, std::string>> failed;  // name, error
  const auto save = [&](bool complete) {
    if (!options.json_path.empty()) write_json(options.json_path, rows_json(run, rows, failed, complete));
  };
  save(false);  // the device and the sizes, before anything is measured

  Arena arena;
  Inputs inputs;
  inputs.n = n;
  {
    const std::vector<float> host = normal_data(n);
    float* x = arena.alloc<float>(n);
    GZ_CUDA_CHECK(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    inputs.x = x;
  }
  std::uint16_t* x_f16 = arena.alloc<std::uint16_t>(n);
  std::uint16_t* x_bf16 = arena.alloc<std::uint16_t>(n);
  kernels::cuda::f32_to_f16(inputs.x, x_f16, n, nullptr);
  kernels::cuda::f32_to_bf16(inputs.x, x_bf16, n, nullptr);
  inputs.x_f16 = x_f16;
  inputs.x_bf16 = x_bf16;
  inputs.out_f32 = arena.alloc<float>(n);
  inputs.out_u16 = arena.alloc<std::uint16_t>(n);
  GZ_CUDA_CHECK(cudaMemset(inputs.out_f32, 0, n * sizeof(float)));
  GZ_CUDA_CHECK(cudaMemset(inputs.out_u16, 0, n * sizeof(std::uint16_t)));
  GZ_CUDA_CHECK(cudaDeviceSynchronize());

  cudaStream_t stream = nullptr;
  GZ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // The copy of the whole f32 input, once: the device's copy rate at this size, for reference.
  {
    float* copy = arena.alloc<float>(n);
    const double seconds = median_seconds(stream, options.repeat, [&](cudaStream_t s) {
      GZ_CUDA_CHECK(cudaMemcpyAsync(copy, inputs.x, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    });
    run.input_copy_gbps = gbps(2.0 * static_cast<double>(n * sizeof(float)), seconds);
  }
  save(false);
  std::printf("gradzip-bench kernels: %s (%d SMs, %s L2), %zu f32 elements (%s) of N(0,1), median "
              "of %d runs\n",
              device.name, device.multiProcessorCount,
              human_bytes(static_cast<double>(run.l2_bytes)).c_str(), n,
              human_bytes(static_cast<double>(n) * sizeof(float)).c_str(), options.repeat);
  std::printf("device-to-device copy of the f32 input: %.1f GB/s (read + written)\n",
              *run.input_copy_gbps);
  std::printf("bytes = minimum bytes moved (read + written); copy = device-to-device "
              "cudaMemcpyAsync, same run, counted read + written, of the kernel's input or, for "
              "decoders, of the f32 output they write; never under %s (4x L2)\n\n",
              human_bytes(static_cast<double>(run.copy_floor_bytes)).c_str());
  std::printf("%-28s %11s %11s %10s %10s %9s\n", "kernel", "time ms", "bytes", "GB/s", "copy GB/s",
              "of copy");

  // Copy baseline buffers, grown to the largest copy a kernel needs.
  std::byte* copy_src = nullptr;
  std::byte* copy_dst = nullptr;
  std::size_t copy_capacity = 0;
  for (const Entry* entry : selected) {
    try {
      const Prepared prepared = entry->setup(inputs, arena);
      GZ_CUDA_CHECK(cudaDeviceSynchronize());  // setup may have launched on the default stream
      Row row;
      row.name = entry->name;
      row.bytes = prepared.bytes;
      row.copy_bytes = std::max(prepared.copy_bytes, run.copy_floor_bytes);
      if (row.copy_bytes > copy_capacity) {
        copy_capacity = row.copy_bytes;
        copy_src = arena.alloc<std::byte>(copy_capacity);
        copy_dst = arena.alloc<std::byte>(copy_capacity);
        GZ_CUDA_CHECK(cudaMemset(copy_src, 0x3c, copy_capacity));
        GZ_CUDA_CHECK(cudaMemset(copy_dst, 0, copy_capacity));
      }
      row.copy_time_s = median_seconds(stream, options.repeat, [&](cudaStream_t s) {
        GZ_CUDA_CHECK(cudaMemcpyAsync(copy_dst, copy_src, row.copy_bytes, cudaMemcpyDeviceToDevice, s));
      });
      row.time_s = median_seconds(stream, options.repeat, prepared.launch);
      GZ_CUDA_CHECK(cudaGetLastError());
      if (prepared.check) prepared.check();
      std::printf("%-28s %11.4f %11s %10.1f %10.1f %9.3f\n", row.name.c_str(), row.time_s * 1e3,
                  human_bytes(static_cast<double>(row.bytes)).c_str(), row.gbps_value(),
                  row.copy_gbps(), row.fraction_of_copy());
      std::fflush(stdout);
      rows.push_back(row);
    } catch (const std::exception& error) {
      std::printf("%-28s failed: %s\n", entry->name.c_str(), error.what());
      std::fflush(stdout);
      failed.emplace_back(entry->name, error.what());
    }
    save(false);  // every row as soon as it is measured
  }
  cudaStreamDestroy(stream);

  save(true);
  return failed.empty() ? 0 : 1;
}

}  // namespace gradzip::bench
