// The CPU twins of the CUDA kernel launch wrappers (kernels/emulated/kernel_twins.h). Each
// twin performs the host-side checks of its .cu function (same conditions, codes and texts, in
// the same order), then queues its device work as one operation on the stream. The operation
// captures everything by value (the host arrays a CUDA launch takes as kernel arguments are
// copied at call time), checks every device range it reads or writes, and computes with the
// CPU codec's loops (kernels/cpu/) and the shared element math.
#include "kernels/emulated/kernel_twins.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "gradzip/tensor_view.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/nonfinite_cpu.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/ef_math.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/twin_support.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::emulated {
namespace {

using cuda::KernelVariant;

// ---- casts and element-wise kernels ---------------------------------------------------------

template <typename In, typename Out>
void queue_cast(const char* op, void (*convert)(const In*, Out*, std::size_t) noexcept,
                const In* d_in, Out* d_out, std::size_t count, void* stream) {
  if (count == 0) return;
  enqueue(stream, op, [op, convert, d_in, d_out, count] {
    require_device_range(d_in, count * sizeof(In), op);
    require_device_range(d_out, count * sizeof(Out), op);
    convert(d_in, d_out, count);
  });
}

// Sub = false: out = a + b; Sub = true: out = finite_or_zero(a - b) (ef_cuda.cu's combine).
template <bool Sub>
void queue_combine(const char* op, const float* a, const float* b, float* out, std::size_t count,
                   void* stream) {
  if (count == 0) return;
  enqueue(stream, op, [op, a, b, out, count] {
    require_device_range(a, count * sizeof(float), op);
    require_device_range(b, count * sizeof(float), op);
    require_device_range(out, count * sizeof(float), op);
    for (std::size_t i = 0; i < count; ++i) {
      // Element i of a and b is read before out[i] is written (out may be a or b).
      const float x = a[i];
      const float y = b[i];
      if constexpr (Sub) {
        out[i] = finite_or_zero(x - y);
      } else {
        out[i] = x + y;
      }
    }
  });
}

// ---- non-finite count ----------------------------------------------------------------------

cuda::DeviceNonfiniteCount count_elements(const void* d_data, std::size_t count, DType dtype,
                                          bool count_beyond, std::uint32_t above) {
  cuda::DeviceNonfiniteCount result;
  if (!count_beyond) {
    const cpu::NonfiniteCount found =
        cpu::count_nonfinite(ConstTensorView{d_data, count, dtype, Device{}}, 0, count);
    result.count = found.count;
    result.first = found.count == 0 ? 0 : found.first;
    return result;
  }
  bool any = false;
  const auto visit = [&](std::size_t i, bool nonfinite, bool beyond) {
    if (nonfinite) {
      if (!any) result.first = i;
      any = true;
      ++result.count;
    }
    result.beyond += beyond ? 1 : 0;
  };
  if (dtype == DType::f32) {
    const auto* bits = static_cast<const std::uint32_t*>(d_data);
    for (std::size_t i = 0; i < count; ++i)
      visit(i, f32_bits_nonfinite(bits[i]), f32_bits_beyond(bits[i], above));
  } else {
    const auto* bits = static_cast<const std::uint16_t*>(d_data);
    const auto above16 = static_cast<std::uint16_t>(above);
    if (dtype == DType::bf16) {
      for (std::size_t i = 0; i < count; ++i)
        visit(i, bf16_bits_nonfinite(bits[i]), bf16_bits_beyond(bits[i], above16));
    } else {
      for (std::size_t i = 0; i < count; ++i)
        visit(i, f16_bits_nonfinite(bits[i]), f16_bits_beyond(bits[i], above16));
    }
  }
  return result;
}

// nonfinite_cuda.cu's count_on_device: one queued operation, then one (counted) host wait for
// its result, which follows every earlier operation of the stream as the .cu's
// cudaStreamSynchronize does.
cuda::DeviceNonfiniteCount count_on_device(const void* d_data, std::size_t count, DType dtype,
                                           bool count_beyond, std::uint32_t above, void* stream) {
  if (count == 0) return {};
  const char* const op = count_beyond ? "cuda.count_nonfinite_and_beyond" : "cuda.count_nonfinite";
  GZ_REQUIRE(d_data != nullptr, ErrorCode::invalid_argument, op, ": null data for ", count,
             " elements");
  // Shared by the operation's copies: if the emulator drops the operation unrun, the last copy
  // destroys the promise and the wait below ends with broken_promise.
  auto promise = std::make_shared<std::promise<cuda::DeviceNonfiniteCount>>();
  std::future<cuda::DeviceNonfiniteCount> result = promise->get_future();
  enqueue(stream, op, [promise, op, d_data, count, dtype, count_beyond, above] {
    try {
      require_device_range(d_data, count * dtype_size(dtype), op);
      promise->set_value(count_elements(d_data, count, dtype, count_beyond, above));
    } catch (...) {
      promise->set_exception(std::current_exception());
      throw;  // a launch failure for the emulator too (its sticky error)
    }
  });
  result.wait();
  cuda::count_polled_wait(op);
  try {
    return result.get();
  } catch (const std::future_error&) {
    GZ_THROW(ErrorCode::unsupported, op, ": reading the count failed: the operation did not run");
  } catch (const std::exception& failure) {
    GZ_THROW(ErrorCode::unsupported, op, ": reading the count failed: ", failure.what());
  }
}

// ---- sparse --------------------------------------------------------------------------------

constexpr std::uint64_t kMaxNarrowCount = std::uint64_t{1} << 32;

void check_sparse_payload(const char* op, std::size_t r, const std::byte* d_payload,
                          std::uint64_t m, bool wide, std::uint64_t n) {
  GZ_REQUIRE(wide || n <= kMaxNarrowCount, ErrorCode::malformed_message, op,
             ": 32-bit indices cannot address ", n, " elements");
  GZ_REQUIRE(m <= n, ErrorCode::malformed_message, op, ": payload ", r, " has ", m,
             " entries for ", n, " elements");
  GZ_REQUIRE(m == 0 || d_payload != nullptr, ErrorCode::invalid_argument, op, ": payload ", r,
             " of ", m, " entries is null");
}

std::uint64_t sparse_index(const std::byte* payload, bool wide, std::uint64_t j) {
  return wide ? load_u64(payload + j * 8) : load_u32(payload + j * 4);
}

float sparse_value(const std::byte* payload, std::uint64_t m, bool wide, bool half,
                   std::uint64_t j) {
  const std::byte* values = payload + m * (wide ? 8 : 4);
  return half ? f16_bits_to_f32(load_u16(values + j * 2)) : bits_float(load_u32(values + j * 4));
}

// sparse_cuda.cu's validate_kernel over one payload: the kSparse* bits it ORs into the status.
int sparse_validate(const std::byte* payload, std::uint64_t m, bool wide, std::uint64_t n) {
  int bad = 0;
  std::uint64_t previous = 0;
  for (std::uint64_t j = 0; j < m; ++j) {
    const std::uint64_t index = sparse_index(payload, wide, j);
    if (index >= n) bad |= cuda::kSparseIndexOutOfRange;
    if (j > 0 && index <= previous) bad |= cuda::kSparseIndexNotIncreasing;
    previous = index;
  }
  return bad;
}

}  // namespace

