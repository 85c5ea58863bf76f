// The CPU twins of top-k's kernels (cuda/topk_kernels.h): the CPU codec's selection
// (topk_cpu.h) written as the payload, queued as one operation on the emulated device's stream,
// with the wrappers' host-side refusals.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "compressors/topk/cuda/topk_kernels.h"
#include "compressors/topk/cuda/topk_plan.h"
#include "compressors/topk/topk_cpu.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/twin_support.h"

namespace gradzip::kernels::emulated {
namespace {

// topk_kernels.cu's plan_for, without CUB: the reference variant's scan storage is planned at 0
// bytes (one alignment unit), the twin scanning nothing.
cuda::TopkPlan twin_topk_plan(std::uint64_t n, std::uint64_t k,
                              const cuda::TopkCudaOptions& options) {
  GZ_REQUIRE(k <= n, ErrorCode::invalid_argument, "cuda.topk_select: k = ", k, " exceeds the ",
             n, " elements");
  return cuda::make_topk_plan(n, k, options.approx, options.half_values, options.variant, 0);
}

// The CPU codec's selection (topk_codec.cpp's select_and_write) written as the payload:
// m indices, then m values (f32 bits, or f16 bits rounded to nearest even). Returns m.
template <typename IndexT>
std::uint64_t topk_write_payload(const float* d_in, std::uint64_t n, std::uint64_t k,
                                 const cuda::TopkCudaOptions& options, std::byte* d_payload) {
  std::vector<IndexT> indices(static_cast<std::size_t>(k));
  std::vector<float> values(static_cast<std::size_t>(k));
  const cpu::TopkOptions cpu_options{options.approx, options.seed, options.step, options.tensor_id};
  const std::size_t m = cpu::topk_select<IndexT>(f32_view(d_in, static_cast<std::size_t>(n)),
                                                 static_cast<std::size_t>(k), cpu_options,
                                                 indices.data(), values.data())
                            .count;
  require_device_range(d_payload, cuda::topk_payload_bytes(n, m, options.half_values),
                       "cuda.topk_select payload");
  std::byte* const value_area = d_payload + m * sizeof(IndexT);
  if (m > 0) std::memcpy(d_payload, indices.data(), m * sizeof(IndexT));
  for (std::size_t j = 0; j < m; ++j) {
    if (options.half_values) {
      const std::uint16_t bits = f32_to_f16_bits(values[j]);
      std::memcpy(value_area + j * sizeof bits, &bits, sizeof bits);
    } else {
      std::memcpy(value_area + j * sizeof(float), &values[j], sizeof(float));
    }
  }
  return m;
}

}  // namespace

std::size_t topk_workspace_bytes(std::uint64_t n, std::uint64_t k,
                                 const cuda::TopkCudaOptions& options) {
  return twin_topk_plan(n, k, options).workspace_bytes;
}

void topk_select(const float* d_in, std::uint64_t n, std::uint64_t k,
                 const cuda::TopkCudaOptions& options, std::byte* d_payload,
                 std::uint64_t* d_entries_out, void* d_workspace, std::size_t* workspace_bytes,
                 void* stream) {
  GZ_REQUIRE(workspace_bytes != nullptr, ErrorCode::invalid_argument,
             "cuda.topk_select: workspace_bytes is null");
  const cuda::TopkPlan plan = twin_topk_plan(n, k, options);
  if (d_workspace == nullptr) {
    *workspace_bytes = plan.workspace_bytes;
    return;
  }
  GZ_REQUIRE(*workspace_bytes >= plan.workspace_bytes, ErrorCode::invalid_argument,
             "cuda.topk_select: workspace of ", *workspace_bytes, " bytes, n = ", n, ", k = ", k,
             " needs ", plan.workspace_bytes);
  GZ_REQUIRE(reinterpret_cast<std::uintptr_t>(d_workspace) % cuda::kTopkWorkspaceAlign == 0,
             ErrorCode::invalid_argument, "cuda.topk_select: workspace not ",
             cuda::kTopkWorkspaceAlign, "-byte aligned");
  GZ_REQUIRE(k == 0 || (d_in != nullptr && d_payload != nullptr), ErrorCode::invalid_argument,
             "cuda.topk_select: null input or payload for n = ", n, ", k = ", k);
  if (plan.kind == cuda::TopkPlanKind::empty && d_entries_out == nullptr) return;  // no launch
  // The GPU uses the workspace on the select path only (state, histograms, candidates).
  const std::size_t workspace_used =
      plan.kind == cuda::TopkPlanKind::select ? plan.workspace_bytes : 0;
  enqueue(stream, "cuda.topk_select",
          [d_in, n, k, options, d_payload, d_entries_out, d_workspace, workspace_used] {
    if (d_entries_out != nullptr)
      require_device_range(d_entries_out, sizeof(std::uint64_t), "cuda.topk_select entry count");
    require_device_range(d_workspace, workspace_used, "cuda.topk_select workspace");
    std::uint64_t m = 0;
    if (k > 0) {
      require_device_range(d_in, static_cast<std::size_t>(n) * sizeof(float),
                           "cuda.topk_select input");
      m = cuda::topk_index_bytes(n) == sizeof(std::uint32_t)
              ? topk_write_payload<std::uint32_t>(d_in, n, k, options, d_payload)
              : topk_write_payload<std::uint64_t>(d_in, n, k, options, d_payload);
    }
    if (d_entries_out != nullptr) *d_entries_out = m;
  });
}

}  // namespace gradzip::kernels::emulated
