// Run-time resolution of NCCL (collectives/transport/nccl/nccl_library.h says why and the order).
#include "collectives/transport/nccl/nccl_library.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "collectives/transport/nccl/nccl_emulated.h"
#include "gradzip/error.h"
#include "kernels/emulated/emulated_device.h"

#ifndef GRADZIP_NCCL_CONFIGURED_PATH
#define GRADZIP_NCCL_CONFIGURED_PATH ""
#endif

namespace gradzip::collectives {
namespace {

constexpr int kMinimumVersion = 21800;  // ncclCommSplit

std::mutex& candidates_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<std::string>& registered_candidates() {
  static std::vector<std::string> paths;
  return paths;
}

std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

// Resolves every function from `handle`; "" on success, else what is missing or too old.
std::string resolve(void* handle, NcclApi& api) {
  std::string missing;
  auto bind = [&](auto& member, const char* name) {
    dlerror();
    void* symbol = dlsym(handle, name);
    if (symbol == nullptr) {
      missing += detail::concat(missing.empty() ? "" : ", ", name);
      return;
    }
    member = reinterpret_cast<std::remove_reference_t<decltype(member)>>(symbol);
  };
#define GRADZIP_BIND(name) bind(api.name, #name)
  GRADZIP_BIND(ncclGetVersion);
  GRADZIP_BIND(ncclGetUniqueId);
  GRADZIP_BIND(ncclGetErrorString);
  GRADZIP_BIND(ncclGetLastError);
  GRADZIP_BIND(ncclCommInitRank);
  GRADZIP_BIND(ncclCommInitAll);
  GRADZIP_BIND(ncclCommSplit);
  GRADZIP_BIND(ncclCommDestroy);
  GRADZIP_BIND(ncclCommAbort);
  GRADZIP_BIND(ncclCommGetAsyncError);
  GRADZIP_BIND(ncclCommCount);
  GRADZIP_BIND(ncclCommCuDevice);
  GRADZIP_BIND(ncclCommUserRank);
  GRADZIP_BIND(ncclAllReduce);
  GRADZIP_BIND(ncclAllGather);
  GRADZIP_BIND(ncclSend);
  GRADZIP_BIND(ncclRecv);
  GRADZIP_BIND(ncclGroupStart);
  GRADZIP_BIND(ncclGroupEnd);
#undef GRADZIP_BIND
  if (!missing.empty()) return "it lacks " + missing;
  int version = 0;
  if (api.ncclGetVersion(&version) != ncclSuccess) return "ncclGetVersion failed";
  api.version = version;
  if (version < kMinimumVersion) {
    return detail::concat("its version ", version, " is below 2.18 (", kMinimumVersion,
                          "), which gradzip needs");
  }
  return {};
}

}  // namespace

NcclSearch default_nccl_search() {
  NcclSearch search;
  if (const char* value = std::getenv("GRADZIP_NCCL_LIBRARY"); value != nullptr) {
    search.environment = value;
  }
  {
    const std::lock_guard lock(candidates_mutex());
    search.candidates = registered_candidates();
  }
  search.configured = GRADZIP_NCCL_CONFIGURED_PATH;
  return search;
}

NcclApi load_nccl_library(const NcclSearch& search) {
  std::string tried;
  // One place: dlopen with `flags`, then resolve. True when it gave a usable library.
  auto attempt = [&](const std::string& name, int flags, const std::string& found_by,
                     NcclApi& api) {
    void* handle = dlopen(name.c_str(), flags);
    if (handle == nullptr) {
      if ((flags & RTLD_NOLOAD) == 0) {
        const char* reason = dlerror();
        tried += detail::concat("\n  ", found_by, " '", name, "': ", reason ? reason : "dlopen failed");
      } else {
        dlerror();
        tried += detail::concat("\n  ", found_by, ": none loaded");
      }
      return false;
    }
    NcclApi candidate;
    candidate.path = loaded_path(handle, name);
    candidate.found_by = found_by;
    if (std::string problem = resolve(handle, candidate); !problem.empty()) {
      tried += detail::concat("\n  ", found_by, " '", candidate.path, "': ", problem);
      dlclose(handle);
      return false;
    }
    api = std::move(candidate);  // the handle stays open: the functions must stay valid
    return true;
  };

  NcclApi api;
  constexpr int kFlags = RTLD_NOW | RTLD_LOCAL;
  if (search.already_loaded && attempt("libnccl.so.2", kFlags | RTLD_NOLOAD, "already loaded", api)) {
    return api;
  }
  if (!search.environment.empty()) {
    if (attempt(search.environment, kFlags, "GRADZIP_NCCL_LIBRARY", api)) return api;
    GZ_THROW(ErrorCode::unsupported, "NCCL: GRADZIP_NCCL_LIBRARY names a library that cannot be used:",
             tried, "\n(unset it to let gradzip search, or name a libnccl.so.2 of NCCL 2.18 or newer)");
  }
  for (const std::string& path : search.candidates) {
    if (attempt(path, kFlags, "registered candidate", api)) return api;
  }
  if (search.loader_search && attempt("libnccl.so.2", kFlags, "the dynamic loader's search", api)) {
    return api;
  }
  if (!search.configured.empty() && attempt(search.configured, kFlags, "found at configure time", api)) {
    return api;
  }
  GZ_THROW(ErrorCode::unsupported, "NCCL: no usable libnccl.so.2 (NCCL 2.18 or newer) was found "
           "for CUDA tensors over NCCL; tried:", tried,
           "\n(install NCCL, e.g. `pip install nvidia-nccl-cu13` or the CUDA toolkit's, or set "
           "GRADZIP_NCCL_LIBRARY to its path; CommunicatorOptions::cuda_path = staged avoids NCCL)");
}

const NcclApi& nccl_api() {
  static std::atomic<const NcclApi*> ready{nullptr};
  if (const NcclApi* api = ready.load(std::memory_order_acquire)) return *api;
  static std::mutex mutex;
  static std::unique_ptr<const NcclApi> loaded;
  const std::lock_guard lock(mutex);
  if (!loaded) {
    // On the emulated device no libnccl.so.2 is opened: its NCCL would need a real GPU.
    loaded = std::make_unique<const NcclApi>(kernels::emulated::active()
                                                 ? emulated_nccl_api()
                                                 : load_nccl_library(default_nccl_search()));
    ready.store(loaded.get(), std::memory_order_release);
  }
  return *loaded;
}

void add_nccl_library_candidates(const std::vector<std::string>& paths) {
  const std::lock_guard lock(candidates_mutex());
  std::vector<std::string>& known = registered_candidates();
  for (const std::string& path : paths) {
    if (std::find(known.begin(), known.end(), path) == known.end()) known.push_back(path);
  }
}

}  // namespace gradzip::collectives
