// CallScratch (collectives/call_scratch.h).
#include "collectives/call_scratch.h"

namespace gradzip::collectives {

float* CallScratch::device_f32(int device, std::size_t count) {
  std::unique_ptr<DeviceAllocation>& scratch = device_f32_[device];
  const std::size_t bytes = count * sizeof(float);
  if (scratch == nullptr || scratch->size() < bytes) {
    scratch.reset();  // free the old block before taking the larger one
    scratch = std::make_unique<DeviceAllocation>(bytes, device, "device f32 scratch");
  }
  return reinterpret_cast<float*>(scratch->data());
}

}  // namespace gradzip::collectives
