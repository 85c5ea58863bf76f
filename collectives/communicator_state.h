// What a Communicator owns (internal to collectives/ and its tests): a few objects with one job
// each, made and kept together here. The layers above use the narrow interface of
// collectives/communicator_internal.h instead.
//   TransportSet     the world transport, node groups, NCCL transports, deadline, CUDA path
//   NameRegistry     call numbers per name, calls started, random streams, the release window
//   SpecCache        each spec text parsed and printed once
//   CodecCache       the codec of each spec
//   AutoModelCache   algo=auto's measured inputs and its choices
//   CallScratch      working memory kept between calls
// and the residual store and default spec. The checkpoint (save_checkpoint / load_checkpoint)
// is the one thing that spans several of them: the residuals, the call numbers and the model's
// inputs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "collectives/auto_model_cache.h"
#include "collectives/call_scratch.h"
#include "collectives/codec_cache.h"
#include "collectives/communicator_internal.h"
#include "collectives/name_registry.h"
#include "collectives/spec_cache.h"
#include "collectives/transport_set.h"
#include "error_feedback/residual_store.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

class CommunicatorState {
 public:
  // Resolves the default spec (GRADZIP_COMPRESSOR when set, else options.default_spec) and
  // parses it: a bad spec throws invalid_spec naming where it came from.
  CommunicatorState(std::unique_ptr<Transport> transport, CommunicatorOptions options);

  // The world transport (transports().world()), which most of the call path needs alone.
  Transport& transport() noexcept { return transports_.world(); }
  const Transport& transport() const noexcept { return transports_.world(); }
  TransportSet& transports() noexcept { return transports_; }
  const TransportSet& transports() const noexcept { return transports_; }
  const CompressionSpec& default_spec() const noexcept { return default_spec_; }
  error_feedback::ResidualStore& residuals() noexcept { return residuals_; }
  NameRegistry& names() noexcept { return names_; }
  const NameRegistry& names() const noexcept { return names_; }
  SpecCache& specs() noexcept { return specs_; }
  CodecCache& codecs() noexcept { return codecs_; }
  AutoModelCache& auto_model() noexcept { return auto_model_; }
  const AutoModelCache& auto_model() const noexcept { return auto_model_; }
  CallScratch& scratch() noexcept { return scratch_; }

  // Checkpoint of the residuals, call numbers and model inputs (Communicator::save_residuals /
  // load_residuals; collectives/checkpoint.h).
  void save_checkpoint(const std::string& path) const;
  void load_checkpoint(const std::string& path);

 private:
  // In the order they are made: each refers only to those above it.
  TransportSet transports_;
  CompressionSpec default_spec_;
  error_feedback::ResidualStore residuals_;
  NameRegistry names_;
  SpecCache specs_;
  CodecCache codecs_;
  AutoModelCache auto_model_;
  CallScratch scratch_;
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
