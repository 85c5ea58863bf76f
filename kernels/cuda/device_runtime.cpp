// Device allocations, the per-thread block cache and counted host waits
// (kernels/cuda/device_runtime.h). Host code only; compiled by nvcc with the kernels (C++17).
#include "kernels/cuda/device_runtime.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradzip/error.h"
#include "kernels/cuda/runtime_support.h"

namespace gradzip::kernels::cuda {
namespace {

std::atomic<std::uint64_t> g_allocations{0};
std::atomic<std::uint64_t> g_cache_hits{0};
std::atomic<std::uint64_t> g_frees{0};
std::atomic<std::uint64_t> g_synchronizations{0};
std::atomic<std::uint64_t> g_host_device_bytes{0};

std::atomic<bool> g_count_sites{false};
std::mutex g_sites_mutex;
std::map<std::string, std::uint64_t, std::less<>>& wait_sites() {
  static auto* sites = new std::map<std::string, std::uint64_t, std::less<>>();  // never destroyed
  return *sites;
}

// One host wait at `site`.
void count_wait(std::string_view site) noexcept {
  g_synchronizations.fetch_add(1, std::memory_order_relaxed);
  if (!g_count_sites.load(std::memory_order_relaxed)) return;
  try {
    std::lock_guard<std::mutex> lock(g_sites_mutex);
    auto& sites = wait_sites();
    auto found = sites.find(site);
    if (found == sites.end())
      found = sites.emplace(sites.size() < kMaxWaitSites ? std::string(site) : "(other sites)", 0).first;
    ++found->second;
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: the total above still counts
  }
}

// Per device, decided once: gradzip's own pool (release threshold at the maximum), or none
// (pools unsupported: cudaMalloc / cudaFree).
struct DevicePool {
  bool supported = false;
  cudaMemPool_t pool = nullptr;
};

std::mutex g_pools_mutex;
std::map<int, DevicePool>& pools() {
  static auto* table = new std::map<int, DevicePool>();  // never destroyed: used at thread exit
  return *table;
}

// Must be called with `device` current.
DevicePool pool_of(int device, std::string_view op) {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const auto found = pools().find(device);
  if (found != pools().end()) return found->second;
  int supported = 0;
  check_runtime(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), op,
                "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
  DevicePool made;
  if (supported != 0) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check_runtime(cudaMemPoolCreate(&made.pool, &props), op, "cudaMemPoolCreate");
    std::uint64_t keep_everything = UINT64_MAX;
    check_runtime(cudaMemPoolSetAttribute(made.pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
                  op, "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
    made.supported = true;
  }
  pools().emplace(device, made);
  return made;
}

void free_to_cuda(void* block, int device, cudaStream_t stream) noexcept {
  DevicePool pool;
  {
    std::lock_guard<std::mutex> lock(g_pools_mutex);
    const auto found = pools().find(device);
    if (found == pools().end()) return;  // never allocated by device_allocate
    pool = found->second;
  }
  const CurrentCudaDevice current(device);
  // Errors are ignored: at process exit the runtime may already be unloading.
  const cudaError_t status = pool.supported ? cudaFreeAsync(block, stream) : cudaFree(block);
  if (status != cudaSuccess) cudaGetLastError();
  g_frees.fetch_add(1, std::memory_order_relaxed);
}

// The calling thread's idle blocks, per (device, size class).
class ThreadCache {
 public:
  ~ThreadCache() { clear(); }

  void* take(int device, std::size_t size_class) {
    const auto found = idle_.find({device, size_class});
    if (found == idle_.end() || found->second.empty()) return nullptr;
    void* block = found->second.back();
    found->second.pop_back();
    idle_bytes_ -= size_class;
    return block;
  }

  // False when the cache is full (the caller frees the block).
  bool keep(void* block, int device, std::size_t size_class) {
    if (idle_bytes_ + size_class > kMaxIdleCachedBytes) return false;
    idle_[{device, size_class}].push_back(block);
    idle_bytes_ += size_class;
    return true;
  }

  void clear() noexcept {
    for (auto& [key, blocks] : idle_) {
      for (void* block : blocks) free_to_cuda(block, key.first, nullptr);
    }
    idle_.clear();
    idle_bytes_ = 0;
  }

 private:
  std::map<std::pair<int, std::size_t>, std::vector<void*>> idle_;
  std::size_t idle_bytes_ = 0;
};

ThreadCache& thread_cache() {
  thread_local ThreadCache cache;
  return cache;
}

}  // namespace

DeviceRuntimeCounters device_runtime_counters() noexcept {
  return DeviceRuntimeCounters{g_allocations.load(std::memory_order_relaxed),
                               g_cache_hits.load(std::memory_order_relaxed),
                               g_frees.load(std::memory_order_relaxed),
                               g_synchronizations.load(std::memory_order_relaxed),
                               g_host_device_bytes.load(std::memory_order_relaxed)};
}

std::size_t device_size_class(std::size_t bytes) noexcept {
  constexpr std::size_t kSmallest = 512;
  if (bytes <= kSmallest) return kSmallest;
  // Round up to a multiple of a quarter of the largest power of two <= bytes: at most 25% more.
  int log2 = 0;
  while ((bytes >> (log2 + 1)) != 0) ++log2;
  const std::size_t step = std::size_t{1} << (log2 - 2);
  if (bytes > SIZE_MAX - (step - 1)) return bytes;
  return (bytes + step - 1) / step * step;
}

bool device_memory_pools_supported(int device, std::string_view op) {
  const CurrentDevice current(device, op);
  return pool_of(device, op).supported;
}

void* device_allocate(std::size_t bytes, int device, cudaStream_t stream, std::string_view op,
                      std::string_view what) {
  const std::size_t size_class = device_size_class(bytes == 0 ? 1 : bytes);
  if (void* cached = thread_cache().take(device, size_class)) {
    g_cache_hits.fetch_add(1, std::memory_order_relaxed);
    return cached;
  }
  const DevicePool pool = pool_of(device, op);
  void* block = nullptr;
  if (pool.supported) {
    check_runtime(cudaMallocFromPoolAsync(&block, size_class, pool.pool, stream), op, what);
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    // Usable on any stream once this returns (callers hand blocks to the NCCL transport's
    // stream); a miss happens only while the caches warm up.
    synchronize_stream(stream, op, "the new allocation");
  } else {
    check_runtime(cudaMalloc(&block, size_class), op, what);  // pools unsupported: see the header
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  return block;
}

void device_release(void* block, std::size_t bytes, int device, cudaStream_t stream) noexcept {
  if (block == nullptr) return;
  const std::size_t size_class = device_size_class(bytes == 0 ? 1 : bytes);
  if (thread_cache().keep(block, device, size_class)) return;
  free_to_cuda(block, device, stream);
}

void* pinned_allocate(std::size_t bytes, std::string_view op) {
  void* block = nullptr;
  check_runtime(cudaMallocHost(&block, bytes), op, "allocating pinned host memory (cudaMallocHost)");
  return block;
}

void pinned_release(void* block) noexcept {
  if (block != nullptr) cudaFreeHost(block);
}

void synchronize_stream(cudaStream_t stream, std::string_view op, std::string_view what) {
  count_wait(op);
  check_runtime(cudaStreamSynchronize(stream), op, what);
}

void synchronize_event(cudaEvent_t event, std::string_view op, std::string_view what) {
  count_wait(op);
  check_runtime(cudaEventSynchronize(event), op, what);
}

void count_polled_wait(std::string_view site) noexcept { count_wait(site); }

void count_host_device_bytes(std::size_t bytes) noexcept {
  g_host_device_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void set_wait_site_counting(bool on) noexcept { g_count_sites.store(on, std::memory_order_relaxed); }

WaitSites device_wait_sites() {
  std::lock_guard<std::mutex> lock(g_sites_mutex);
  return {wait_sites().begin(), wait_sites().end()};
}

WaitSites wait_sites_between(const WaitSites& before, const WaitSites& after) {
  WaitSites grown;
  auto earlier = before.begin();
  for (const auto& [site, count] : after) {  // both sorted by site
    while (earlier != before.end() && earlier->first < site) ++earlier;
    const std::uint64_t old = earlier != before.end() && earlier->first == site ? earlier->second : 0;
    if (count > old) grown.emplace_back(site, count - old);
  }
  return grown;
}

}  // namespace gradzip::kernels::cuda
