// Working memory one Communicator keeps between calls (internal to collectives/), each block
// grown as needed and never shrunk: f32 copies of f16 / bf16 tensors on the host and on each
// CUDA device, and the host copy of CUDA tensors reduced over a host transport.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "collectives/device_memory.h"

namespace gradzip::collectives {

class CallScratch {
 public:
  // f32 scratch for f16 / bf16 tensors on the host.
  std::vector<float>& f32() noexcept { return f32_; }
  // Host copy of CUDA tensors reduced over the host transport (their dtype's bytes).
  std::vector<std::byte>& host_staging() noexcept { return host_staging_; }
  // f32 working memory on CUDA device `device` for f16 / bf16 tensors on the NCCL path, at
  // least `count` floats (a larger block replaces a smaller one, freed first).
  float* device_f32(int device, std::size_t count);

 private:
  std::vector<float> f32_;
  std::vector<std::byte> host_staging_;
  std::map<int, std::unique_ptr<DeviceAllocation>> device_f32_;
};

}  // namespace gradzip::collectives
