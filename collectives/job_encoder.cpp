#include "collectives/job_encoder.h"

#include <memory>
#include <vector>

#include "gradzip/error.h"

namespace gradzip::collectives {

std::string residual_key(ResidualRole role, std::string_view name, int step) {
  const std::string tensor(name);
  switch (role) {
    case ResidualRole::worker: return tensor;
    case ResidualRole::sra_server: return "sra-server:" + tensor;
    case ResidualRole::tree_root: return "tree-root:" + tensor;
    case ResidualRole::halving_step: return "rhd-step" + std::to_string(step) + ":" + tensor;
    case ResidualRole::halving_owner: return "rhd-owner:" + tensor;
  }
  GZ_THROW(ErrorCode::internal, "residual_key: unknown role ", static_cast<int>(role));
}

std::string allgather_job_name(std::string_view name) { return "allgather:" + std::string(name); }

std::string hierarchical_shard_job_name(std::string_view name) { return std::string(name) + "@hier"; }

JobEncoder::JobEncoder(const ReduceJob& job, ResidualRole role, std::size_t residual_count, int step)
    : codec_(&job.codec),
      residuals_(job.residuals),
      worker_key_(job.name),
      residual_count_(residual_count),
      is_worker_(role == ResidualRole::worker) {
  if (residuals_ == nullptr) return;  // the codec alone: no key, no decorator
  key_ = residual_key(role, job.name, step);
  // g' = g + e is formed in a per-thread scratch kept across calls, so that encoding a large
  // tensor does not fault in fresh pages every call; one thread encodes one chunk at a time.
  thread_local std::vector<float> scratch;
  // Aliasing constructor: a shared_ptr that points at job.codec and owns nothing (the job's
  // codec outlives the call).
  feedback_.emplace(std::shared_ptr<const Codec>(std::shared_ptr<const Codec>(), &job.codec),
                    *residuals_, &scratch);
}

JobEncoder job_encoder(const ReduceJob& job, ResidualRole role, std::size_t residual_count, int step) {
  return JobEncoder(job, role, residual_count, step);
}

void JobEncoder::register_residual() const {
  if (residuals_ != nullptr) residuals_->register_tensor(key_, residual_count_);
}

void JobEncoder::place_in_worker(std::size_t offset) const {
  if (residuals_ != nullptr && !is_worker_) residuals_->set_placement(key_, worker_key_, offset);
}

std::size_t JobEncoder::encode(ConstTensorView chunk, std::span<std::byte> out,
                               const EncodeContext& ctx, std::span<float> decoded) {
  if (!feedback_) return codec_->encode(chunk, out, ctx);
  return feedback_->encode_chunk(key_, residual_count_, chunk, out, ctx, decoded);
}

void place_inner_job(const ReduceJob& outer, const ReduceJob& inner, std::size_t offset) {
  if (outer.residuals != nullptr) outer.residuals->set_placement(inner.name, outer.name, offset);
}

void deliver_worker_residual(ReduceJob& job, std::string_view algorithm, std::size_t keep_begin,
                             std::size_t keep_end) {
  if (job.residuals == nullptr || !job.residuals->contains(job.name)) return;
  GZ_REQUIRE(job.device.kind == DeviceKind::cpu, ErrorCode::internal, algorithm, " of '", job.name,
             "': runs on host memory (the Communicator stages CUDA tensors)");
  const std::size_t count = job.data.size();
  const std::span<float> worker = job.residuals->residual(job.name, count);
  for (std::size_t i = 0; i < count; ++i) {
    if (i >= keep_begin && i < keep_end) continue;
    job.data[i] += worker[i];
    worker[i] = 0.0f;
  }
}

}  // namespace gradzip::collectives
