#include "kernels/tunables.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "gradzip/error.h"

namespace gradzip::kernels {
namespace {

constexpr std::array kTunables = {
    Tunable{"GRADZIP_CPU_ISA", "auto",
            "Vector instruction set of the CPU kernels: auto (best the CPU has), avx512, avx2 or "
            "scalar. All give the same bits; forcing one is for testing and benchmarking."},
    Tunable{"GRADZIP_COMPRESSOR", "none",
            "Compression spec used when the application does not pass one (grammar in the README)."},
    Tunable{"GRADZIP_TIMEOUT_S", "600",
            "Deadline in seconds (fractional allowed) of every blocking wait; overrides "
            "CommunicatorOptions::timeout_seconds. On expiry: a report, then MPI_Abort or an "
            "ErrorCode::timeout exception (CommunicatorOptions::on_timeout)."},
    Tunable{"GRADZIP_LINK", "",
            "LATENCY_US,GBPS[,EXCHANGE_GBPS]: the link algo=auto's cost model assumes, instead of "
            "measuring it at the first call that needs it; overrides CommunicatorOptions::link_*. "
            "Unset: measured."},
    Tunable{"GRADZIP_TIMELINE", "",
            "PATH: the Reducer and the DDP hook write a Chrome trace / Perfetto JSON timeline of "
            "their steps there (\"{rank}\" in PATH: the rank; else .rank<R> before the "
            "extension when there are several ranks); overrides ReducerOptions::timeline_path. "
            "Unset or empty: no timeline."},
    Tunable{"GRADZIP_DEVICE", "",
            "cuda or emulated: where CUDA tensors, streams and NCCL calls run. emulated runs them "
            "on the CPU (kernels/emulated/): a test and development aid that proves the "
            "orchestration, not the CUDA kernels. Unset: cuda, or emulated in a build configured "
            "with GRADZIP_WITH_CUDA=EMULATED (no CUDA toolkit)."},
    Tunable{"GRADZIP_EMULATED_DEVICES", "1",
            "How many devices the emulated device offers (1 to 64)."},
    Tunable{"GRADZIP_EMULATED_DELAY_US", "20",
            "Microseconds each operation queued on an emulated stream waits before it runs, so "
            "that work a caller forgot to wait for is still pending when it looks (0 to 1000000)."},
    Tunable{"GRADZIP_TIMELINE_STEPS", "1:1",
            "COUNT or FIRST:COUNT: the steps the timeline records (from step FIRST, default 1); "
            "overrides ReducerOptions::timeline_first_step / timeline_steps."},
};

}  // namespace

std::span<const Tunable> tunables() noexcept { return kTunables; }

std::optional<double> parse_finite_number(std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

std::optional<std::uint64_t> parse_unsigned_integer(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

const std::string& tunable_value(std::string_view name) {
  static std::mutex mutex;
  static std::map<std::string, std::string, std::less<>> cache;
  std::lock_guard lock(mutex);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  for (const Tunable& tunable : kTunables) {
    if (tunable.name != name) continue;
    const std::string key(name);
    const char* from_env = std::getenv(key.c_str());
    return cache.emplace(key, from_env != nullptr ? std::string(from_env)
                                                  : std::string(tunable.default_value))
        .first->second;
  }
  GZ_THROW(ErrorCode::invalid_argument, "tunable_value: '", name,
           "' is not a GRADZIP_* variable this build knows");
}

}  // namespace gradzip::kernels
