// Host loops of the `randk` codec: draw the kept indices (randk_math.h), gather the kept
// values on encode, scatter them on decode. Every loop gives exactly the indices of
// randk_index(key, n, k, j) for j = 0 .. k-1.
//
// The kept values are the input values themselves, NOT rescaled by n/k: the compressed
// gradient is a biased (shrunk) estimate, and error feedback (residual e = g + e - D(C(g + e)))
// carries what was dropped into the next steps. An unbiased variant would multiply by n/k and
// blow up the residual's variance instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"
#include "compressors/randk/randk_math.h"

namespace gradzip::kernels::cpu {

// The key a chunk's indices are drawn from.
inline RandkKey randk_key(const EncodeContext& ctx) noexcept {
  return RandkKey{ctx.seed, ctx.step, ctx.tensor_id, ctx.element_offset};
}

// Writes the k indices kept out of a chunk of n elements, strictly increasing, to
// indices[0, k). Preconditions: k <= n, and k >= 1 when n >= 1 (spec.k_for(n) satisfies both).
// Every rank computes the same indices from the same key: what the collectives use to sum
// shared-seed random-k payloads without sending indices.
void randk_indices(std::uint64_t n, std::uint64_t k, const RandkKey& key,
                   std::uint64_t* indices) noexcept;

// The same, allocating: for example
//   const auto kept = randk_indices(n, spec.k_for(n), ctx);
std::vector<std::uint64_t> randk_indices(std::uint64_t n, std::uint64_t k,
                                         const EncodeContext& ctx);

// Encode: value j = element index_j of `in` (f32, f16 or bf16 host memory), written to
// `values` (any alignment) as f32, or as f16 rounded to nearest even when value_dtype is f16.
// f16/bf16 inputs widen exactly to f32 first. NaN and Inf are copied like any value (f16
// values: Inf and values >= 65520 become Inf, NaN stays NaN with the quiet bit set).
// Preconditions as randk_indices with n = in.count; value_dtype is f32 or f16.
void randk_gather(ConstTensorView in, std::uint64_t k, const RandkKey& key, DType value_dtype,
                  std::byte* values) noexcept;

// Decode: `out` = zero everywhere except element index_j = value j, rounded to nearest even
// when out is f16/bf16 (IEEE: beyond the range to +-Inf, as every tensor store). `values` is
// what randk_gather wrote (any alignment).
void randk_scatter(const std::byte* values, DType value_dtype, std::uint64_t k, const RandkKey& key,
                   TensorView out) noexcept;

// acc[index_j] += value j for j < k; the other elements of acc are not touched.
void randk_scatter_add(const std::byte* values, DType value_dtype, std::uint64_t k,
                       const RandkKey& key, float* acc, std::uint64_t n) noexcept;

// residual[index_j] = finite_or_zero(residual[index_j] - value j) for j < k, the other elements
// untouched: error feedback's e = finite_or_zero(c - D(message)) at the kept elements, where D
// is the decode above (+0.0 elsewhere). The device codec's in-place residual update
// (compressors/randk/cuda/randk_kernels.h: randk_subtract_own) runs this on the emulated device.
void randk_subtract_from(const std::byte* values, DType value_dtype, std::uint64_t k,
                         const RandkKey& key, float* residual, std::uint64_t n) noexcept;

// ---- internal: the vector path of the index draw -------------------------------------------
namespace avx512 {
// words[i] = randk_word(key, first + i) for i < count, 8 Philox blocks per AVX-512 vector.
// Needs AVX-512 F; called only when active_isa() is avx512.
void randk_words(const RandkKey& key, std::uint64_t first, std::size_t count,
                 std::uint64_t* words) noexcept;
}  // namespace avx512

}  // namespace gradzip::kernels::cpu
