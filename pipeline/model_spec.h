// The model spec of a Reducer: one compression spec for the whole model plus rules that give
// tensors other specs by shape, size or name. Grammar (also in include/gradzip/reducer.h):
//
//   model_spec := spec { ';' rule }
//   rule       := condition '->' spec
//   condition  := 'dims<=1' | 'bytes<' N | 'name=' GLOB | '*'
//
// Spaces around specs, conditions, '->' and ';' are ignored. GLOB: '*' matches any run of
// characters (the empty one too), '?' exactly one, everything else itself.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradzip/compression_spec.h"

namespace gradzip::pipeline {

enum class RuleCondition {
  dims_at_most_one,  // registered with a shape of 0 or 1 dimensions (not: without a shape)
  bytes_below,       // count * 4 < bytes
  name_glob,         // the name matches glob
  any,               // every tensor
};

struct TensorRule {
  RuleCondition condition = RuleCondition::any;
  std::size_t bytes = 0;  // bytes_below
  std::string glob;       // name_glob
  CompressionSpec spec;
  // Canonical text, "condition->canonical spec", e.g. "dims<=1->none:ef=off,...".
  std::string to_string() const;
  bool matches(std::string_view name, std::size_t count, bool has_shape,
               std::span<const std::size_t> shape) const;
  bool operator==(const TensorRule&) const = default;
};

struct ModelSpec {
  CompressionSpec model;
  std::vector<TensorRule> rules;  // in the order they are tried

  // Parses `text` (grammar above); with `default_rules`, appends "dims<=1->none" and
  // "bytes<MIN->none" (MIN = model.min_bytes) after the given rules. Empty text (or only
  // spaces) stands for `fallback`. Throws ErrorCode::invalid_spec naming the rule (its
  // position and text) and what is accepted.
  static ModelSpec parse(std::string_view text, bool default_rules,
                         const CompressionSpec& fallback);

  struct Choice {
    const CompressionSpec* spec = nullptr;  // points into this ModelSpec
    std::string rule;                       // TensorRule::to_string(), or "model"
  };
  // The spec of a tensor: the first matching rule's, else the model's.
  Choice spec_for(std::string_view name, std::size_t count, bool has_shape,
                  std::span<const std::size_t> shape) const;

  // "model;rule;rule..." with canonical parts: parse(to_string(), false, ...) == *this.
  std::string to_string() const;
  bool operator==(const ModelSpec&) const = default;
};

// Whether `text` matches `pattern` ('*' any run, '?' one character).
bool glob_match(std::string_view pattern, std::string_view text) noexcept;

}  // namespace gradzip::pipeline
