// algo=auto's model for one Communicator (internal to collectives/): its inputs, measured over
// the communicator's transports at the first call that needs each and then kept (the link, γ of
// each codec, the node structures), and the choices made from them per (spec, count). Every
// method that may measure is a collective over the world transport: every rank calls it in the
// same call with the same arguments (the call check compared them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "collectives/algorithm_choice.h"
#include "collectives/checkpoint.h"
#include "collectives/codec_cache.h"
#include "collectives/cost_model.h"
#include "collectives/transport_set.h"
#include "gradzip/communicator.h"

namespace gradzip::collectives {

class AutoModelCache {
 public:
  static constexpr std::size_t kMaxCachedCosts = CodecCache::kMaxCachedCodecs;
  static constexpr std::size_t kMaxCachedChoices = 4096;

  // The link comes from GRADZIP_LINK when set, else CommunicatorOptions::link_* when given,
  // else it is measured at the first call that needs it. `transports` and `codecs` must
  // outlive the cache.
  AutoModelCache(TransportSet& transports, CodecCache& codecs, const CommunicatorOptions& options);

  // algo=auto's all-reduce choice for `count` elements under `spec` (canonical text
  // `spec_text`) at call number `step`, where auto_uses_model says the model decides: measures
  // what the model still lacks, decides once per (spec, count) and keeps the choice (once the
  // inputs are measured they do not change; about 3 µs saved per call). The reference is valid
  // until the cache is next cleared (set_link, set_hierarchy, adopt, or kMaxCachedChoices).
  const AllreduceChoice& choice(const CompressionSpec& spec, std::string_view spec_text,
                                std::size_t count, std::uint32_t step);

  // The link the model assumes (given, or measured by measure_link over the world transport at
  // the first call and kept). known_link() is it when known without measuring.
  const LinkModel& link();
  const std::optional<LinkModel>& known_link() const noexcept { return link_; }
  // Sets the link (the Reducer gives its lanes the user communicator's); every rank must set
  // the same.
  void set_link(const LinkModel& link);
  // γ of `spec`'s codec as every rank agrees on it (agreed_codec_cost), measured at the first
  // call per canonical spec and kept.
  const CodecCost& codec_cost(const CompressionSpec& spec);
  // The node structure of `ranks_per_node` (TransportSet::node_transports; 0: the ranks that
  // share memory, whose size is detected here) as the model sees it: nullopt when the
  // hierarchical all-reduce is no candidate (one node, one rank per node, or nodes of unequal
  // size); else the ranks per node, the link inside a node (measure_link over `intra`) and
  // across nodes (over `inter`, all inter groups at once, as the hierarchical all-reduce runs
  // them), each agreed by every rank. Made at the first call per value and kept.
  const std::optional<AutoHierarchy>& hierarchy(std::uint32_t ranks_per_node);
  // Sets the node structure of `ranks_per_node` (the Reducer gives its lanes the user
  // communicator's); every rank must set the same.
  void set_hierarchy(std::uint32_t ranks_per_node, const std::optional<AutoHierarchy>& hierarchy);

  // The model's inputs (the link when known, every γ measured, the node structures that were
  // formed), and their replacement: a run restarted from a checkpoint (collectives/checkpoint.h)
  // makes the same choices as the run that saved it, whatever its own measurements would have
  // said. Adopting keeps inputs `inputs` does not have.
  AutoModelInputs inputs() const;
  void adopt(const AutoModelInputs& inputs);

 private:
  void forget_choices() noexcept {
    choices_.clear();
    choice_count_ = 0;
  }

  TransportSet& transports_;
  CodecCache& codecs_;
  std::optional<LinkModel> link_;
  std::map<std::string, CodecCost, std::less<>> codec_costs_;
  std::map<std::uint32_t, std::optional<AutoHierarchy>> hierarchies_;
  std::map<std::string, std::map<std::size_t, AllreduceChoice>, std::less<>> choices_;
  std::size_t choice_count_ = 0;
};

}  // namespace gradzip::collectives
