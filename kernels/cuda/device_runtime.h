// The one place where gradzip allocates device memory and waits for a stream (not a public
// header; includes cuda_runtime.h, so only CUDA builds see it). Every device allocation,
// release and host-side stream wait of the library goes through these functions, which count
// them; a test (tests/lint/device_runtime_calls.py) fails the build's ctest if cudaMalloc*,
// cudaFree*, cudaStreamSynchronize, cudaEventSynchronize or cudaDeviceSynchronize appear in the
// library anywhere else. Why one place:
//  - cudaMalloc and cudaFree synchronise the whole device. With NCCL kernels of several
//    communicators (the Reducer's lanes) on one device, a device-wide synchronisation while one
//    lane's kernel waits for a peer that waits for another lane is the deadlock NCCL's
//    documentation warns about. Here, allocations are stream-ordered (cudaMallocFromPoolAsync
//    from a pool of gradzip's own per device) and cached per thread, so a steady-state call
//    allocates nothing and nothing synchronises the device.
//  - The GPU check reports allocations and synchronisations per steady-state collective call
//    (device_runtime_counters(); `gradzip-bench kernels`), counted here, at the runtime calls.
//
// Memory pools: where the device supports them (cudaDevAttrMemoryPoolsSupported), gradzip
// creates one pool per device, once, with its release threshold at the maximum (memory freed to
// the pool stays there instead of going back to the driver at each synchronisation), and does
// not touch the device's default pool (the application's). Where pools are unsupported (some
// virtualised or MIG setups), it falls back to cudaMalloc / cudaFree, which synchronise the
// device: only on a cache miss (warm-up) and when a cached block is dropped.
//
// The cache: released blocks go to a cache of the releasing thread (per device and size class:
// sizes are rounded up to at most 25% more, 512 bytes at least), and the next allocation of that
// class on that thread takes one back without calling CUDA. Idle cached bytes per thread are
// bounded (kMaxIdleCachedBytes); beyond it a released block is freed. The cache is emptied when
// the thread ends. Contract for reuse: every use of the block on any stream is ordered before
// the releasing thread's later work on its work stream (gradzip's synchronous calls have
// finished every use when they return; in a stream-ordered call, kernels/cuda/
// stream_ordered_call.h, the work stream has been made to wait for the NCCL stream's uses, and
// the NCCL stream waits for the work stream before each of its operations).
#pragma once

#include "kernels/device_api.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradzip::kernels::cuda {

// Process-wide counts since start (every thread, every device).
struct DeviceRuntimeCounters {
  std::uint64_t allocations = 0;     // new blocks from CUDA (pool or cudaMalloc): cache misses
  std::uint64_t cache_hits = 0;      // allocations served from a thread's cache
  std::uint64_t frees = 0;           // blocks given back to CUDA (cache full, thread exit)
  std::uint64_t synchronizations = 0;  // host waits for a stream or an event (synchronize_*)
  // Bytes copied between host and device memory (either way) by cudaMemcpy / cudaMemcpyAsync,
  // counted at the runtime entry points of kernels/device_api.h.
  std::uint64_t host_device_bytes = 0;
};
DeviceRuntimeCounters device_runtime_counters() noexcept;

// Most bytes a thread's cache keeps idle (1 GiB).
inline constexpr std::size_t kMaxIdleCachedBytes = std::size_t{1} << 30;

// The size class `bytes` is rounded up to (>= bytes, at most 25% more, at least 512).
std::size_t device_size_class(std::size_t bytes) noexcept;

// True when `device` supports stream-ordered memory pools (asked once per device).
// Throws gradzip::Error(unsupported) naming `op` when CUDA cannot say.
bool device_memory_pools_supported(int device, std::string_view op);

// At least `bytes` (>= 1) bytes of memory on `device`, which must be the calling thread's
// current device. A new block is allocated in stream order on `stream` and the stream is then
// synchronised (counted), so that the block may be used on any stream at once; a cached block is
// returned without any CUDA call. Throws gradzip::Error(unsupported) naming `op` and `what`
// when CUDA refuses.
void* device_allocate(std::size_t bytes, int device, cudaStream_t stream, std::string_view op,
                      std::string_view what);

// Gives a block from device_allocate (same `bytes`, same `device`) back: to the calling thread's
// cache, or to CUDA (stream-ordered on `stream` where pools are supported). Null is ignored.
// Never throws.
void device_release(void* block, std::size_t bytes, int device, cudaStream_t stream) noexcept;

// Pinned host memory (cudaMallocHost) of `bytes` bytes: with unified addressing every device's
// kernels may write it directly. For long-lived blocks (the status words of
// kernels/cuda/stream_ordered_call.h, one per thread); cudaMallocHost may synchronise the
// device, so never inside a steady-state call. Not counted as a device allocation. Throws
// gradzip::Error(unsupported) naming `op` when CUDA refuses.
void* pinned_allocate(std::size_t bytes, std::string_view op);
// Gives a block from pinned_allocate back (cudaFreeHost). Null is ignored; never throws.
void pinned_release(void* block) noexcept;

// cudaStreamSynchronize(stream), counted; throws gradzip::Error(unsupported) naming `op` and
// `what` with CUDA's text when it fails.
void synchronize_stream(cudaStream_t stream, std::string_view op, std::string_view what);
// cudaEventSynchronize(event), counted; throws like synchronize_stream.
void synchronize_event(cudaEvent_t event, std::string_view op, std::string_view what);
// Counts a host wait that completed by polling (cudaEventQuery until done), as the NCCL
// transport waits, so that the counters cover every way the host waits for the device.
// `site` names the waiter (e.g. "nccl transport").
void count_polled_wait(std::string_view site) noexcept;
// Counts `bytes` copied between host and device memory (kernels/emulated/emulated_runtime.cpp's
// cudaMemcpy entry points call it, for the real CUDA runtime and the emulated device alike).
void count_host_device_bytes(std::size_t bytes) noexcept;

// Waits by site: off by default, so that a wait costs one atomic increment. While on, each
// wait is also counted under its site (the `op` of synchronize_*, the `site` of
// count_polled_wait), under a lock: for measurements (`gradzip-bench calls`, the GPU tests), not
// for training runs.
void set_wait_site_counting(bool on) noexcept;
// Host waits per site counted while site counting was on, sorted by site. Up to kMaxWaitSites
// names; the rest are counted under "(other sites)".
inline constexpr std::size_t kMaxWaitSites = 256;
using WaitSites = std::vector<std::pair<std::string, std::uint64_t>>;
WaitSites device_wait_sites();
// The sites whose count grew from `before` to `after` (two readings of device_wait_sites()),
// with the growth, sorted by site.
WaitSites wait_sites_between(const WaitSites& before, const WaitSites& after);

}  // namespace gradzip::kernels::cuda