// ---- kernels/cuda/cast_cuda.h ----------------------------------------------------------------

void f32_to_f16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  queue_cast<float, std::uint16_t>("cuda.f32_to_f16", cpu::f32_to_f16, d_in, d_out, count, stream);
}
void f32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  queue_cast<float, std::uint16_t>("cuda.f32_to_bf16", cpu::f32_to_bf16, d_in, d_out, count,
                                   stream);
}
void f32_to_f16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  queue_cast<float, std::uint16_t>("cuda.f32_to_f16_ieee", cpu::f32_to_f16_ieee, d_in, d_out,
                                   count, stream);
}
void f32_to_bf16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  queue_cast<float, std::uint16_t>("cuda.f32_to_bf16_ieee", cpu::f32_to_bf16_ieee, d_in, d_out,
                                   count, stream);
}
void f16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  queue_cast<std::uint16_t, float>("cuda.f16_to_f32", cpu::f16_to_f32, d_in, d_out, count, stream);
}
void bf16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  queue_cast<std::uint16_t, float>("cuda.bf16_to_f32", cpu::bf16_to_f32, d_in, d_out, count,
                                   stream);
}

int device_count(const char** reason) noexcept {
  const int count = emulated::device_count();
  if (reason != nullptr)
    *reason = count > 0 ? nullptr : "no emulated CUDA device (GRADZIP_EMULATED_DEVICES is 0)";
  return count > 0 ? count : 0;
}

