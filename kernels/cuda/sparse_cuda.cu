// Sparse payload kernels: a validation pass per payload (grid-stride over its entries, OR-ing
// kSparse* bits into *d_status), then a scatter pass per payload, in order on the stream, that
// returns at once when *d_status != 0. Indices within one validated payload are distinct, so a
// payload's scatter needs no atomics; payloads never run concurrently (one stream), so the
// f32 sums per element follow the payload order. Payloads may sit at any alignment: typed
// loads when the payload start is aligned to the index width (then the values area is aligned
// too), byte-wise little-endian loads otherwise (chosen on the host).
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sparse_cuda.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh

constexpr std::uint64_t kMaxNarrowCount = std::uint64_t{1} << 32;

template <typename Index, bool Aligned>
__global__ void validate_kernel(const std::byte* d_payload, std::uint64_t m, std::uint64_t n,
                                int* d_status) {
  for (std::uint64_t j = global_thread(); j < m; j += grid_threads()) {
    const std::uint64_t index = load_word<Index, Aligned>(d_payload, j);
    int bad = 0;
    if (index >= n) bad |= kSparseIndexOutOfRange;
    if (j > 0 && index <= std::uint64_t{load_word<Index, Aligned>(d_payload, j - 1)})
      bad |= kSparseIndexNotIncreasing;
    if (bad != 0) atomicOr(d_status, bad);
  }
}

// Add = true: d_out[index_j] += value_j; false: d_out[index_j] = value_j.
template <typename Index, bool Half, bool Aligned, bool Add>
__global__ void scatter_kernel(const std::byte* d_payload, std::uint64_t m, const int* d_status,
                               float* d_out) {
  if (*d_status != 0) return;
  const std::byte* values = d_payload + m * sizeof(Index);
  for (std::uint64_t j = global_thread(); j < m; j += grid_threads()) {
    const std::uint64_t index = load_word<Index, Aligned>(d_payload, j);
    float value;
    if constexpr (Half) {
      value = f16_bits_to_f32(load_word<std::uint16_t, Aligned>(values, j));
    } else {
      value = bits_float(load_word<std::uint32_t, Aligned>(values, j));
    }
    if constexpr (Add) {
      d_out[index] += value;
    } else {
      d_out[index] = value;
    }
  }
}

// d_residual[index_j] = finite_or_zero(d_residual[index_j] - value_j); indices >= n skipped.
template <typename Index, bool Half, bool Aligned>
__global__ void subtract_own_kernel(const std::byte* d_payload, std::uint64_t m, std::uint64_t n,
                                    float* d_residual) {
  const std::byte* values = d_payload + m * sizeof(Index);
  for (std::uint64_t j = global_thread(); j < m; j += grid_threads()) {
    const std::uint64_t index = load_word<Index, Aligned>(d_payload, j);
    if (index >= n) continue;
    float value;
    if constexpr (Half) {
      value = f16_bits_to_f32(load_word<std::uint16_t, Aligned>(values, j));
    } else {
      value = bits_float(load_word<std::uint32_t, Aligned>(values, j));
    }
    d_residual[index] = finite_or_zero(d_residual[index] - value);
  }
}

template <typename Index, bool Half>
void launch_subtract_own(const std::byte* d_payload, std::uint64_t m, std::uint64_t n,
                         float* d_residual, cudaStream_t stream) {
  if (aligned_to(d_payload, sizeof(Index))) {
    subtract_own_kernel<Index, Half, true>
        <<<grid_for(m), kThreads, 0, stream>>>(d_payload, m, n, d_residual);
  } else {
    subtract_own_kernel<Index, Half, false>
        <<<grid_for(m), kThreads, 0, stream>>>(d_payload, m, n, d_residual);
  }
}

__global__ void zero_kernel(float* d_out, std::uint64_t n, const int* d_status) {
  if (*d_status != 0) return;
  for (std::uint64_t i = global_thread(); i < n; i += grid_threads())
    d_out[i] = 0.0f;
}

template <typename Index>
void launch_validate(const std::byte* d_payload, std::uint64_t m, std::uint64_t n, int* d_status,
                     cudaStream_t stream) {
  if (aligned_to(d_payload, sizeof(Index))) {
    validate_kernel<Index, true><<<grid_for(m), kThreads, 0, stream>>>(d_payload, m, n, d_status);
  } else {
    validate_kernel<Index, false><<<grid_for(m), kThreads, 0, stream>>>(d_payload, m, n, d_status);
  }
}

template <typename Index, bool Half, bool Add>
void launch_scatter(const std::byte* d_payload, std::uint64_t m, const int* d_status, float* d_out,
                    cudaStream_t stream) {
  if (aligned_to(d_payload, sizeof(Index))) {
    scatter_kernel<Index, Half, true, Add>
        <<<grid_for(m), kThreads, 0, stream>>>(d_payload, m, d_status, d_out);
  } else {
    scatter_kernel<Index, Half, false, Add>
        <<<grid_for(m), kThreads, 0, stream>>>(d_payload, m, d_status, d_out);
  }
}

void validate(const std::byte* d_payload, std::uint64_t m, bool wide, std::uint64_t n,
              int* d_status, cudaStream_t stream, const char* op) {
  if (wide) launch_validate<std::uint64_t>(d_payload, m, n, d_status, stream);
  else launch_validate<std::uint32_t>(d_payload, m, n, d_status, stream);
  check_launch(op, m, "entries");
}

