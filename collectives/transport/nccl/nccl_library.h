// NCCL, resolved at run time with dlopen instead of linked.
//
// Why: a Python process also loads PyTorch's NCCL (the nvidia-nccl wheel's libnccl.so.2), and
// the dynamic loader keeps one library per soname. Had gradzip's module a DT_NEEDED entry for the
// CUDA toolkit's libnccl.so.2, `import gradzip; import torch` would hand torch that (older) NCCL
// and torch's CUDA library would fail to load on a missing symbol; on a machine with only
// pip-installed torch the toolkit's copy would not exist at all. So gradzip links no NCCL and,
// at the first NCCL use (not at load time), takes the first of:
//   1. the libnccl.so.2 already loaded in the process (dlopen RTLD_NOLOAD): PyTorch's, when
//      torch was imported first;
//   2. GRADZIP_NCCL_LIBRARY, a path, when set (if it fails, nothing else is tried: the user
//      asked for that file);
//   3. the candidate paths registered with add_nccl_library_candidates() (the Python package
//      registers the nvidia-nccl wheel's copy, which is the file torch would load later);
//   4. "libnccl.so.2" through the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache);
//   5. the library CMake found when gradzip was configured.
// Every NCCL function gradzip calls comes from that one library; NCCL 2.18 or newer is needed
// (ncclCommSplit). When none loads, gradzip::Error (unsupported) names each place tried and why.
// Only CUDA tensors over NCCL need it: the CPU paths never load NCCL.
// On the emulated CUDA device (kernels/emulated/emulated_device.h: GRADZIP_DEVICE=emulated, or a
// build without the CUDA toolkit) nccl_api() loads nothing: it returns gradzip's emulated NCCL
// (nccl_emulated.h; path "emulated NCCL (gradzip)", found_by "GRADZIP_DEVICE=emulated").
// load_nccl_library still searches as below when called.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

namespace gradzip::collectives {

// The NCCL functions gradzip uses, as the loaded library's entry points. Members are named as
// NCCL's functions, so a call reads nccl_api().ncclAllReduce(...).
struct NcclApi {
  std::string path;     // the file they come from (the loader's path for it)
  std::string found_by; // which step found it ("already loaded", "GRADZIP_NCCL_LIBRARY", ...)
  int version = 0;      // ncclGetVersion's code, e.g. 22809 for 2.28.9

  decltype(&::ncclGetVersion) ncclGetVersion = nullptr;
  decltype(&::ncclGetUniqueId) ncclGetUniqueId = nullptr;
  decltype(&::ncclGetErrorString) ncclGetErrorString = nullptr;
  decltype(&::ncclGetLastError) ncclGetLastError = nullptr;
  decltype(&::ncclCommInitRank) ncclCommInitRank = nullptr;
  decltype(&::ncclCommInitAll) ncclCommInitAll = nullptr;
  decltype(&::ncclCommSplit) ncclCommSplit = nullptr;
  decltype(&::ncclCommDestroy) ncclCommDestroy = nullptr;
  decltype(&::ncclCommAbort) ncclCommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) ncclCommGetAsyncError = nullptr;
  decltype(&::ncclCommCount) ncclCommCount = nullptr;
  decltype(&::ncclCommCuDevice) ncclCommCuDevice = nullptr;
  decltype(&::ncclCommUserRank) ncclCommUserRank = nullptr;
  decltype(&::ncclAllReduce) ncclAllReduce = nullptr;
  decltype(&::ncclAllGather) ncclAllGather = nullptr;
  decltype(&::ncclSend) ncclSend = nullptr;
  decltype(&::ncclRecv) ncclRecv = nullptr;
  decltype(&::ncclGroupStart) ncclGroupStart = nullptr;
  decltype(&::ncclGroupEnd) ncclGroupEnd = nullptr;
};

// Where to look, in the order above; default_nccl_search() is what nccl_api() uses.
struct NcclSearch {
  bool already_loaded = true;        // step 1
  std::string environment;           // step 2: GRADZIP_NCCL_LIBRARY's value ("" when unset)
  std::vector<std::string> candidates;  // step 3
  bool loader_search = true;         // step 4
  std::string configured;            // step 5 ("" when the build recorded none)
};

NcclSearch default_nccl_search();

// One attempt, not cached (tests call it with searches of their own). Throws gradzip::Error
// (unsupported) naming every place tried and why it failed (dlerror, a missing function, a
// version below 2.18). A library found stays loaded for the life of the process.
NcclApi load_nccl_library(const NcclSearch& search);

// The process's NCCL: loaded at the first call (thread-safe) with default_nccl_search(), or the
// emulated NCCL when kernels::emulated::active(); later calls return the same. A failed load
// is retried at the next call (its error thrown again if it fails again).
const NcclApi& nccl_api();

// Adds step-3 paths (kept in order, duplicates ignored). Has no effect on a library already
// loaded. The Python package calls it at import with the nvidia-nccl wheel's copy, if any.
void add_nccl_library_candidates(const std::vector<std::string>& paths);

}  // namespace gradzip::collectives