// ---- kernels/cuda/ef_cuda.h ------------------------------------------------------------------

void ef_compensate(const float* d_grad, const float* d_residual, float* d_out, std::size_t count,
                   void* stream) {
  queue_combine<false>("cuda.ef_compensate", d_grad, d_residual, d_out, count, stream);
}

void ef_update(const float* d_compensated, const float* d_decoded, float* d_residual,
               std::size_t count, void* stream) {
  queue_combine<true>("cuda.ef_update", d_compensated, d_decoded, d_residual, count, stream);
}

void ef_compensate_flagging(const float* d_grad, const float* d_residual, float* d_out,
                            std::size_t count, int* d_flag, void* stream) {
  constexpr const char* op = "cuda.ef_compensate_flagging";
  if (count == 0) return;
  GZ_REQUIRE(d_flag != nullptr, ErrorCode::invalid_argument, op, ": null flag");
  enqueue(stream, op, [d_grad, d_residual, d_out, count, d_flag] {
    require_device_range(d_grad, count * sizeof(float), op);
    require_device_range(d_residual, count * sizeof(float), op);
    require_device_range(d_out, count * sizeof(float), op);
    require_device_accessible_range(d_flag, sizeof(int), "cuda.ef_compensate_flagging flag");
    bool any_non_finite = false;
    for (std::size_t i = 0; i < count; ++i) {
      const float sum = d_grad[i] + d_residual[i];
      any_non_finite |= f32_bits_nonfinite(float_bits(sum));
      d_out[i] = sum;
    }
    if (any_non_finite) *d_flag = 1;
  });
}

void ef_zero_nonfinite_if_flagged(float* d_residual, std::size_t count, const int* d_flag,
                                  void* stream) {
  constexpr const char* op = "cuda.ef_zero_nonfinite_if_flagged";
  if (count == 0) return;
  GZ_REQUIRE(d_flag != nullptr, ErrorCode::invalid_argument, op, ": null flag");
  enqueue(stream, op, [d_residual, count, d_flag] {
    require_device_accessible_range(d_flag, sizeof(int), "cuda.ef_zero_nonfinite_if_flagged flag");
    if (*d_flag == 0) return;
    require_device_range(d_residual, count * sizeof(float), op);
    for (std::size_t i = 0; i < count; ++i) d_residual[i] = finite_or_zero(d_residual[i]);
  });
}

void ef_cast_fused(const float* d_grad, float* d_residual, std::uint16_t* d_half_out, bool bf16,
                   std::size_t count, void* stream) {
  if (count == 0) return;
  const char* const op = bf16 ? "cuda.ef_cast_fused(bf16)" : "cuda.ef_cast_fused(fp16)";
  enqueue(stream, op, [op, d_grad, d_residual, d_half_out, bf16, count] {
    require_device_range(d_grad, count * sizeof(float), op);
    require_device_range(d_residual, count * sizeof(float), op);
    require_device_range(d_half_out, count * sizeof(std::uint16_t), op);
    for (std::size_t i = 0; i < count; ++i) {
      float residual = d_residual[i];
      d_half_out[i] = ef_cast_element(d_grad[i], residual, bf16);
      d_residual[i] = residual;
    }
  });
}

