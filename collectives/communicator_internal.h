// What gradzip's layers above collectives/ (pipeline/: the Reducer and PowerSGD; python/: the
// binding) use of a Communicator beyond include/gradzip/communicator.h. They include this
// header, never collectives/communicator_state.h: the state's layout stays the collectives'
// business.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/checkpoint.h"
#include "collectives/transport/deadline.h"
#include "collectives/transport/transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

// A communicator over `transport` (which it owns): what Communicator::world / from_mpi return,
// what the Python binding makes over torch.distributed, and what tests use with transports
// that corrupt messages.
Communicator make_communicator(std::unique_ptr<Transport> transport,
                               CommunicatorOptions options = {});

// `count` communicators for threads that run collectives beside `user`, one thread each (the
// Reducer's lanes). Each runs over its own duplicate of user's transport (collective: every
// rank makes them in the same order), waits without spinning, keeps its names' state for its
// life (release_unused_after_calls = 0), and inherits user's CUDA path, deadline and timeout
// action. When a spec in `specs` lets algo=auto consult the model, user's link model and the
// node structures those specs ask for are measured once, on `user` (a collective), and given
// to every lane, rather than measured by each lane while the others move data.
// `who` names the caller in errors: count < 1 is invalid_argument, and count > 1 over a
// transport that cannot be driven from several threads at once is unsupported.
std::vector<Communicator> make_lane_communicators(Communicator& user, int count,
                                                  std::span<const CompressionSpec* const> specs,
                                                  std::string_view who);

// Every rank's `mine` (the same length on every rank), in rank order: a small exchange of
// facts, e.g. a layout fingerprint to compare (collective).
std::vector<std::uint64_t> allgather_u64(Communicator& communicator,
                                         std::span<const std::uint64_t> mine);

// Whether an all-reduce of `count` f32 elements under `spec`, once past warm-up, goes through
// the transport's own uncompressed sum (algo=auto under min_bytes): the rule the DDP hook
// applies per parameter. False for codecs that are not element codecs (PowerSGD).
bool sent_uncompressed(const CompressionSpec& spec, std::size_t count);

// Whether the call behind `stats` went through the transport's own uncompressed sum
// (kTransportSumName), whose bytes gradzip does not see.
bool ran_transport_sum(const CollectiveStats& stats);

// The transport's description (e.g. "MPI over 4 ranks") and deadline policy.
std::string transport_description(Communicator& communicator);
const DeadlinePolicy& deadline_policy_of(Communicator& communicator);
// Ends the whole job now (TimeoutAction::abort after a timeout the caller detected itself).
[[noreturn]] void abort_job(Communicator& communicator);

// The communicator's error-feedback residuals, by name.
error_feedback::ResidualStore& residuals_of(Communicator& communicator);

// algo=auto's model inputs (measured link, codec costs, node structures), and their
// replacement from a checkpoint (collectives/checkpoint.h has the checkpoint types and files).
AutoModelInputs auto_model_inputs(Communicator& communicator);
void adopt_auto_model_inputs(Communicator& communicator, const AutoModelInputs& inputs);

// Makes, now, the device transport that CUDA tensors of `device` will use (a collective over
// the host transport for NCCL), so that it is not made inside a later call.
void prepare_device_transport(Communicator& communicator, int device);

// An in-place all-reduce like Communicator::allreduce but with the step given by the caller
// instead of the name's call number (the Reducer's step counter seeds the random streams;
// every rank must pass the same step, which the call check verifies), and with `preset_error`
// (may be null) reported as this rank's argument error: the call check then makes every rank
// throw, which is how a rank that cannot take part in a call (a tensor never marked ready)
// fails the call everywhere instead of leaving the others waiting. Warm-up is the caller's
// business: spec.warmup is ignored.
CollectiveStats allreduce_at_step(Communicator& communicator, TensorView tensor,
                                  std::string_view name, const CompressionSpec& spec, ReduceOp op,
                                  std::uint32_t step, const Error* preset_error);

// An in-place all-reduce like Communicator::allreduce whose random streams and warm-up
// (spec.warmup) count `step`, given by the caller and the same on every rank (the call check
// verifies it), instead of the name's call number. The DDP hook passes its iteration: the
// draws then follow from the checkpointed iteration, so a job resumed from a checkpoint draws
// what the uninterrupted job would have, and a bucket renamed by DDP's rebuild keeps counting.
CollectiveStats allreduce_keyed_by_step(Communicator& communicator, TensorView tensor,
                                        std::string_view name, const CompressionSpec& spec,
                                        ReduceOp op, std::uint32_t step);
// The same for Communicator::reduce_scatter: the FSDP reduce-scatter passes its per-group
// iteration, so that a resumed job draws what the uninterrupted one would have.
CollectiveStats reduce_scatter_keyed_by_step(Communicator& communicator, TensorView tensor,
                                             std::string_view name, const CompressionSpec& spec,
                                             ReduceOp op, std::uint32_t step);

// Claims, for `communicator`'s release window, the random stream that `name` draws from under
// `seed` (collectives/random_streams.h): a different name in use in this process with the same
// stream key is refused with invalid_argument naming both (`who` names the caller). Calls
// claim their name themselves; this is for streams drawn outside a call (PowerSGD's first Q).
void claim_random_stream(Communicator& communicator, std::uint64_t seed, std::string_view name,
                         std::string_view who);

}  // namespace gradzip::collectives
