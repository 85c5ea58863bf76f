#include "pipeline/model_spec.h"

#include <charconv>
#include <cstdint>

#include "gradzip/error.h"

namespace gradzip::pipeline {
namespace {

constexpr std::string_view kAcceptedConditions =
    "'dims<=1', 'bytes<N', 'name=GLOB' or '*'";

std::string_view trim(std::string_view text) noexcept {
  const auto first = text.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\n\r");
  return text.substr(first, last - first + 1);
}

// `rule_text` is the rule as written, `position` its 1-based number among the rules: both go
// into every error so a user finds the rule in a long spec.
TensorRule parse_rule(std::string_view rule_text, std::size_t position) {
  const std::string_view rule = trim(rule_text);
  GZ_REQUIRE(!rule.empty(), ErrorCode::invalid_spec, "model spec: rule ", position,
             " is empty (two ';' in a row, or a trailing ';')");
  const auto arrow = rule.find("->");
  GZ_REQUIRE(arrow != std::string_view::npos, ErrorCode::invalid_spec, "model spec: rule ",
             position, " '", rule, "' has no '->' (a rule is CONDITION->SPEC, with CONDITION ",
             kAcceptedConditions, ")");
  const std::string_view condition = trim(rule.substr(0, arrow));
  const std::string_view spec_text = trim(rule.substr(arrow + 2));

  TensorRule result;
  if (condition == "*") {
    result.condition = RuleCondition::any;
  } else if (condition == "dims<=1") {
    result.condition = RuleCondition::dims_at_most_one;
  } else if (condition.starts_with("bytes<")) {
    const std::string_view number = trim(condition.substr(6));
    std::uint64_t bytes = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), bytes);
    GZ_REQUIRE(!number.empty() && error == std::errc() && end == number.data() + number.size(),
               ErrorCode::invalid_spec, "model spec: rule ", position, " '", rule,
               "': 'bytes<' needs a non-negative integer, got '", number, "'");
    result.condition = RuleCondition::bytes_below;
    result.bytes = bytes;
  } else if (condition.starts_with("name=")) {
    const std::string_view glob = trim(condition.substr(5));
    GZ_REQUIRE(!glob.empty(), ErrorCode::invalid_spec, "model spec: rule ", position, " '", rule,
               "': 'name=' needs a pattern");
    result.condition = RuleCondition::name_glob;
    result.glob = std::string(glob);
  } else {
    GZ_THROW(ErrorCode::invalid_spec, "model spec: rule ", position, " '", rule,
             "': unknown condition '", condition, "'; accepted: ", kAcceptedConditions);
  }
  try {
    result.spec = CompressionSpec::parse(spec_text);
  } catch (const Error& error) {
    GZ_THROW(ErrorCode::invalid_spec, "model spec: rule ", position, " '", rule, "': ", error.what());
  }
  return result;
}

TensorRule default_rule(RuleCondition condition, std::size_t bytes) {
  TensorRule rule;
  rule.condition = condition;
  rule.bytes = bytes;
  rule.spec = CompressionSpec::parse("none");
  return rule;
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) noexcept {
  // Greedy matching with one backtrack point (the last '*'): linear in practice, and exact for
  // patterns of '*', '?' and literals.
  std::size_t p = 0, t = 0;
  std::size_t star = std::string_view::npos, star_text = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string TensorRule::to_string() const {
  std::string condition_text;
  switch (condition) {
    case RuleCondition::any: condition_text = "*"; break;
    case RuleCondition::dims_at_most_one: condition_text = "dims<=1"; break;
    case RuleCondition::bytes_below: condition_text = detail::concat("bytes<", bytes); break;
    case RuleCondition::name_glob: condition_text = "name=" + glob; break;
  }
  return condition_text + "->" + spec.to_string();
}

bool TensorRule::matches(std::string_view name, std::size_t count, bool has_shape,
                         std::span<const std::size_t> shape) const {
  switch (condition) {
    case RuleCondition::any: return true;
    case RuleCondition::dims_at_most_one: return has_shape && shape.size() <= 1;
    // count * 4 < bytes without overflow for any count.
    case RuleCondition::bytes_below: return count < bytes / 4 + (bytes % 4 != 0);
    case RuleCondition::name_glob: return glob_match(glob, name);
  }
  return false;
}

ModelSpec ModelSpec::parse(std::string_view text, bool default_rules,
                           const CompressionSpec& fallback) {
  ModelSpec result;
  const std::string_view whole = trim(text);
  const auto first_separator = whole.find(';');
  const std::string_view model_text = trim(whole.substr(0, first_separator));
  if (model_text.empty()) {
    GZ_REQUIRE(first_separator == std::string_view::npos, ErrorCode::invalid_spec,
               "model spec '", whole, "': rules without a model spec before the first ';'");
    result.model = fallback;
  } else {
    try {
      result.model = CompressionSpec::parse(model_text);
    } catch (const Error& error) {
      GZ_THROW(ErrorCode::invalid_spec, "model spec: the model spec '", model_text,
               "' (before the first ';'): ", error.what());
    }
  }
  if (first_separator != std::string_view::npos) {
    std::string_view rest = whole.substr(first_separator + 1);
    for (std::size_t position = 1;; ++position) {
      const auto separator = rest.find(';');
      result.rules.push_back(parse_rule(rest.substr(0, separator), position));
      if (separator == std::string_view::npos) break;
      rest = rest.substr(separator + 1);
    }
  }
  if (default_rules) {
    result.rules.push_back(default_rule(RuleCondition::dims_at_most_one, 0));
    result.rules.push_back(default_rule(RuleCondition::bytes_below, result.model.min_bytes));
  }
  return result;
}

ModelSpec::Choice ModelSpec::spec_for(std::string_view name, std::size_t count, bool has_shape,
                                      std::span<const std::size_t> shape) const {
  for (const TensorRule& rule : rules)
    if (rule.matches(name, count, has_shape, shape)) return Choice{&rule.spec, rule.to_string()};
  return Choice{&model, "model"};
}

std::string ModelSpec::to_string() const {
  std::string out = model.to_string();
  for (const TensorRule& rule : rules) {
    out += ';';
    out += rule.to_string();
  }
  return out;
}

}  // namespace gradzip::pipeline