// ---- kernels/cuda/nonfinite_cuda.h -----------------------------------------------------------

cuda::DeviceNonfiniteCount count_nonfinite(const void* d_data, std::size_t count, DType dtype,
                                           void* stream) {
  return count_on_device(d_data, count, dtype, false, 0, stream);
}

cuda::DeviceNonfiniteCount count_nonfinite_and_beyond(const void* d_data, std::size_t count,
                                                      DType dtype, std::uint32_t above_bits,
                                                      void* stream) {
  return count_on_device(d_data, count, dtype, true, above_bits, stream);
}

void queue_count_nonfinite(const void* d_data, std::size_t count, DType dtype, bool count_beyond,
                           std::uint32_t above_bits, std::uint64_t* d_result, void* stream) {
  constexpr const char* kOp = "cuda.queue_count_nonfinite";
  GZ_REQUIRE(d_result != nullptr && (d_data != nullptr || count == 0), ErrorCode::invalid_argument,
             kOp, ": null pointer for ", count, " elements");
  enqueue(stream, kOp, [d_data, count, dtype, count_beyond, above_bits, d_result] {
    require_device_range(d_result, 3 * sizeof(std::uint64_t), "cuda.queue_count_nonfinite result");
    if (count > 0) require_device_range(d_data, count * dtype_size(dtype), kOp);
    const cuda::DeviceNonfiniteCount found =
        count == 0 ? cuda::DeviceNonfiniteCount{}
                   : count_elements(d_data, count, dtype, count_beyond, above_bits);
    d_result[0] = found.count;
    d_result[1] = found.count == 0 ? ~std::uint64_t{0} : found.first;
    d_result[2] = found.beyond;
  });
}

// ---- kernels/cuda/scale_cuda.h ---------------------------------------------------------------

void divide_f32(float* d_data, std::size_t count, float divisor, void* stream) {
  if (count == 0) return;
  GZ_REQUIRE(d_data != nullptr, ErrorCode::invalid_argument, "cuda.divide_f32: null data for ",
             count, " elements");
  enqueue(stream, "cuda.divide_f32", [d_data, count, divisor] {
    require_device_range(d_data, count * sizeof(float), "cuda.divide_f32 data");
    for (std::size_t i = 0; i < count; ++i) d_data[i] = d_data[i] / divisor;
  });
}

// ---- kernels/cuda/small_bytes_cuda.h ---------------------------------------------------------

void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream) {
  constexpr const char* kOp = "cuda.write_small_bytes";
  if (count == 0) return;
  GZ_REQUIRE(count <= cuda::kSmallBytesMax, ErrorCode::invalid_argument, kOp, ": ", count,
             " bytes (at most ", cuda::kSmallBytesMax, ")");
  GZ_REQUIRE(d_out != nullptr && host != nullptr, ErrorCode::invalid_argument, kOp,
             ": null pointer for ", count, " bytes");
  // The bytes as of the call (a kernel argument on the GPU): the caller may reuse `host` at once.
  std::array<std::byte, cuda::kSmallBytesMax> bytes{};
  std::memcpy(bytes.data(), host, count);
  enqueue(stream, kOp, [d_out, bytes, count] {
    require_device_range(d_out, count, "cuda.write_small_bytes target");
    std::memcpy(d_out, bytes.data(), count);
  });
}

