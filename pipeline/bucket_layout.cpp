#include "pipeline/bucket_layout.h"

#include <algorithm>

#include "collectives/call_check.h"

namespace gradzip::pipeline {
namespace {

constexpr std::size_t kF32Bytes = 4;

// The spec a tensor is reduced with, and the rule that says so.
struct TensorSpec {
  CompressionSpec spec;
  std::string rule;
};

TensorSpec spec_of(const RegisteredTensor& tensor, const ModelSpec& model) {
  const ModelSpec::Choice choice =
      model.spec_for(tensor.name, tensor.view.count, tensor.has_shape, tensor.shape);
  TensorSpec result{*choice.spec, choice.rule};
  const bool matrix = tensor.has_shape && tensor.shape.size() >= 2;
  if (result.spec.codec == CodecKind::powersgd && !matrix) {
    // PowerSGD needs a matrix; a vector in its rule is sent as it is.
    const CompressionSpec powersgd = result.spec;
    result.spec = CompressionSpec{};
    result.spec.seed = powersgd.seed;
    result.spec.min_bytes = powersgd.min_bytes;
    result.spec.algo = powersgd.algo;
    result.rule += " (not a matrix: none)";
  }
  return result;
}

std::vector<std::vector<std::size_t>> pack_buckets(const std::vector<RegisteredTensor>& tensors,
                                                   const LayoutOptions& options) {
  std::vector<std::vector<std::size_t>> buckets;
  std::size_t bytes = 0;
  for (std::size_t i = tensors.size(); i-- > 0;) {
    const std::size_t tensor_bytes = tensors[i].view.count * kF32Bytes;
    // The current bucket is buckets.back(): bucket 0 has the small limit.
    const std::size_t limit = buckets.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
    const bool fits = !buckets.empty() && bytes + tensor_bytes <= limit;
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += tensor_bytes;
  }
  return buckets;
}

void cut_into_chunks(GroupLayout& group, std::size_t chunk_bytes) {
  const std::size_t n = group.count;
  if (n == 0) return;
  const std::size_t per_chunk = std::max<std::size_t>(1, chunk_bytes / kF32Bytes);
  const std::size_t chunks = (n + per_chunk - 1) / per_chunk;
  for (std::size_t c = 0; c < chunks; ++c) {
    // c * n < chunks * n: no overflow while n * n / per_chunk < 2^64, i.e. for any gradient
    // a host can hold (n < 2^32 elements at one-element chunks, far more at real chunk sizes).
    const std::size_t begin = c * n / chunks;
    const std::size_t end = (c + 1) * n / chunks;
    group.chunks.push_back(ChunkLayout{group.name + "/chunk" + std::to_string(c), begin, end - begin, 0});
  }
}

}  // namespace

std::vector<BucketLayout> make_layout(const std::vector<RegisteredTensor>& tensors,
                                      const ModelSpec& model, const LayoutOptions& options) {
  std::vector<BucketLayout> layout;
  int next_lane = 0;
  for (std::vector<std::size_t>& members : pack_buckets(tensors, options)) {
    BucketLayout bucket;
    bucket.tensors = std::move(members);
    const std::string bucket_name = "bucket" + std::to_string(layout.size());
    std::vector<std::string> group_keys;
    for (const std::size_t index : bucket.tensors) {
      const RegisteredTensor& tensor = tensors[index];
      bucket.bytes += tensor.view.count * kF32Bytes;
      TensorSpec tensor_spec = spec_of(tensor, model);
      const std::string key = tensor_spec.spec.to_string() + "|" + tensor_spec.rule;
      auto found = std::find(group_keys.begin(), group_keys.end(), key);
      if (found == group_keys.end()) {
        group_keys.push_back(key);
        GroupLayout group;
        group.name = bucket_name + "/group" + std::to_string(bucket.groups.size());
        group.spec = tensor_spec.spec;
        group.rule = tensor_spec.rule;
        bucket.groups.push_back(std::move(group));
        found = group_keys.end() - 1;
      }
      GroupLayout& group = bucket.groups[static_cast<std::size_t>(found - group_keys.begin())];
      group.tensors.push_back(index);
      group.tensor_offsets.push_back(group.count);
      group.count += tensor.view.count;
    }
    for (GroupLayout& group : bucket.groups) {
      cut_into_chunks(group, options.chunk_bytes);
      for (ChunkLayout& chunk : group.chunks) {
        chunk.lane = next_lane;
        next_lane = (next_lane + 1) % std::max(1, options.lanes);
      }
    }
    layout.push_back(std::move(bucket));
  }
  return layout;
}

std::uint64_t layout_fingerprint(const std::vector<RegisteredTensor>& tensors,
                                 const ModelSpec& model, const LayoutOptions& options) {
  std::string text = model.to_string();
  text += detail::concat("|", options.first_bucket_bytes, "|", options.bucket_bytes, "|",
                         options.chunk_bytes, "|", options.lanes);
  for (const RegisteredTensor& tensor : tensors) {
    text += detail::concat("|", tensor.name, ":", tensor.view.count, ":",
                           static_cast<int>(tensor.view.dtype), ":", tensor.has_shape ? 1 : 0);
    for (const std::size_t extent : tensor.shape) text += detail::concat("x", extent);
  }
  return collectives::fingerprint64(text);
}

}  // namespace gradzip::pipeline
