// The CUDA runtime API as gradzip's host code sees it: include this instead of <cuda_runtime.h>
// (and before <nccl.h>, which includes it) in every host source that calls the CUDA runtime —
// library, tests and benchmarks. Not a public header.
//
// It renames each CUDA runtime function gradzip calls (the list below) to a gradzip entry point
// (kernels/emulated/emulated_runtime.cpp) that runs the real CUDA runtime, or the emulated device
// when kernels::emulated::active() (GRADZIP_DEVICE=emulated, or a build without the CUDA toolkit;
// kernels/emulated/emulated_device.h). The renaming happens before <cuda_runtime.h> is read, so
// its declarations (and its C++ template overloads) carry the new names and every call in the
// including file goes through the entry points. A file that includes <cuda_runtime.h> first and
// calls one of these functions does not compile (the renamed name is undeclared): the order is
// checked by the compiler, not by review.
//
// CUDA sources (.cu, nvcc) do not rename: their launch wrappers turn to the CPU twins before any
// CUDA call when the emulated device is active (kernels/emulated/kernel_twins.h), and CUB's
// device code must see CUDA's own names.
//
// A runtime function gradzip starts to call must be added here, to the emulator, and to the
// stand-in header of toolkit-free builds (kernels/emulated/include/cuda_runtime.h);
// tests/lint/device_runtime_calls.py fails when a host source calls one that is missing.
#pragma once

// X(name) for each renamed function; emulated_runtime.cpp defines gz_<name> for each.
#define GRADZIP_CUDA_RUNTIME_FUNCTIONS(X)                                                        \
  X(cudaGetDeviceCount) X(cudaGetDevice) X(cudaSetDevice) X(cudaGetDeviceProperties)             \
  X(cudaDeviceGetAttribute) X(cudaDeviceSynchronize) X(cudaRuntimeGetVersion)                     \
  X(cudaDriverGetVersion) X(cudaMemGetInfo) X(cudaGetLastError) X(cudaPeekAtLastError)           \
  X(cudaGetErrorString) X(cudaGetErrorName) X(cudaMalloc) X(cudaFree) X(cudaMallocHost)           \
  X(cudaHostAlloc) X(cudaFreeHost) X(cudaMallocAsync) X(cudaMallocFromPoolAsync) X(cudaFreeAsync) \
  X(cudaMemPoolCreate) X(cudaMemPoolDestroy) X(cudaMemPoolSetAttribute)                          \
  X(cudaPointerGetAttributes) X(cudaMemcpy) X(cudaMemcpyAsync) X(cudaMemset) X(cudaMemsetAsync)   \
  X(cudaStreamCreate) X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamSynchronize)  \
  X(cudaStreamQuery) X(cudaStreamWaitEvent) X(cudaLaunchHostFunc) X(cudaEventCreate)             \
  X(cudaEventCreateWithFlags) X(cudaEventDestroy) X(cudaEventRecord) X(cudaEventQuery)           \
  X(cudaEventSynchronize) X(cudaEventElapsedTime)

// emulated_runtime.cpp defines GRADZIP_DEVICE_API_LIST_ONLY: it needs the list, and CUDA's own
// names for the real runtime.
#if !defined(__CUDACC__) && !defined(GRADZIP_DEVICE_API_LIST_ONLY)

#define cudaGetDeviceCount gz_cudaGetDeviceCount
#define cudaGetDevice gz_cudaGetDevice
#define cudaSetDevice gz_cudaSetDevice
#define cudaGetDeviceProperties gz_cudaGetDeviceProperties
#define cudaDeviceGetAttribute gz_cudaDeviceGetAttribute
#define cudaDeviceSynchronize gz_cudaDeviceSynchronize
#define cudaRuntimeGetVersion gz_cudaRuntimeGetVersion
#define cudaDriverGetVersion gz_cudaDriverGetVersion
#define cudaMemGetInfo gz_cudaMemGetInfo
#define cudaGetLastError gz_cudaGetLastError
#define cudaPeekAtLastError gz_cudaPeekAtLastError
#define cudaGetErrorString gz_cudaGetErrorString
#define cudaGetErrorName gz_cudaGetErrorName
#define cudaMalloc gz_cudaMalloc
#define cudaFree gz_cudaFree
#define cudaMallocHost gz_cudaMallocHost
#define cudaHostAlloc gz_cudaHostAlloc
#define cudaFreeHost gz_cudaFreeHost
#define cudaMallocAsync gz_cudaMallocAsync
#define cudaMallocFromPoolAsync gz_cudaMallocFromPoolAsync
#define cudaFreeAsync gz_cudaFreeAsync
#define cudaMemPoolCreate gz_cudaMemPoolCreate
#define cudaMemPoolDestroy gz_cudaMemPoolDestroy
#define cudaMemPoolSetAttribute gz_cudaMemPoolSetAttribute
#define cudaPointerGetAttributes gz_cudaPointerGetAttributes
#define cudaMemcpy gz_cudaMemcpy
#define cudaMemcpyAsync gz_cudaMemcpyAsync
#define cudaMemset gz_cudaMemset
#define cudaMemsetAsync gz_cudaMemsetAsync
#define cudaStreamCreate gz_cudaStreamCreate
#define cudaStreamCreateWithFlags gz_cudaStreamCreateWithFlags
#define cudaStreamDestroy gz_cudaStreamDestroy
#define cudaStreamSynchronize gz_cudaStreamSynchronize
#define cudaStreamQuery gz_cudaStreamQuery
#define cudaStreamWaitEvent gz_cudaStreamWaitEvent
#define cudaLaunchHostFunc gz_cudaLaunchHostFunc
#define cudaEventCreate gz_cudaEventCreate
#define cudaEventCreateWithFlags gz_cudaEventCreateWithFlags
#define cudaEventDestroy gz_cudaEventDestroy
#define cudaEventRecord gz_cudaEventRecord
#define cudaEventQuery gz_cudaEventQuery
#define cudaEventSynchronize gz_cudaEventSynchronize
#define cudaEventElapsedTime gz_cudaEventElapsedTime
#endif  // !__CUDACC__ && !GRADZIP_DEVICE_API_LIST_ONLY

#include <cuda_runtime.h>
