// A build without CUDA: CUDA tensors cannot reach the collectives; say so.
#include "collectives/device_memory.h"

#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

[[noreturn]] void refuse(std::string_view op, int device) {
  GZ_THROW(ErrorCode::unsupported, op, ": the tensor is on CUDA device ", device,
           "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
}

}  // namespace

bool device_memory_built() noexcept { return false; }

void copy_device_to_host(void*, const void*, std::size_t, int device, std::string_view op) {
  refuse(op, device);
}
void copy_host_to_device(void*, const void*, std::size_t, int device, std::string_view op) {
  refuse(op, device);
}
void finish_queued_work(int device, std::string_view op) { refuse(op, device); }
void zero_on_device(void*, std::size_t, int device) { refuse("zero_on_device", device); }
void copy_on_device(void*, const void*, std::size_t, int device) { refuse("copy_on_device", device); }
void require_device_pointer(const void*, int device, std::string_view op, std::string_view) {
  refuse(op, device);
}

void widen_on_device(const TensorView& tensor, std::size_t, std::size_t, float*) {
  refuse("widen_on_device", tensor.device.index);
}
void narrow_on_device(const float*, std::size_t, std::size_t, const TensorView& tensor, Narrowing) {
  refuse("narrow_on_device", tensor.device.index);
}
void divide_on_device(float*, std::size_t, float, int device) { refuse("divide_on_device", device); }
NonfiniteOnDevice count_nonfinite_on_device(const TensorView& tensor, std::size_t, std::size_t, float) {
  refuse("count_nonfinite_on_device", tensor.device.index);
}

DeviceStream::DeviceStream(int device, std::string_view op) { refuse(op, device); }
DeviceStream::~DeviceStream() = default;
ThreadStreamScope::ThreadStreamScope(void*) noexcept {}
ThreadStreamScope::~ThreadStreamScope() = default;
DeviceEvent::DeviceEvent(int device, std::string_view op) { refuse(op, device); }
DeviceEvent::~DeviceEvent() = default;
void DeviceEvent::record(void*, std::string_view op) { refuse(op, device_); }
void DeviceEvent::synchronize(std::string_view op) const { refuse(op, device_); }

DeviceAllocation::DeviceAllocation(std::size_t, int device, std::string_view op) { refuse(op, device); }
DeviceAllocation::~DeviceAllocation() = default;

struct OrderedDeviceCall::State {};
OrderedDeviceCall::OrderedDeviceCall(Transport& transport, int device, std::string_view op)
    : transport_(transport), device_(device) {
  refuse(op, device);
}
OrderedDeviceCall::~OrderedDeviceCall() = default;
bool OrderedDeviceCall::complete(std::string_view op, const DeferredInputCheck*) { refuse(op, device_); }

DeferredInputCheck::DeferredInputCheck(const TensorView& tensor, std::size_t, std::size_t, float)
    : tensor_(tensor),
      snapshot_(0, tensor.device.index, "the input check"),
      counts_(0, tensor.device.index, "the input check") {}
const std::uint64_t* DeferredInputCheck::device_counts() const noexcept { return nullptr; }
void DeferredInputCheck::restore() const { refuse("the input check", tensor_.device.index); }
NonfiniteOnDevice DeferredInputCheck::counts() const { refuse("the input check", tensor_.device.index); }

DeviceRuntimeCounts device_runtime_counts() noexcept { return {}; }
void set_wait_site_counting(bool) noexcept {}
std::vector<std::pair<std::string, std::uint64_t>> device_wait_sites() { return {}; }
std::vector<std::pair<std::string, std::uint64_t>> wait_sites_between(
    const std::vector<std::pair<std::string, std::uint64_t>>&,
    const std::vector<std::pair<std::string, std::uint64_t>>&) {
  return {};
}

}  // namespace gradzip::collectives
