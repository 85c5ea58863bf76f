// The transports one Communicator talks over (internal to collectives/): the world transport it
// was made with, the node and cross-node groups of the hierarchical all-reduce, and the NCCL
// transport of each CUDA device, every one under the communicator's deadline policy; and the
// CUDA path that decides which of them a CUDA tensor's call takes. Making a group or an NCCL
// transport is a collective over the world transport: every rank asks in the same call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "collectives/transport/deadline.h"
#include "collectives/transport/transport.h"
#include "gradzip/communicator.h"

namespace gradzip::collectives {

class TransportSet {
 public:
  // Throws invalid_argument for a null transport; applies the options' deadline policy
  // (CommunicatorOptions::timeout_seconds / on_timeout, GRADZIP_TIMEOUT_S) to it.
  TransportSet(std::unique_ptr<Transport> world, const CommunicatorOptions& options);

  Transport& world() noexcept { return *world_; }
  const Transport& world() const noexcept { return *world_; }
  CudaPath cuda_path() const noexcept { return cuda_path_; }
  // The deadline of every wait, applied to world() and to every transport made from it here.
  const DeadlinePolicy& deadline_policy() const noexcept { return deadline_policy_; }

  // The transports of the hierarchical all-reduce for `ranks_per_node` (0: nodes from shared
  // memory; L: ranks [kL, (k+1)L) form node k), made on first use and kept.
  struct NodeTransports {
    std::unique_ptr<Transport> intra;  // the ranks of this node, by world rank
    std::unique_ptr<Transport> inter;  // the ranks with this rank's node-local rank, one per node
  };
  NodeTransports& node_transports(std::uint32_t ranks_per_node);
  // The size of the node of ranks that share memory (node_transports(0)) when every rank's
  // node has that size, else 0.
  std::uint32_t shared_memory_node_size();

  // The NCCL transport of CUDA device `device` over the world's ranks, made at the first call
  // and kept; for a communicator made from an ncclComm_t (world().device_only() >= 0), the
  // world transport itself.
  Transport& nccl_transport(int device);
  // Makes, now, the transport CUDA calls on `device` would use over NCCL and connects it
  // eagerly (Transport::connect_eagerly). Nothing happens when CUDA calls would be staged
  // through host memory (cuda_path staged, no NCCL in the build). The Reducer calls it for
  // every lane, in lane order, before any lane runs.
  void prepare_device_transport(int device);

 private:
  std::unique_ptr<Transport> world_;
  CudaPath cuda_path_ = CudaPath::automatic;
  DeadlinePolicy deadline_policy_;
  std::map<std::uint32_t, NodeTransports> nodes_;
  std::map<int, std::unique_ptr<Transport>> nccl_transports_;
};

}  // namespace gradzip::collectives