void compare_small_bytes(const std::byte* d_bytes, const std::byte* expected, std::size_t count,
                         int mismatch, int* d_status, void* stream) {
  constexpr const char* kOp = "cuda.compare_small_bytes";
  GZ_REQUIRE(count <= cuda::kSmallBytesMax, ErrorCode::invalid_argument, kOp, ": ", count,
             " bytes (at most ", cuda::kSmallBytesMax, ")");
  GZ_REQUIRE(d_status != nullptr && mismatch != 0 &&
                 (count == 0 || (d_bytes != nullptr && expected != nullptr)),
             ErrorCode::invalid_argument, kOp, ": null pointer or zero mismatch code for ", count,
             " bytes");
  std::array<std::byte, cuda::kSmallBytesMax> bytes{};
  if (count > 0) std::memcpy(bytes.data(), expected, count);
  enqueue(stream, kOp, [d_bytes, bytes, count, mismatch, d_status] {
    require_device_accessible_range(d_status, sizeof(int), "cuda.compare_small_bytes status");
    if (count > 0) require_device_range(d_bytes, count, "cuda.compare_small_bytes bytes");
    store_status(d_status, count > 0 && std::memcmp(d_bytes, bytes.data(), count) != 0 ? mismatch : 0);
  });
}

void write_rank_flags(const cuda::FlagWords* groups, std::size_t group_count, float* d_flags,
                      std::size_t total, std::size_t first, void* stream) {
  constexpr const char* kOp = "cuda.write_rank_flags";
  GZ_REQUIRE(group_count <= cuda::kMaxFlagGroups && first <= total && group_count <= total - first,
             ErrorCode::invalid_argument, kOp, ": ", group_count, " flags at ", first, " of ",
             total, " (at most ", cuda::kMaxFlagGroups, ", inside the array)");
  GZ_REQUIRE(d_flags != nullptr && (group_count == 0 || groups != nullptr),
             ErrorCode::invalid_argument, kOp, ": null pointer");
  std::vector<cuda::FlagWords> taken(groups, groups + group_count);  // as of the call
  for (const cuda::FlagWords& group : taken)
    GZ_REQUIRE(group.count == 0 || group.words != nullptr, ErrorCode::invalid_argument, kOp,
               ": null pointer for ", group.count, " words");
  if (total == 0) return;
  enqueue(stream, kOp, [taken = std::move(taken), d_flags, total, first] {
    require_device_range(d_flags, total * sizeof(float), "cuda.write_rank_flags flags");
    std::fill_n(d_flags, total, 0.0f);
    for (std::size_t k = 0; k < taken.size(); ++k) {
      const cuda::FlagWords& group = taken[k];
      if (group.count > 0)
        require_device_accessible_range(group.words, group.count * sizeof(int),
                                        "cuda.write_rank_flags words");
      d_flags[first + k] = std::any_of(group.words, group.words + group.count,
                                       [](int word) { return word != 0; })
                               ? 1.0f
                               : 0.0f;
    }
  });
}

void words_from_flags(const float* d_flags, std::size_t count, int* d_words, void* stream) {
  constexpr const char* kOp = "cuda.words_from_flags";
  if (count == 0) return;
  GZ_REQUIRE(d_flags != nullptr && d_words != nullptr, ErrorCode::invalid_argument, kOp,
             ": null pointer for ", count, " flags");
  enqueue(stream, kOp, [d_flags, count, d_words] {
    require_device_range(d_flags, count * sizeof(float), "cuda.words_from_flags flags");
    require_device_accessible_range(d_words, count * sizeof(int), "cuda.words_from_flags words");
    for (std::size_t i = 0; i < count; ++i) d_words[i] = d_flags[i] != 0.0f ? 1 : 0;
  });
}

// ---- kernels/cuda/sparse_cuda.h --------------------------------------------------------------

