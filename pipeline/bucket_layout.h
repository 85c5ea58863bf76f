// How a Reducer's registered tensors are laid out for communication: buckets (launch units),
// groups (tensors of one spec, packed into one f32 buffer) and chunks (one all-reduce each).
// A pure function of the registrations and the options, so every rank that registered the same
// tensors computes the same layout (checked across ranks by the Reducer through fingerprint()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gradzip/compression_spec.h"
#include "gradzip/tensor_view.h"
#include "pipeline/model_spec.h"

namespace gradzip::pipeline {

struct RegisteredTensor {
  std::string name;
  TensorView view;
  bool has_shape = false;
  std::vector<std::size_t> shape;
};

// Elements [group_begin, group_begin + count) of a group's buffer, one all-reduce.
struct ChunkLayout {
  std::string name;          // "bucket<b>/group<g>/chunk<c>": keys residuals and the call check
  std::size_t group_begin = 0;
  std::size_t count = 0;
  int lane = 0;              // fixed for the life of the layout (residuals stay on one lane)
};

struct GroupLayout {
  std::string name;              // "bucket<b>/group<g>"
  CompressionSpec spec;          // from the model spec's rules (before warm-up and ramp)
  std::string rule;              // which rule chose it ("model" or the rule's text)
  std::vector<std::size_t> tensors;         // registration indices, in bucket order
  std::vector<std::size_t> tensor_offsets;  // element offset of each tensor in the buffer
  std::size_t count = 0;                    // elements of the buffer
  std::vector<ChunkLayout> chunks;          // covers [0, count) in order; empty when count == 0
};

struct BucketLayout {
  std::vector<std::size_t> tensors;  // registration indices, in launch (reverse) order
  std::size_t bytes = 0;             // f32 bytes
  std::vector<GroupLayout> groups;   // in order of their first tensor in the bucket
};

struct LayoutOptions {
  std::size_t first_bucket_bytes = 0;
  std::size_t bucket_bytes = 0;
  std::size_t chunk_bytes = 0;  // >= 4
  int lanes = 1;
};

// Buckets: walking `tensors` from last to first, a tensor joins the current bucket while the
// bucket's f32 bytes stay within the limit (first_bucket_bytes for bucket 0, bucket_bytes
// after); otherwise it starts the next bucket (an empty bucket always takes the tensor, so a
// tensor larger than the limit gets a bucket of its own). Groups: a tensor's spec is
// model.spec_for(...); a powersgd spec applies to tensors with a shape of >= 2 dimensions
// and others in such a rule get codec none (error feedback off). Chunks: a group of n
// elements is cut into ceil(n / (chunk_bytes / 4)) chunks, chunk c covering
// [floor(c n / C), floor((c + 1) n / C)). Lanes: the chunks of all buckets, numbered in
// launch order, go to lanes 0, 1, ..., lanes-1, 0, ...
std::vector<BucketLayout> make_layout(const std::vector<RegisteredTensor>& tensors,
                                      const ModelSpec& model, const LayoutOptions& options);

// A 64-bit fingerprint of everything that must agree across ranks: the registrations (names,
// counts, dtypes, shapes, in order), the model spec and the options.
std::uint64_t layout_fingerprint(const std::vector<RegisteredTensor>& tensors,
                                 const ModelSpec& model, const LayoutOptions& options);

}  // namespace gradzip::pipeline
