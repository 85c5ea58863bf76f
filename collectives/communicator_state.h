// What a Communicator owns (internal to collectives/ and its tests): the transport, the
// error-feedback residuals, the per-name call counters, cached codecs and the node /
// cross-node transports of the hierarchical all-reduce. The layers above use the narrow
// interface of collectives/communicator_internal.h instead.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/checkpoint.h"
#include "collectives/communicator_internal.h"
#include "collectives/cost_model.h"
#include "collectives/device_memory.h"
#include "collectives/random_streams.h"
#include "collectives/transport/transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

class CommunicatorState {
 public:
  // Resolves the default spec (GRADZIP_COMPRESSOR when set, else options.default_spec) and
  // parses it: a bad spec throws invalid_spec naming where it came from.
  CommunicatorState(std::unique_ptr<Transport> transport, CommunicatorOptions options);

  Transport& transport() noexcept { return *transport_; }
  const Transport& transport() const noexcept { return *transport_; }
  const CompressionSpec& default_spec() const noexcept { return default_spec_; }
  error_feedback::ResidualStore& residuals() noexcept { return residuals_; }

  // How many calls with this name passed the call check so far: the call number of the next
  // one, which Communicator calls use as EncodeContext::step (allreduce_at_step passes its
  // own). Counted per name across allreduce, reduce_scatter and allgather; wraps at 2^32.
  std::uint32_t call_number_of(std::string_view name) const;
  void count_call(std::string_view name);

  // Opens call number calls_started() (every collective, on every rank, in the same order):
  // at the end of each window of release_unused_after_calls calls, releases the residuals and
  // call numbers of the names no call used in that window (CommunicatorOptions), then stamps
  // this call's uses with its number.
  void start_call();
  std::uint64_t calls_started() const noexcept { return calls_started_; }
  // Records that `name` draws from random_stream_of(seed, name) (at the current call, for the
  // release window) and returns nothing; or, when a different name in use in this process holds
  // that stream's key (their random numbers would coincide), returns that name and records
  // nothing (collectives/random_streams.h). The claim is process-wide, so ranks may decide
  // differently; callers report the refusal as this rank's argument error, which the call
  // check turns into an error on every rank.
  std::optional<std::string> claim_random_stream(std::uint64_t seed, std::string_view name);

  // Residuals released by start_call so far (the first release also writes one warning to
  // stderr naming them: a name that comes back starts error feedback anew).
  std::uint64_t released_residuals() const noexcept { return released_residuals_; }

  // Checkpoint of the residuals, call numbers and model inputs (Communicator::save_residuals /
  // load_residuals; collectives/checkpoint.h).
  void save_checkpoint(const std::string& path) const;
  void load_checkpoint(const std::string& path);

  // The codec of a spec, made once per canonical spec string and kept (at most
  // kMaxCachedCodecs; the cache starts over when full).
  const Codec& codec_for(const CompressionSpec& spec);

  // The transports of the hierarchical all-reduce for `ranks_per_node` (0: nodes from shared
  // memory; L: ranks [kL, (k+1)L) form node k), made on first use and kept. Collective: every
  // rank must ask for the same value in the same call.
  struct NodeTransports {
    std::unique_ptr<Transport> intra;  // the ranks of this node, by world rank
    std::unique_ptr<Transport> inter;  // the ranks with this rank's node-local rank, one per node
  };
  NodeTransports& node_transports(std::uint32_t ranks_per_node);

  // The link algo=auto's cost model assumes: CommunicatorOptions::link_* or GRADZIP_LINK when
  // given, else measured by measure_link over transport() at the first call and kept (a
  // collective: every rank must ask in the same call). known_link() is it when it is known
  // without measuring (given, or measured already).
  const LinkModel& model_link();
  const std::optional<LinkModel>& known_link() const noexcept { return link_; }
  // Sets the link (the Reducer gives its lanes the user communicator's); every rank must set
  // the same.
  void set_link(const LinkModel& link) {
    link_ = link;
    forget_auto_choices();
  }
  // γ of `spec`'s codec as every rank agrees on it (agreed_codec_cost), measured at the first
  // call per canonical spec and kept (a collective, like model_link).
  const CodecCost& model_codec_cost(const CompressionSpec& spec);
  // The node structure of `ranks_per_node` (node_transports; 0: the ranks that share memory,
  // whose size is detected here) as algo=auto's model sees it: nullopt when the hierarchical
  // all-reduce is no candidate (one node, one rank per node, or nodes of unequal size); else
  // the ranks per node, the link inside a node (measure_link over `intra`) and across nodes
  // (over `inter`, all inter groups at once, as the hierarchical all-reduce runs them), each
  // agreed by every rank. Made at the first call per value and kept (a collective over
  // transport(), like model_link).
  const std::optional<AutoHierarchy>& model_hierarchy(std::uint32_t ranks_per_node);
  // Sets the node structure of `ranks_per_node` (the Reducer gives its lanes the user
  // communicator's); every rank must set the same.
  void set_hierarchy(std::uint32_t ranks_per_node, const std::optional<AutoHierarchy>& hierarchy) {
    hierarchies_[ranks_per_node] = hierarchy;
    forget_auto_choices();
  }
  // algo=auto's choices by canonical spec text and element count: once the model's inputs are
  // measured they do not change, so each (spec, count) is decided once (about 3 µs saved per
  // call). Cleared when the inputs change (set_link, set_hierarchy, adopt_auto_model_inputs) and when
  // it holds kMaxCachedChoices choices. cache_auto_choice returns the stored choice, valid
  // until the cache is next cleared.
  const AllreduceChoice* cached_auto_choice(std::string_view spec_text, std::size_t count) const;
  const AllreduceChoice& cache_auto_choice(std::string_view spec_text, std::size_t count,
                                           AllreduceChoice choice);
  // algo=auto's model inputs (the link when known, every γ measured, the node structures that
  // were formed), and their replacement: a run restarted from a checkpoint
  // (collectives/checkpoint.h) makes the same choices as the run that saved it, whatever its
  // own measurements would have said. Adopting keeps inputs `inputs` does not have.
  AutoModelInputs auto_model_inputs() const;
  void adopt_auto_model_inputs(const AutoModelInputs& inputs);

