// A build without NCCL still links: the NCCL transport's entry points say clearly that it is
// missing.
#include "collectives/transport/nccl_transport_factory.h"

#include "gradzip/error.h"

namespace gradzip::collectives {

bool nccl_transport_built() noexcept { return false; }

std::unique_ptr<Transport> make_nccl_transport(Transport& /*host*/, int cuda_device) {
  GZ_THROW(ErrorCode::unsupported, "make_nccl_transport (cuda:", cuda_device,
           "): this gradzip was built without NCCL (it needs CUDA and nccl.h / libnccl, found "
           "under NCCL_ROOT or the CUDA toolkit)");
}

std::unique_ptr<Transport> adopt_nccl_communicator(void* /*nccl_comm*/) {
  GZ_THROW(ErrorCode::unsupported,
           "adopt_nccl_communicator: this gradzip was built without NCCL (it needs CUDA and "
           "nccl.h / libnccl, found under NCCL_ROOT or the CUDA toolkit)");
}

}  // namespace gradzip::collectives
