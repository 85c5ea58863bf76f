// Which vector path the CPU kernels take. Every path gives the same bits as the scalar one;
// the choice only changes speed.
#pragma once

#include <string_view>

namespace gradzip::kernels::cpu {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

std::string_view isa_name(Isa isa) noexcept;

// Best ISA this CPU supports: avx512 needs AVX-512 F/BW/VL/DQ; avx2 needs AVX2, FMA and F16C.
Isa detected_isa() noexcept;

// The ISA kernels use now: GRADZIP_CPU_ISA (auto|avx512|avx2|scalar) or a test override,
// capped at what the CPU supports.
Isa active_isa() noexcept;

// For tests and benchmarks: force an ISA for this process (capped at the detected one).
// Not thread-safe against kernels running concurrently.
void set_isa_override(Isa isa) noexcept;
void clear_isa_override() noexcept;

}  // namespace gradzip::kernels::cpu
