// The NCCL transport's entry points, without NCCL or CUDA headers: what the Communicator and
// tests call. A build with NCCL implements them in collectives/transport/nccl/; a build without
// it links the stand-ins in collectives/transport/no_nccl/, which throw
// ErrorCode::unsupported saying so.
//
// The transport they return moves DEVICE memory: every span given to isend / irecv /
// allgatherv / alltoallv / allreduce_f32_sum is memory on the transport's CUDA device
// (allgather_u64 alone takes host spans: it carries metadata). NCCL's point-to-point needs the
// receiver to post exactly the sender's size, so over this transport a receive buffer must be
// exactly as long as the message that matches it (collectives/transport/nccl/nccl_transport.h
// has the details); the algorithms that run over it send fixed-size messages.
#pragma once

#include <memory>

#include "collectives/transport/transport.h"

namespace gradzip::collectives {

// True in builds with the NCCL transport.
bool nccl_transport_built() noexcept;

// A communicator over the same ranks as `host` (same rank numbers) on CUDA device
// `cuda_device` of this process: rank 0 makes the NCCL unique id, every rank receives it over
// `host` (a collective on `host`: every rank calls this together), then ncclCommInitRank.
// Throws gradzip::Error naming the rank and NCCL's error text when NCCL refuses (e.g. two
// ranks on one GPU).
std::unique_ptr<Transport> make_nccl_transport(Transport& host, int cuda_device);

// A transport over an existing ncclComm_t (passed as void* so that callers need no NCCL
// header). The application keeps ownership: the communicator must outlive the transport and
// its splits (splits own the communicators they create).
std::unique_ptr<Transport> adopt_nccl_communicator(void* nccl_comm);

}  // namespace gradzip::collectives