  // f32 scratch for f16 / bf16 tensors, grown as needed and kept between calls.
  std::vector<float>& f32_scratch() noexcept { return f32_scratch_; }
  // Host copy of CUDA tensors reduced over the host transport (their dtype's bytes), grown as
  // needed and kept between calls.
  std::vector<std::byte>& host_staging() noexcept { return host_staging_; }

  CudaPath cuda_path() const noexcept { return cuda_path_; }
  // The deadline of every wait (CommunicatorOptions::timeout_seconds / on_timeout,
  // GRADZIP_TIMEOUT_S), applied to transport() and to every transport made from it here.
  const DeadlinePolicy& deadline_policy() const noexcept { return deadline_policy_; }
  // The NCCL transport of CUDA device `device` over this communicator's ranks, made at the first
  // call (a collective over transport(): every rank asks in the same call) and kept; for a
  // communicator made from an ncclComm_t (transport().device_only() >= 0), that transport.
  Transport& nccl_transport(int device);
  // Makes, now, the transport this communicator's CUDA calls on `device` would use over NCCL
  // (nccl_transport(device), or the transport itself when it is NCCL) and connects it eagerly
  // (Transport::connect_eagerly). Collective: every rank calls it together. Nothing happens
  // when CUDA calls would be staged through host memory (cuda_path staged, no NCCL in the
  // build). The Reducer calls it for every lane, in lane order, before any lane runs.
  void prepare_device_transport(int device);
  // f32 working memory on CUDA device `device` for f16 / bf16 tensors on the NCCL path, at
  // least `count` floats, kept between calls.
  float* device_f32_scratch(int device, std::size_t count);

 private:
  // The size of the node of ranks that share memory (node_transports(0)) when every rank's
  // node has that size, else 0 (a collective over transport()).
  std::uint32_t shared_memory_node_size();
  // Empties the cache of algo=auto's choices (its inputs changed, or it is full).
  void forget_auto_choices() noexcept {
    auto_choices_.clear();
    auto_choice_count_ = 0;
  }

  static constexpr std::size_t kMaxCachedCodecs = 64;
  static constexpr std::size_t kMaxCachedChoices = 4096;

  std::unique_ptr<Transport> transport_;
  CompressionSpec default_spec_;
  error_feedback::ResidualStore residuals_;
  struct NameUse {
    std::uint32_t call_number = 0;  // of the name's next call
    std::uint64_t last_use = 0;     // the communicator call that last counted it
  };
  std::map<std::string, NameUse, std::less<>> call_numbers_;
  // The stream keys this communicator's names hold (claim_random_stream).
  RandomStreamClaims stream_claims_;
  std::uint64_t calls_started_ = 0;
  std::map<std::string, std::unique_ptr<Codec>, std::less<>> codecs_;
  std::map<std::uint32_t, NodeTransports> nodes_;
  std::optional<LinkModel> link_;
  std::map<std::string, CodecCost, std::less<>> codec_costs_;
  std::map<std::uint32_t, std::optional<AutoHierarchy>> hierarchies_;
  std::map<std::string, std::map<std::size_t, AllreduceChoice>, std::less<>> auto_choices_;
  std::size_t auto_choice_count_ = 0;
  std::vector<float> f32_scratch_;
  std::vector<std::byte> host_staging_;
  CudaPath cuda_path_ = CudaPath::automatic;
  std::uint64_t release_window_ = 0;  // CommunicatorOptions::release_unused_after_calls
  std::uint64_t released_residuals_ = 0;
  bool warned_release_ = false;
  DeadlinePolicy deadline_policy_;
  std::map<int, std::unique_ptr<Transport>> nccl_transports_;
  std::map<int, std::unique_ptr<DeviceAllocation>> device_scratch_;
};

// The private constructor and state of a Communicator, for collectives/ (and its tests).
struct CommunicatorAccess {
  static Communicator wrap(std::unique_ptr<CommunicatorState> state) {
    return Communicator(std::move(state));
  }
  static CommunicatorState& state(Communicator& communicator) noexcept {
    return *communicator.state_;
  }
};

inline CommunicatorState& state_of(Communicator& communicator) noexcept {
  return CommunicatorAccess::state(communicator);
}

// allreduce_at_step (collectives/communicator_internal.h) on the state itself.
CollectiveStats allreduce_at_step(CommunicatorState& state, TensorView tensor, std::string_view name,
                                  const CompressionSpec& spec, ReduceOp op, std::uint32_t step,
                                  const Error* preset_error);
// allreduce_keyed_by_step (collectives/communicator_internal.h) on the state itself.
CollectiveStats allreduce_keyed_by_step(CommunicatorState& state, TensorView tensor,
                                        std::string_view name, const CompressionSpec& spec,
                                        ReduceOp op, std::uint32_t step);
// reduce_scatter_keyed_by_step (collectives/communicator_internal.h) on the state itself.
CollectiveStats reduce_scatter_keyed_by_step(CommunicatorState& state, TensorView tensor,
                                             std::string_view name, const CompressionSpec& spec,
                                             ReduceOp op, std::uint32_t step);

}  // namespace gradzip::collectives
