// The one seam between the algorithms and error feedback, and the one place that spells the
// residual keys.
//
// An algorithm encodes through the JobEncoder its job gives for each of its encodes
// (job_encoder(job, role, count)): with error feedback off that is the job's codec, with it on
// the error-feedback decorator (error_feedback/error_feedback_codec.h) bound to the residual of
// that role. No algorithm reads job.residuals or writes a residual key itself.
//
// Why roles: every encode that may drop information has a residual of its own, updated by that
// encode alone, so that summed over calls nothing is lost. A rank's encode of its own input
// (every algorithm) keeps the worker residual "<name>"; the algorithms that re-encode partial
// sums keep one more per re-encode. Each residual that is not the worker's is placed inside the
// worker's range (ResidualStore::set_placement), so that folding or resizing residuals keeps
// their mass at the right elements.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "collectives/collective_job.h"
#include "error_feedback/error_feedback_codec.h"
#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"

namespace gradzip::collectives {

// Whose encode a residual compensates, and so the residual's key (residual_key()).
enum class ResidualRole {
  worker,         // "<name>": a rank's encode of its own input or chunk of it (every algorithm)
  sra_server,     // "sra-server:<name>": SRA's owner's encode of its reduced chunk
  tree_root,      // "tree-root:<name>": the tree root's encode of the exact sum
  halving_step,   // "rhd-step<k>:<name>": halving/doubling's re-encode at halving step k >= 1
  halving_owner,  // "rhd-owner:<name>": halving/doubling's owner's encode of its reduced block
};

// The store key of `role`'s residual for job name `name` (`step`: halving_step's k, otherwise
// ignored). The keys are in checkpoints: changing one orphans the residuals saved under it.
std::string residual_key(ResidualRole role, std::string_view name, int step = 0);

// Job names that derive from a call's name, so that their residuals never meet another's:
// an all-gather of parameters ("allgather:<name>") never shares a residual with the reduction of
// the gradient of the same name, and the hierarchical all-reduce's cross-node stage
// ("<name>@hier") keeps a residual of its shard's size beside the flat path's of the tensor.
std::string allgather_job_name(std::string_view name);
std::string hierarchical_shard_job_name(std::string_view name);

// One encode of an algorithm: the codec alone, or through error feedback with the residual of
// one role (residual_count elements). Without error feedback it allocates nothing; it refers to
// the job's name, so it must not outlive the job. Not thread-safe (one per encoding thread).
class JobEncoder {
 public:
  // Whether error feedback is on: encode() then also fills `decoded`, from the decode the
  // residual update makes anyway; without it a caller that needs D(message) decodes itself.
  bool fills_decoded() const noexcept { return feedback_.has_value(); }

  // Registers (or checks the size of) the role's residual. Algorithms call it before posting
  // any request, so that a size mismatch throws on every rank before anyone waits for anyone.
  // Nothing without error feedback.
  void register_residual() const;

  // Records that the role's residual covers elements [offset, offset + residual_count) of the
  // job's worker residual (ResidualStore::set_placement). Nothing for the worker role itself
  // and without error feedback.
  void place_in_worker(std::size_t offset) const;

  // Encodes `chunk`, elements [ctx.element_offset, ctx.element_offset + chunk.count) of the
  // role's residual range, into `out` (at least the codec's max_encoded_bytes(chunk.count));
  // returns the message size. `decoded` (chunk.count floats, may be the chunk's own memory)
  // receives D(message) when fills_decoded(), and is left alone otherwise.
  std::size_t encode(ConstTensorView chunk, std::span<std::byte> out, const EncodeContext& ctx,
                     std::span<float> decoded = {});

 private:
  friend JobEncoder job_encoder(const ReduceJob& job, ResidualRole role,
                                std::size_t residual_count, int step);
  JobEncoder(const ReduceJob& job, ResidualRole role, std::size_t residual_count, int step);

  const Codec* codec_;
  error_feedback::ResidualStore* residuals_;  // null: error feedback off
  std::string_view worker_key_;  // job.name
  std::string key_;              // the role's residual key; empty without error feedback
  std::size_t residual_count_;
  bool is_worker_;
  std::optional<error_feedback::ErrorFeedbackCodec> feedback_;
};

// The encoder of `job` for `role` (`step`: halving_step's k).
JobEncoder job_encoder(const ReduceJob& job, ResidualRole role, std::size_t residual_count,
                       int step = 0);

// For composite algorithms (the hierarchical all-reduce): records that the worker residual of
// `inner`, a job over `outer`'s data from element `offset` on, lies inside `outer`'s worker
// residual. Nothing without error feedback.
void place_inner_job(const ReduceJob& outer, const ReduceJob& inner, std::size_t offset);

// For the algorithms that compensate no worker encode (the tree, the hierarchical node stage,
// halving/doubling outside its first step's sent range): adds the worker residual "<name>", when
// the store holds one (another algorithm's for the same name, or residuals folded into it by
// ResidualStore::fold_into), into job.data outside [keep_begin, keep_end) and zeroes it there,
// so its mass reaches the result instead of being stranded. The elements in [keep_begin,
// keep_end) keep their residual for an encode that compensates them. Host memory only
// (`algorithm` names the caller in the error otherwise).
void deliver_worker_residual(ReduceJob& job, std::string_view algorithm, std::size_t keep_begin = 0,
                             std::size_t keep_end = 0);

}  // namespace gradzip::collectives
