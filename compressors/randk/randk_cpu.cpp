// Host loops of the `randk` codec. Indices are drawn in batches on the stack (Philox words from
// the active ISA's path, then the strata walked without divisions by RandkStrata), then the
// batch's values are gathered or scattered; only the k kept elements of the chunk are touched
// (plus the zero fill of decode).
#include "compressors/randk/randk_cpu.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cpu {
namespace {

// Indices drawn per batch: 2 KiB of stack, enough to keep the gather loads in flight.
constexpr std::size_t kIndexBatch = 256;

void randk_words_scalar(const RandkKey& key, std::uint64_t first, std::size_t count,
                        std::uint64_t* words) noexcept {
  for (std::size_t i = 0; i < count; ++i) words[i] = randk_word(key, first + i);
}

// Calls visit(first, count, indices) for j = first .. first+count-1 covering 0 .. k-1 in order,
// with indices[i] = index_{first+i}. The Philox words (most of the work) come from the active
// ISA's path; the strata walk and the multiply-high stay scalar (AVX-512 has no 64x64->128).
template <typename Visit>
void for_each_index_batch(std::uint64_t n, std::uint64_t k, const RandkKey& key, Visit&& visit) {
  if (k == 0) return;
  const auto draw_words = active_isa() == Isa::avx512 ? avx512::randk_words : randk_words_scalar;
  RandkStrata strata = RandkStrata::at(0, n, k);
  std::uint64_t indices[kIndexBatch];
  for (std::uint64_t first = 0; first < k; first += kIndexBatch) {
    const std::size_t count =
        static_cast<std::size_t>(std::min<std::uint64_t>(kIndexBatch, k - first));
    draw_words(key, first, count, indices);  // the words, replaced in place by their indices
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t start = strata.start;
      const std::uint64_t length = strata.advance();
      indices[i] = randk_pick(indices[i], start, length);
    }
    visit(first, count, indices);
  }
}

// values[first .. first+count) widened to f32 (exact) into `out`.
void load_values(const std::byte* values, DType value_dtype, std::uint64_t first, std::size_t count,
                 float* out) noexcept {
  if (value_dtype == DType::f16) {
    std::uint16_t bits[kIndexBatch];
    std::memcpy(bits, values + first * sizeof *bits, count * sizeof *bits);
    f16_to_f32(bits, out, count);
  } else {
    std::memcpy(out, values + first * sizeof *out, count * sizeof *out);
  }
}

}  // namespace

void randk_indices(std::uint64_t n, std::uint64_t k, const RandkKey& key,
                   std::uint64_t* indices) noexcept {
  for_each_index_batch(n, k, key,
                       [&](std::uint64_t first, std::size_t count, const std::uint64_t* batch) {
                         std::memcpy(indices + first, batch, count * sizeof *batch);
                       });
}

std::vector<std::uint64_t> randk_indices(std::uint64_t n, std::uint64_t k,
                                         const EncodeContext& ctx) {
  std::vector<std::uint64_t> indices(k);
  randk_indices(n, k, randk_key(ctx), indices.data());
  return indices;
}

void randk_gather(ConstTensorView in, std::uint64_t k, const RandkKey& key, DType value_dtype,
                  std::byte* values) noexcept {
  // Each batch is gathered in a tight loop (many cache misses in flight), then converted as a
  // block. Only the k kept input elements are read, so f16/bf16 inputs are widened after the
  // gather rather than in kConvertBlock blocks of the whole input; the widening is exact.
  for_each_index_batch(
      in.count, k, key, [&](std::uint64_t first, std::size_t count, const std::uint64_t* batch) {
        float gathered[kIndexBatch];
        if (in.dtype == DType::f32) {
          const float* data = static_cast<const float*>(in.data);
          for (std::size_t i = 0; i < count; ++i) gathered[i] = data[batch[i]];
        } else {
          const std::uint16_t* data = static_cast<const std::uint16_t*>(in.data);
          std::uint16_t bits[kIndexBatch];
          for (std::size_t i = 0; i < count; ++i) bits[i] = data[batch[i]];
          if (in.dtype == DType::f16) {
            f16_to_f32(bits, gathered, count);
          } else {
            bf16_to_f32(bits, gathered, count);
          }
        }
        if (value_dtype == DType::f16) {
          std::uint16_t bits[kIndexBatch];
          f32_to_f16(gathered, bits, count);
          std::memcpy(values + first * sizeof *bits, bits, count * sizeof *bits);
        } else {
          std::memcpy(values + first * sizeof *gathered, gathered, count * sizeof *gathered);
        }
      });
}

void randk_scatter(const std::byte* values, DType value_dtype, std::uint64_t k, const RandkKey& key,
                   TensorView out) noexcept {
  if (out.count > 0) std::memset(out.data, 0, out.size_bytes());  // +0.0 in every dtype
  for_each_index_batch(out.count, k, key,
                       [&](std::uint64_t first, std::size_t count, const std::uint64_t* batch) {
                         float widened[kIndexBatch];
                         load_values(values, value_dtype, first, count, widened);
                         if (out.dtype == DType::f32) {
                           float* data = static_cast<float*>(out.data);
                           for (std::size_t i = 0; i < count; ++i) data[batch[i]] = widened[i];
                           return;
                         }
                         std::uint16_t bits[kIndexBatch];
                         // A store into a tensor: IEEE, beyond the range to +-Inf.
                         if (out.dtype == DType::f16) {
                           f32_to_f16_ieee(widened, bits, count);
                         } else {
                           f32_to_bf16_ieee(widened, bits, count);
                         }
                         std::uint16_t* data = static_cast<std::uint16_t*>(out.data);
                         for (std::size_t i = 0; i < count; ++i) data[batch[i]] = bits[i];
                       });
}

void randk_scatter_add(const std::byte* values, DType value_dtype, std::uint64_t k,
                       const RandkKey& key, float* acc, std::uint64_t n) noexcept {
  for_each_index_batch(n, k, key,
                       [&](std::uint64_t first, std::size_t count, const std::uint64_t* batch) {
                         float widened[kIndexBatch];
                         load_values(values, value_dtype, first, count, widened);
                         for (std::size_t i = 0; i < count; ++i) acc[batch[i]] += widened[i];
                       });
}

void randk_subtract_from(const std::byte* values, DType value_dtype, std::uint64_t k,
                         const RandkKey& key, float* residual, std::uint64_t n) noexcept {
  for_each_index_batch(n, k, key,
                       [&](std::uint64_t first, std::size_t count, const std::uint64_t* batch) {
                         float widened[kIndexBatch];
                         load_values(values, value_dtype, first, count, widened);
                         for (std::size_t i = 0; i < count; ++i) {
                           float& e = residual[batch[i]];
                           e = finite_or_zero(e - widened[i]);
                         }
                       });
}

}  // namespace gradzip::kernels::cpu