template <bool Add>
void scatter(const std::byte* d_payload, std::uint64_t m, bool wide, bool half,
             const int* d_status, float* d_out, cudaStream_t stream, const char* op) {
  if (wide) {
    if (half) launch_scatter<std::uint64_t, true, Add>(d_payload, m, d_status, d_out, stream);
    else launch_scatter<std::uint64_t, false, Add>(d_payload, m, d_status, d_out, stream);
  } else {
    if (half) launch_scatter<std::uint32_t, true, Add>(d_payload, m, d_status, d_out, stream);
    else launch_scatter<std::uint32_t, false, Add>(d_payload, m, d_status, d_out, stream);
  }
  check_launch(op, m, "entries");
}

// The host-side checks of one payload's header-derived sizes (nothing launched yet).
void check_payload(const char* op, std::size_t r, const std::byte* d_payload, std::uint64_t m,
                   bool wide, std::uint64_t n) {
  GZ_REQUIRE(wide || n <= kMaxNarrowCount, ErrorCode::malformed_message, op,
             ": 32-bit indices cannot address ", n, " elements");
  GZ_REQUIRE(m <= n, ErrorCode::malformed_message, op, ": payload ", r, " has ", m,
             " entries for ", n, " elements");
  GZ_REQUIRE(m == 0 || d_payload != nullptr, ErrorCode::invalid_argument, op, ": payload ", r,
             " of ", m, " entries is null");
}

}  // namespace

void sparse_decode_add(const std::byte* const* d_payloads, const std::uint64_t* entries,
                       std::size_t payload_count, bool wide_indices, bool half_values,
                       std::size_t n, float* d_acc, int* d_status, void* stream) {
  if (emulated::active())
    return emulated::sparse_decode_add(d_payloads, entries, payload_count, wide_indices,
                                       half_values, n, d_acc, d_status, stream);
  constexpr const char* op = "cuda.sparse_decode_add";
  GZ_REQUIRE(payload_count == 0 || (d_payloads != nullptr && entries != nullptr),
             ErrorCode::invalid_argument, op, ": ", payload_count,
             " payloads but a null pointer or entry array");
  bool any_entries = false;
  for (std::size_t r = 0; r < payload_count; ++r) {
    check_payload(op, r, d_payloads[r], entries[r], wide_indices, n);
    any_entries = any_entries || entries[r] > 0;
  }
  GZ_REQUIRE(!any_entries || d_acc != nullptr, ErrorCode::invalid_argument, op,
             ": d_acc is null");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  reset_decode_status(op, d_status, cuda_stream);
  for (std::size_t r = 0; r < payload_count; ++r) {
    if (entries[r] > 0) validate(d_payloads[r], entries[r], wide_indices, n, d_status, cuda_stream, op);
  }
  for (std::size_t r = 0; r < payload_count; ++r) {
    if (entries[r] > 0)
      scatter<true>(d_payloads[r], entries[r], wide_indices, half_values, d_status, d_acc,
                    cuda_stream, op);
  }
}

void sparse_decode(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                   bool half_values, std::size_t n, float* d_out, int* d_status, void* stream) {
  if (emulated::active())
    return emulated::sparse_decode(d_payload, entries, wide_indices, half_values, n, d_out,
                                   d_status, stream);
  constexpr const char* op = "cuda.sparse_decode";
  check_payload(op, 0, d_payload, entries, wide_indices, n);
  GZ_REQUIRE(n == 0 || d_out != nullptr, ErrorCode::invalid_argument, op, ": d_out is null");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  reset_decode_status(op, d_status, cuda_stream);
  if (entries > 0) validate(d_payload, entries, wide_indices, n, d_status, cuda_stream, op);
  if (n == 0) return;
  zero_kernel<<<grid_for(n), kThreads, 0, cuda_stream>>>(d_out, n, d_status);
  check_launch(op, n, "entries");
  if (entries > 0)
    scatter<false>(d_payload, entries, wide_indices, half_values, d_status, d_out, cuda_stream, op);
}

void sparse_subtract_own(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                         bool half_values, std::size_t n, float* d_residual, void* stream) {
  if (emulated::active())
    return emulated::sparse_subtract_own(d_payload, entries, wide_indices, half_values, n,
                                         d_residual, stream);
  constexpr const char* op = "cuda.sparse_subtract_own";
  check_payload(op, 0, d_payload, entries, wide_indices, n);
  if (entries == 0) return;
  GZ_REQUIRE(d_residual != nullptr, ErrorCode::invalid_argument, op, ": d_residual is null");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (wide_indices) {
    if (half_values) launch_subtract_own<std::uint64_t, true>(d_payload, entries, n, d_residual, cuda_stream);
    else launch_subtract_own<std::uint64_t, false>(d_payload, entries, n, d_residual, cuda_stream);
  } else {
    if (half_values) launch_subtract_own<std::uint32_t, true>(d_payload, entries, n, d_residual, cuda_stream);
    else launch_subtract_own<std::uint32_t, false>(d_payload, entries, n, d_residual, cuda_stream);
  }
  check_launch(op, entries, "entries");
}

}  // namespace gradzip::kernels::cuda
