#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

#include "gradzip/error.h"
#include "kernels/tunables.h"

namespace gradzip::kernels::cpu {
namespace {

std::atomic<int> g_override{-1};

Isa isa_from_environment() {
  const std::string& value = tunable_value("GRADZIP_CPU_ISA");
  if (value == "auto" || value.empty()) return Isa::avx512;
  if (value == "avx512") return Isa::avx512;
  if (value == "avx2") return Isa::avx2;
  if (value == "scalar") return Isa::scalar;
  GZ_THROW(ErrorCode::invalid_argument, "GRADZIP_CPU_ISA='", value,
           "' is not one of: auto, avx512, avx2, scalar");
}

}  // namespace

std::string_view isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

#if defined(__x86_64__) || defined(__i386__)
// F16C from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
static bool cpu_has_f16c() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

Isa detected_isa() noexcept {
  static const Isa detected = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const bool f16c = cpu_has_f16c();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && f16c)
      return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
      return Isa::avx2;
#endif
    return Isa::scalar;
  }();
  return detected;
}

Isa active_isa() noexcept {
  const int forced = g_override.load(std::memory_order_relaxed);
  if (forced >= 0) return std::min(static_cast<Isa>(forced), detected_isa());
  static const Isa from_env = [] {
    try {
      return std::min(isa_from_environment(), detected_isa());
    } catch (const Error& error) {
      // A bad value must not take the job down: say so once and use what the CPU has.
      std::fprintf(stderr, "gradzip: warning: %s; using %s\n", error.what(),
                   std::string(isa_name(detected_isa())).c_str());
      return detected_isa();
    }
  }();
  return from_env;
}

void set_isa_override(Isa isa) noexcept { g_override.store(static_cast<int>(isa)); }
void clear_isa_override() noexcept { g_override.store(-1); }

}  // namespace gradzip::kernels::cpu
