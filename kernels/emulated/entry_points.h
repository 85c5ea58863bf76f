// The CUDA runtime entry points that kernels/device_api.h renames CUDA's functions to, with
// CUDA's signatures (defined in kernels/emulated/emulated_runtime.cpp). They have C linkage, so
// a signature that drifted from CUDA's would still link: kernels/emulated/entry_points_check.cpp
// declares them again after the renamed CUDA header, where any difference is a compile error.
#pragma once

#include <cuda_runtime.h>

extern "C" {
cudaError_t gz_cudaGetDeviceCount(int *count);
cudaError_t gz_cudaGetDevice(int *device);
cudaError_t gz_cudaSetDevice(int device);
cudaError_t gz_cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t gz_cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t gz_cudaDeviceSynchronize(void);
cudaError_t gz_cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t gz_cudaDriverGetVersion(int *driverVersion);
cudaError_t gz_cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t gz_cudaGetLastError(void);
cudaError_t gz_cudaPeekAtLastError(void);
const char* gz_cudaGetErrorString(cudaError_t error);
const char* gz_cudaGetErrorName(cudaError_t error);
cudaError_t gz_cudaMalloc(void **devPtr, size_t size);
cudaError_t gz_cudaFree(void *devPtr);
cudaError_t gz_cudaMallocHost(void **ptr, size_t size);
cudaError_t gz_cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t gz_cudaFreeHost(void *ptr);
cudaError_t gz_cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t gz_cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
cudaError_t gz_cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t gz_cudaMemPoolCreate(cudaMemPool_t *memPool, const cudaMemPoolProps *poolProps);
cudaError_t gz_cudaMemPoolDestroy(cudaMemPool_t memPool);
cudaError_t gz_cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void *value);
cudaError_t gz_cudaPointerGetAttributes(cudaPointerAttributes *attributes, const void *ptr);
cudaError_t gz_cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t gz_cudaMemcpyAsync(void *dst, const void *src, size_t count, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t gz_cudaMemset(void *devPtr, int value, size_t count);
cudaError_t gz_cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t gz_cudaStreamCreate(cudaStream_t *pStream);
cudaError_t gz_cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t gz_cudaStreamDestroy(cudaStream_t stream);
cudaError_t gz_cudaStreamSynchronize(cudaStream_t stream);
cudaError_t gz_cudaStreamQuery(cudaStream_t stream);
cudaError_t gz_cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t gz_cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData);
cudaError_t gz_cudaEventCreate(cudaEvent_t *event);
cudaError_t gz_cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t gz_cudaEventDestroy(cudaEvent_t event);
cudaError_t gz_cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t gz_cudaEventQuery(cudaEvent_t event);
cudaError_t gz_cudaEventSynchronize(cudaEvent_t event);
cudaError_t gz_cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
}
