// Device side of the `topk` encoder (compressors/topk/topk_codec.cpp): selects the k elements of
// largest magnitude (exact) or the DGC-style approximation (approx) of an f32 tensor in device memory
// and writes the message payload, byte for byte what the CPU codec writes for the same input,
// k, spec and EncodeContext:
//   offset 0        m indices, u32 (u64 when n > 2^32), strictly increasing
//   offset m * iw   m values, f32 bits (bit-exact, NaN payloads kept) or f16 bits (RNE,
//                   kernels/cast_math.h) when half_values
// Exact: m == k, the k largest |x| with ties to the lowest index (NaN above Inf), the ordering
// rule of compressors/topk/topk_math.h. Approx: the CPU's result (compressors/topk/cuda/topk_plan.h says how it
// is decided): the exact top-m for some ceil(k/2) <= m <= k, the same m and bytes as the CPU.
//
// Algorithm (0 < k < n), everything on the stream, no host synchronisation, control flow
// decided on the device (each kernel reads the state the previous ones left and returns early
// when its step does not apply):
//  1. sample the tensor (compressors/topk/topk_math.h positions) and radix-select its r-th largest key t;
//  2. candidate pass, one pass over the tensor (KernelVariant::fast, the default): per
//     4096-element tile, in the order of an atomic tile ticket, count the keys >= t, publish
//     the count, sum the earlier tiles' counts by decoupled look-back (compressors/topk/cuda/topk_plan.h)
//     and write the tile's candidates (index, f32 bits) at those positions into the candidate
//     buffer, dropping any past its capacity. Reference variant: a count pass, an exclusive
//     scan of the tile counts (CUB), and after step 3 a write pass (4);
//  3. decide: c = #(key >= t). approx with c <= CPU capacity and ceil(k/2) <= c < k: the result
//     is those c elements. Otherwise the exact top-k: from the candidates when c >= k and they
//     fit the candidate buffer, else from the whole tensor;
//  4. (reference only) write pass: stable compaction of the candidates into the workspace;
//  5. radix select of the k-th largest key K over the candidates (or the tensor): three levels
//     (11/11/9-bit digits), each a histogram (shared-memory counts, integer atomics into a
//     global histogram) and a one-block suffix scan that picks the bin;
//  6. final compaction into the payload: every key > K plus the lowest-index `need` keys == K,
//     positions from the counts of the entries before (look-back in one pass; reference:
//     per-tile counts, their exclusive scans, then a write pass), so the output is in index
//     order and the same on every run (integer atomics only, for counts and tickets).
// Per call at n = 2^28 f32 (1 GiB): step 2 reads the tensor once (reference: steps 2 and 4 read
// it once each; step 4 skips tiles with nothing to keep); steps 1, 5, 6 touch the sample
// (256 KiB) and the candidates (about 2k entries of 8 bytes) only. The whole-tensor fallback
// reads it 3 more times (radix levels) plus 1 (final compaction; reference: 2, its count and
// write passes).
//
// Host-callable; no CUDA headers needed by includers (the stream is a cudaStream_t cast to
// void*, nullptr = the default stream).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernel_variant.h"

namespace gradzip::kernels::cuda {

struct TopkCudaOptions {
  bool approx = false;       // spec approx=on
  bool half_values = false;  // spec values=fp16: f16 value bits in the payload
  // EncodeContext: the sample positions' Philox key (only approx results depend on them).
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t tensor_id = 0;
  // fast: one-pass compactions; reference: the two-pass ones (count, scan, write), kept until a
  // GPU run has shown fast byte-identical. Both write the same bytes.
  KernelVariant variant = KernelVariant::fast;
};

// The launch wrappers, declared once for the CUDA kernels (namespace cuda) and for their CPU
// twins on the emulated device (namespace emulated, compressors/topk/emulated/topk_twins.cpp;
// same contracts, queued as one operation on the emulated device's stream, with one difference:
// the reference variant's plan reserves CUB's scan storage, which only a CUDA device can size,
// so the twin plans it at 0 bytes (one alignment unit) and its topk_workspace_bytes answer for
// the reference variant differs from a GPU's; the fast variant's, the default, is the same, and
// the twin's topk_select checks the workspace against its own answer).
//   topk_workspace_bytes: workspace bytes topk_select needs for (n, k, options),
//     options.variant included (the layouts differ: compressors/topk/cuda/topk_plan.h): never 0
//     (kTopkMinWorkspaceBytes, 256, when k == 0 or k == n), so a workspace allocated at the
//     queried size is never the null pointer that makes topk_select a size query.
//     Throws gradzip::Error(invalid_argument) when k > n, (unsupported) when CUB's size query
//     fails.
//   topk_select: selects from d_in[0, n) (device f32) and writes the payload to d_payload
//     (device memory, topk_payload_bytes(n, k, half_values) bytes available, any alignment) and
//     the entry count m to *d_entries_out (device u64; may be null). Two-phase workspace: with
//     d_workspace == nullptr, only sets *workspace_bytes (= topk_workspace_bytes) and launches
//     nothing; otherwise *workspace_bytes must be at least that (device memory, 256-byte
//     aligned). Asynchronous on `stream`; deterministic (the same bytes on every run and as the
//     CPU codec). Refusals before any launch (gradzip::Error(invalid_argument)): k > n,
//     workspace_bytes null, a workspace that is too small or misaligned, null d_in / d_payload
//     with k > 0. Launch failures: gradzip::Error(unsupported).
#define GZ_TOPK_KERNEL_DECLARATIONS                                                            \
  std::size_t topk_workspace_bytes(std::uint64_t n, std::uint64_t k,                           \
                                   const TopkCudaOptions& options);                            \
  void topk_select(const float* d_in, std::uint64_t n, std::uint64_t k,                        \
                   const TopkCudaOptions& options, std::byte* d_payload,                       \
                   std::uint64_t* d_entries_out, void* d_workspace, std::size_t* workspace_bytes, \
                   void* stream);
GZ_TOPK_KERNEL_DECLARATIONS

}  // namespace gradzip::kernels::cuda

namespace gradzip::kernels::emulated {
using cuda::TopkCudaOptions;
GZ_TOPK_KERNEL_DECLARATIONS
}  // namespace gradzip::kernels::emulated
#undef GZ_TOPK_KERNEL_DECLARATIONS
