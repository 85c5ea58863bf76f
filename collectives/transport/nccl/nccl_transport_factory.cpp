// The NCCL transport's entry points (collectives/transport/nccl_transport_factory.h).
#include "collectives/transport/nccl_transport_factory.h"

#include "kernels/device_api.h"
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/transport/nccl/nccl_library.h"
#include "collectives/transport/nccl/nccl_transport.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

bool nccl_transport_built() noexcept { return true; }

std::unique_ptr<Transport> make_nccl_transport(Transport& host, int cuda_device) {
  const int rank = host.rank();
  const int ranks = host.size();
  const std::string who = detail::concat("make_nccl_transport (rank ", rank, " of ", ranks,
                                         ", cuda:", cuda_device, ")");
  const CurrentCudaDevice scope(cuda_device);
  // Every rank takes part in the exchange even after a local failure, so that all of them
  // throw instead of some waiting forever: word 0 is a failure flag, words 1..16 rank 0's id.
  std::string failure;
  if (scope.status() != cudaSuccess) {
    cudaGetLastError();
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    cudaGetLastError();
    failure = detail::concat("cudaSetDevice(", cuda_device, ") failed: ",
                             cudaGetErrorName(scope.status()), ": ",
                             cudaGetErrorString(scope.status()), " (this process sees ", devices,
                             " CUDA devices)");
  }
  // NCCL itself is loaded at its first use (nccl_library.h); a rank that cannot load it says so
  // in the exchange below like any other failure, so no rank is left in ncclCommInitRank.
  if (failure.empty()) {
    try {
      (void)nccl_api();
    } catch (const Error& error) {
      failure = error.what();
    }
  }
  ncclUniqueId id{};
  static_assert(sizeof id == 16 * sizeof(std::uint64_t));
  if (rank == 0 && failure.empty()) {
    const ncclResult_t status = nccl_api().ncclGetUniqueId(&id);
    if (status != ncclSuccess) {
      failure = detail::concat("ncclGetUniqueId failed: ", nccl_api().ncclGetErrorString(status));
    }
  }
  constexpr std::size_t kWords = 17;
  std::vector<std::uint64_t> mine(kWords, 0);
  mine[0] = failure.empty() ? 0 : 1;
  if (rank == 0) std::memcpy(&mine[1], &id, sizeof id);
  std::vector<std::uint64_t> all(kWords * static_cast<std::size_t>(ranks));
  host.allgather_u64(mine, all);
  GZ_REQUIRE(failure.empty(), ErrorCode::unsupported, who, ": ", failure);
  std::string failed_ranks;
  for (int r = 0; r < ranks; ++r) {
    if (all[static_cast<std::size_t>(r) * kWords] != 0) {
      failed_ranks += detail::concat(failed_ranks.empty() ? "" : ", ", r);
    }
  }
  GZ_REQUIRE(failed_ranks.empty(), ErrorCode::unsupported, who,
             ": setting up CUDA, loading NCCL or making the NCCL id failed on rank(s) ", failed_ranks);
  std::memcpy(&id, &all[1], sizeof id);

  ncclComm_t comm = nullptr;
  const ncclResult_t status = nccl_api().ncclCommInitRank(&comm, ranks, id, rank);
  if (status != ncclSuccess) {
    const char* last = nccl_api().ncclGetLastError(comm);
    const std::string detail_text = last != nullptr ? last : "";
    if (comm != nullptr) nccl_api().ncclCommAbort(comm);
    GZ_THROW(ErrorCode::unsupported, who, ": ncclCommInitRank failed: ", nccl_api().ncclGetErrorString(status),
             detail_text.empty() ? "" : " (", detail_text, detail_text.empty() ? "" : ")",
             "; one known cause: two ranks on one GPU, which NCCL refuses");
  }
  return std::make_unique<NcclTransport>(comm, true);
}

std::unique_ptr<Transport> adopt_nccl_communicator(void* nccl_comm) {
  GZ_REQUIRE(nccl_comm != nullptr, ErrorCode::invalid_argument,
             "adopt_nccl_communicator: the NCCL communicator is null");
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(nccl_comm), false);
}

}  // namespace gradzip::collectives