void sparse_decode_add(const std::byte* const* d_payloads, const std::uint64_t* entries,
                       std::size_t payload_count, bool wide_indices, bool half_values,
                       std::size_t n, float* d_acc, int* d_status, void* stream) {
  constexpr const char* op = "cuda.sparse_decode_add";
  GZ_REQUIRE(payload_count == 0 || (d_payloads != nullptr && entries != nullptr),
             ErrorCode::invalid_argument, op, ": ", payload_count,
             " payloads but a null pointer or entry array");
  bool any_entries = false;
  for (std::size_t r = 0; r < payload_count; ++r) {
    check_sparse_payload(op, r, d_payloads[r], entries[r], wide_indices, n);
    any_entries = any_entries || entries[r] > 0;
  }
  GZ_REQUIRE(!any_entries || d_acc != nullptr, ErrorCode::invalid_argument, op,
             ": d_acc is null");
  require_status(op, d_status);
  // The host arrays, as of the call (the GPU launches take them as kernel arguments).
  std::vector<std::pair<const std::byte*, std::uint64_t>> payloads;
  payloads.reserve(payload_count);
  for (std::size_t r = 0; r < payload_count; ++r)
    if (entries[r] > 0) payloads.emplace_back(d_payloads[r], entries[r]);
  enqueue(stream, op, [payloads = std::move(payloads), wide_indices, half_values, n, d_acc,
                       d_status] {
    require_device_accessible_range(d_status, sizeof(int), "cuda.sparse_decode_add status");
    store_status(d_status, 0);
    int status = 0;
    for (const auto& [payload, m] : payloads) {
      require_device_range(payload, cuda::sparse_payload_bytes(m, wide_indices, half_values),
                           "cuda.sparse_decode_add payload");
      status |= sparse_validate(payload, m, wide_indices, n);
    }
    store_status(d_status, status);
    if (status != 0 || payloads.empty()) return;
    require_device_range(d_acc, n * sizeof(float), "cuda.sparse_decode_add accumulator");
    for (const auto& [payload, m] : payloads) {
      for (std::uint64_t j = 0; j < m; ++j) {
        d_acc[sparse_index(payload, wide_indices, j)] +=
            sparse_value(payload, m, wide_indices, half_values, j);
      }
    }
  });
}

void sparse_decode(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                   bool half_values, std::size_t n, float* d_out, int* d_status, void* stream) {
  constexpr const char* op = "cuda.sparse_decode";
  check_sparse_payload(op, 0, d_payload, entries, wide_indices, n);
  GZ_REQUIRE(n == 0 || d_out != nullptr, ErrorCode::invalid_argument, op, ": d_out is null");
  require_status(op, d_status);
  enqueue(stream, op, [d_payload, entries, wide_indices, half_values, n, d_out, d_status] {
    require_device_accessible_range(d_status, sizeof(int), "cuda.sparse_decode status");
    store_status(d_status, 0);
    int status = 0;
    if (entries > 0) {
      require_device_range(d_payload,
                           cuda::sparse_payload_bytes(entries, wide_indices, half_values),
                           "cuda.sparse_decode payload");
      status = sparse_validate(d_payload, entries, wide_indices, n);
    }
    store_status(d_status, status);
    if (n == 0 || status != 0) return;
    require_device_range(d_out, n * sizeof(float), "cuda.sparse_decode output");
    std::fill_n(d_out, n, 0.0f);
    for (std::uint64_t j = 0; j < entries; ++j) {
      d_out[sparse_index(d_payload, wide_indices, j)] =
          sparse_value(d_payload, entries, wide_indices, half_values, j);
    }
  });
}

void sparse_subtract_own(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                         bool half_values, std::size_t n, float* d_residual, void* stream) {
  constexpr const char* op = "cuda.sparse_subtract_own";
  check_sparse_payload(op, 0, d_payload, entries, wide_indices, n);
  if (entries == 0) return;
  GZ_REQUIRE(d_residual != nullptr, ErrorCode::invalid_argument, op, ": d_residual is null");
  enqueue(stream, op, [d_payload, entries, wide_indices, half_values, n, d_residual] {
    require_device_range(d_payload, cuda::sparse_payload_bytes(entries, wide_indices, half_values),
                         "cuda.sparse_subtract_own payload");
    require_device_range(d_residual, n * sizeof(float), "cuda.sparse_subtract_own residual");
    for (std::uint64_t j = 0; j < entries; ++j) {
      const std::uint64_t index = sparse_index(d_payload, wide_indices, j);
      if (index >= n) continue;
      d_residual[index] = finite_or_zero(
          d_residual[index] - sparse_value(d_payload, entries, wide_indices, half_values, j));
    }
  });
}

}  // namespace gradzip::kernels::emulated
