// The emulated CUDA device: the CUDA runtime calls gradzip makes, run on the CPU, for tests and
// development on machines without a GPU. Not a public header.
//
// What it is. A build with CUDA support routes every CUDA runtime call of its host code through
// kernels/device_api.h. With GRADZIP_DEVICE=emulated (or in a build configured with
// GRADZIP_WITH_CUDA=EMULATED, which has no CUDA toolkit at all) those calls run here instead of
// in CUDA's runtime:
//  - device memory is host memory that the emulator allocates and remembers (so
//    cudaPointerGetAttributes tells device memory from host memory, and copies check bounds);
//  - every stream is a host thread that runs the stream's operations in order, asynchronously
//    to the caller: a copy, a memset, a kernel or a host function queued on a stream has not
//    happened when the call returns. Events, cudaStreamWaitEvent, the legacy default stream's
//    implicit ordering with blocking streams, and the synchronise calls order them as CUDA does;
//  - each kernel launch wrapper of kernels/cuda/*.h runs its CPU twin (kernels/emulated/
//    kernel_twins.cpp) as one operation on the launch's stream: the same bytes as the CPU codec;
//  - NCCL (collectives/transport/nccl/nccl_emulated.cpp) moves bytes between the processes of a
//    communicator over Unix sockets, its operations queued on the streams like kernels.
// So a missing event wait, a host read of device memory before its stream finished, or host
// memory freed while a stream still uses it gives a wrong result or a sanitizer report here.
// It proves orchestration (streams, events, memory, the NCCL routes, error paths), never a CUDA
// kernel's own arithmetic: the kernels are replaced by their CPU twins.
//
// Timing: each queued operation waits GRADZIP_EMULATED_DELAY_US microseconds before it runs
// (default 20), so work a caller forgot to wait for is reliably still pending.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace gradzip::kernels::emulated {

// True when this process's CUDA calls run on the emulated device: GRADZIP_DEVICE=emulated, or a
// build without the CUDA toolkit. Read once.
bool active() noexcept;

// True when the build has no CUDA toolkit (GRADZIP_WITH_CUDA=EMULATED): the emulated device is
// the only one.
bool toolkit_free_build() noexcept;

// Queues `work` on `stream` (a cudaStream_t as void*: nullptr is the legacy default stream of the
// calling thread's current device; cudaStreamLegacy and cudaStreamPerThread are accepted) and
// returns at once. `work` runs on the stream's thread after everything queued on the stream
// before it (and, on the legacy stream, after the work of every blocking stream queued before
// it). `what` names the operation in error reports. An exception thrown by `work` is a launch
// failure: it is printed to stderr with `what`, and the device's sticky error is set, which the
// next runtime calls return (as a faulting kernel does on a GPU).
void enqueue(void* stream, const char* what, std::function<void()> work);

// Throws gradzip::Error(invalid_argument) naming `what` unless [pointer, pointer + bytes) lies
// inside one emulated device allocation (or bytes == 0). Twins call it on their device
// arguments, as a GPU would fault on a host pointer.
void require_device_range(const void* pointer, std::size_t bytes, const char* what);
// The same for memory a kernel may write although it is host memory: device memory, or pinned
// host memory (cudaMallocHost), which CUDA maps into the device's address space. Status words
// of a stream-ordered call live there (kernels/cuda/stream_ordered_call.h).
void require_device_accessible_range(const void* pointer, std::size_t bytes, const char* what);

// The number of emulated devices (GRADZIP_EMULATED_DEVICES, default 1) and the calling thread's
// current device.
int device_count() noexcept;
int current_device() noexcept;

}  // namespace gradzip::kernels::emulated
