// Model specs of the Reducer (pipeline/model_spec.h): the model's spec and its rules parse to
// the documented conditions and specs, rules are tried in order with the default rules last,
// the canonical string round-trips, empty text stands for the fallback, bad rules are refused
// with invalid_spec naming the rule, and glob_match follows '*' / '?'.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "pipeline/model_spec.h"
#include "tests/unit/test_support.h"

namespace gradzip::pipeline {
namespace {

// A fallback no test text spells, so that "the fallback was used" is visible.
const CompressionSpec kFallback = CompressionSpec::parse("qsgd:bits=3,seed=77");

CompressionSpec spec_of(const char* text) { return CompressionSpec::parse(text); }

// The canonical text of a rule: "condition->canonical spec".
std::string rule_text(std::string_view condition, const char* spec) {
  std::string text(condition);
  text += "->";
  text += spec_of(spec).to_string();
  return text;
}

// The spec a tensor gets, with its rule text, for a tensor of `shape` (registered with it).
ModelSpec::Choice choice_for(const ModelSpec& model, std::string_view name,
                             std::vector<std::size_t> shape) {
  std::size_t count = 1;
  for (std::size_t extent : shape) count *= extent;
  return model.spec_for(name, count, true, shape);
}

TEST(ModelSpec, ModelSpecAloneHasNoRulesWithoutDefaults) {
  const ModelSpec model = ModelSpec::parse("topk:ratio=0.05", false, kFallback);
  EXPECT_EQ(model.model, spec_of("topk:ratio=0.05"));
  EXPECT_TRUE(model.rules.empty());
  // No rule: every tensor, 1-D and tiny ones too, gets the model's spec, chosen by "model".
  const std::array<std::size_t, 1> bias{3};
  const ModelSpec::Choice choice = model.spec_for("fc.bias", 3, true, bias);
  ASSERT_NE(choice.spec, nullptr);
  EXPECT_EQ(choice.spec, &model.model) << "points into the ModelSpec";
  EXPECT_EQ(choice.rule, "model");
}

TEST(ModelSpec, EveryConditionKindParses) {
  const ModelSpec model = ModelSpec::parse(
      "topk;dims<=1->none;bytes<4096->fp16;name=layer?.*.bias->bf16;*->qsgd:bits=4", false,
      kFallback);
  EXPECT_EQ(model.model, spec_of("topk"));
  ASSERT_EQ(model.rules.size(), 4u);

  EXPECT_EQ(model.rules[0].condition, RuleCondition::dims_at_most_one);
  EXPECT_EQ(model.rules[0].spec, spec_of("none"));

  EXPECT_EQ(model.rules[1].condition, RuleCondition::bytes_below);
  EXPECT_EQ(model.rules[1].bytes, 4096u);
  EXPECT_EQ(model.rules[1].spec, spec_of("fp16"));

  EXPECT_EQ(model.rules[2].condition, RuleCondition::name_glob);
  EXPECT_EQ(model.rules[2].glob, "layer?.*.bias");
  EXPECT_EQ(model.rules[2].spec, spec_of("bf16"));

  EXPECT_EQ(model.rules[3].condition, RuleCondition::any);
  EXPECT_EQ(model.rules[3].spec, spec_of("qsgd:bits=4"));
}

TEST(ModelSpec, ConditionsMatchAsDocumented) {
  const ModelSpec model = ModelSpec::parse(
      "none;dims<=1->fp16;bytes<4096->bf16;name=*.bias->qsgd:bits=4;*->sign", false, kFallback);
  const TensorRule& dims = model.rules[0];
  const TensorRule& bytes = model.rules[1];
  const TensorRule& name = model.rules[2];
  const TensorRule& any = model.rules[3];
  const std::vector<std::size_t> scalar{};
  const std::vector<std::size_t> vector{5000};
  const std::vector<std::size_t> matrix{50, 100};

  // dims<=1: a shape of 0 or 1 dimensions; a tensor registered without a shape is not taken.
  EXPECT_TRUE(dims.matches("s", 1, true, scalar));
  EXPECT_TRUE(dims.matches("v", 5000, true, vector));
  EXPECT_FALSE(dims.matches("m", 5000, true, matrix));
  EXPECT_FALSE(dims.matches("no-shape", 5000, false, {}));

  // bytes<4096: count * 4 < 4096, i.e. count <= 1023, whatever the shape.
  EXPECT_TRUE(bytes.matches("m", 1023, true, std::vector<std::size_t>{1023, 1}));
  EXPECT_FALSE(bytes.matches("m", 1024, true, std::vector<std::size_t>{1024, 1}));
  EXPECT_TRUE(bytes.matches("no-shape", 0, false, {}));
  EXPECT_FALSE(bytes.matches("no-shape", 1024, false, {}));

  // name=*.bias: the whole name against the glob.
  EXPECT_TRUE(name.matches("layer1.bias", 5000, true, matrix));
  EXPECT_TRUE(name.matches(".bias", 5000, false, {}));
  EXPECT_FALSE(name.matches("layer1.bias2", 5000, true, vector));
  EXPECT_FALSE(name.matches("layer1.weight", 5000, true, vector));

  // '*': every tensor.
  EXPECT_TRUE(any.matches("anything", 0, false, {}));
  EXPECT_TRUE(any.matches("m", 5000, true, matrix));
}

TEST(ModelSpec, SpacesAroundPartsAreIgnored) {
  const ModelSpec spaced = ModelSpec::parse(
      "  topk:ratio=0.01 ;  name=*.bias  ->  none ;dims<=1->  fp16  ;  bytes<100 ->bf16 ; * -> "
      "sign ",
      false, kFallback);
  const ModelSpec tight = ModelSpec::parse(
      "topk:ratio=0.01;name=*.bias->none;dims<=1->fp16;bytes<100->bf16;*->sign", false, kFallback);
  EXPECT_EQ(spaced, tight);
  ASSERT_EQ(spaced.rules.size(), 4u);
  EXPECT_EQ(spaced.rules[0].glob, "*.bias") << "the glob is trimmed";
  EXPECT_EQ(spaced.rules[2].bytes, 100u);
}

TEST(ModelSpec, TheFirstMatchingRuleWins) {
  const ModelSpec bias_first =
      ModelSpec::parse("topk;name=*.bias->fp16;dims<=1->bf16", false, kFallback);
  const ModelSpec dims_first =
      ModelSpec::parse("topk;dims<=1->bf16;name=*.bias->fp16", false, kFallback);

  // A 1-D bias matches both rules: the first one listed decides.
  ModelSpec::Choice choice = choice_for(bias_first, "fc.bias", {10});
  EXPECT_EQ(*choice.spec, spec_of("fp16"));
  EXPECT_EQ(choice.rule, bias_first.rules[0].to_string());
  EXPECT_EQ(choice.spec, &bias_first.rules[0].spec) << "points into the ModelSpec";
  choice = choice_for(dims_first, "fc.bias", {10});
  EXPECT_EQ(*choice.spec, spec_of("bf16"));
  EXPECT_EQ(choice.rule, dims_first.rules[0].to_string());

  // A 1-D tensor of another name: the dims rule in both orders.
  EXPECT_EQ(*choice_for(bias_first, "norm.weight", {10}).spec, spec_of("bf16"));
  EXPECT_EQ(*choice_for(dims_first, "norm.weight", {10}).spec, spec_of("bf16"));

  // A matrix no rule takes: the model's spec.
  choice = choice_for(bias_first, "fc.weight", {10, 10});
  EXPECT_EQ(choice.spec, &bias_first.model);
  EXPECT_EQ(choice.rule, "model");
}

TEST(ModelSpec, DefaultRulesFollowTheGivenOnesWithTheModelsMinBytes) {
  const ModelSpec model =
      ModelSpec::parse("topk:ratio=0.01,min_bytes=8192;name=*.bias->fp16", true, kFallback);
  ASSERT_EQ(model.rules.size(), 3u);
  EXPECT_EQ(model.rules[0].condition, RuleCondition::name_glob);
  EXPECT_EQ(model.rules[1].condition, RuleCondition::dims_at_most_one);
  EXPECT_EQ(model.rules[1].spec, spec_of("none"));
  EXPECT_EQ(model.rules[2].condition, RuleCondition::bytes_below);
  EXPECT_EQ(model.rules[2].bytes, 8192u);
  EXPECT_EQ(model.rules[2].spec, spec_of("none"));
  EXPECT_EQ(model.rules[1].to_string(), rule_text("dims<=1", "none"));
  EXPECT_EQ(model.rules[2].to_string(), rule_text("bytes<8192", "none"));

  // The given rule comes first: a 1-D bias gets fp16, another 1-D tensor none, a matrix under
  // 8192 bytes (2047 elements * 4 = 8188) none, one of 8192 bytes the model's top-k.
  EXPECT_EQ(*choice_for(model, "fc.bias", {10}).spec, spec_of("fp16"));
  EXPECT_EQ(choice_for(model, "norm.weight", {10}).rule, model.rules[1].to_string());
  const ModelSpec::Choice small = choice_for(model, "small", {23, 89});
  EXPECT_EQ(*small.spec, spec_of("none"));
  EXPECT_EQ(small.rule, model.rules[2].to_string());
  const ModelSpec::Choice large = choice_for(model, "large", {32, 64});
  EXPECT_EQ(large.spec, &model.model);
  EXPECT_EQ(large.rule, "model");

  // The model's default min_bytes (65536) when the spec does not set it.
  const ModelSpec defaulted = ModelSpec::parse("topk", true, kFallback);
  ASSERT_EQ(defaulted.rules.size(), 2u);
  EXPECT_EQ(defaulted.rules[1].bytes, 65536u);
  EXPECT_EQ(defaulted.rules[1].bytes, defaulted.model.min_bytes);
}

TEST(ModelSpec, CanonicalStringRoundTrips) {
  for (const char* text :
       {"none", "topk:ratio=0.01,warmup=100; name=*.bias->none; dims<=1->fp16",
        "qsgd:bits=4;bytes<1000->bf16;*->sign", "powersgd:rank=2;name=emb?.w*->topk:k=3",
        "fp16:min_bytes=1"}) {
    for (const bool default_rules : {false, true}) {
      SCOPED_TRACE(::testing::Message() << text << " default_rules=" << default_rules);
      const ModelSpec model = ModelSpec::parse(text, default_rules, kFallback);
      const std::string canonical = model.to_string();
      // The defaults are part of the canonical text, so it parses back without adding them.
      EXPECT_EQ(ModelSpec::parse(canonical, false, kFallback), model) << canonical;
      // Canonical parts: the model's canonical spec, then each rule's canonical text.
      std::string expected = model.model.to_string();
      for (const TensorRule& rule : model.rules) {
        expected += ';';
        expected += rule.to_string();
      }
      EXPECT_EQ(canonical, expected);
    }
  }
  const ModelSpec model = ModelSpec::parse("none;name=a*->fp16;bytes<12->bf16;*->sign", false, kFallback);
  EXPECT_EQ(model.rules[0].to_string(), rule_text("name=a*", "fp16"));
  EXPECT_EQ(model.rules[1].to_string(), rule_text("bytes<12", "bf16"));
  EXPECT_EQ(model.rules[2].to_string(), rule_text("*", "sign"));
}

TEST(ModelSpec, EmptyTextStandsForTheFallback) {
  for (const char* text : {"", "   "}) {
    SCOPED_TRACE(::testing::Message() << "'" << text << "'");
    const ModelSpec bare = ModelSpec::parse(text, false, kFallback);
    EXPECT_EQ(bare.model, kFallback);
    EXPECT_TRUE(bare.rules.empty());
    // With the default rules: the same two rules as after any model spec, MIN = the fallback's
    // min_bytes.
    const ModelSpec with_defaults = ModelSpec::parse(text, true, kFallback);
    EXPECT_EQ(with_defaults.model, kFallback);
    EXPECT_EQ(with_defaults, ModelSpec::parse(kFallback.to_string(), true, kFallback));
  }
}

struct BadModelSpec {
  const char* text;
  const char* rule_text;  // the rule the error must name ("" when the rule is empty)
};

class BadModelSpecTest : public ::testing::TestWithParam<BadModelSpec> {};

TEST_P(BadModelSpecTest, IsRefusedNamingTheRule) {
  const BadModelSpec& bad = GetParam();
  for (const bool default_rules : {false, true}) {
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { ModelSpec::parse(bad.text, default_rules, kFallback); },
                                     &message),
              ErrorCode::invalid_spec)
        << bad.text;
    EXPECT_NE(message.find(bad.rule_text), std::string::npos)
        << "error for '" << bad.text << "' does not name '" << bad.rule_text << "': " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadModelSpecTest,
    ::testing::Values(
        BadModelSpec{"topk;dims<=1 none", "dims<=1 none"},         // missing '->'
        BadModelSpec{"topk;name=*.bias", "name=*.bias"},           // missing '->' and spec
        BadModelSpec{"topk;ndims<=1->none", "ndims<=1"},           // unknown condition
        BadModelSpec{"topk;dims<=2->none", "dims<=2"},             // unknown condition
        BadModelSpec{"topk;size>10->none", "size>10"},             // unknown condition
        BadModelSpec{"topk;bytes<abc->none", "bytes<abc"},         // bad number
        BadModelSpec{"topk;bytes<->none", "bytes<->none"},         // no number
        BadModelSpec{"topk;bytes<-5->none", "bytes<-5"},           // negative
        BadModelSpec{"topk;bytes<12x->none", "bytes<12x"},         // trailing junk
        BadModelSpec{"topk;dims<=1->zip", "dims<=1->zip"},         // bad spec inside a rule
        BadModelSpec{"topk;*->topk:ratio=2", "*->topk:ratio=2"},   // bad value inside a rule
        BadModelSpec{"topk;dims<=1->", "dims<=1->"},               // empty spec inside a rule
        BadModelSpec{"topk;->none", "->none"},                     // empty condition
        BadModelSpec{"topk;;dims<=1->none", ""},                   // empty rule
        BadModelSpec{"topk;dims<=1->none;", ""},                   // empty last rule
        BadModelSpec{"topk; ;dims<=1->none", ""},                  // a rule of only spaces
        BadModelSpec{"zip;dims<=1->none", "zip"}));                // bad model spec

TEST(GlobMatch, StarQuestionMarkAndLiterals) {
  // '*' matches any run, the empty one too.
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*", "layer1.weight"));
  EXPECT_TRUE(glob_match("**", "x"));
  EXPECT_TRUE(glob_match("*.bias", "layer1.bias"));
  EXPECT_TRUE(glob_match("*.bias", ".bias"));
  EXPECT_FALSE(glob_match("*.bias", "layer1.bias2"));
  EXPECT_FALSE(glob_match("*.bias", "layer1_bias"));
  EXPECT_TRUE(glob_match("layer*.weight", "layer12.weight"));
  EXPECT_TRUE(glob_match("a*", "a"));
  EXPECT_TRUE(glob_match("*a*b*", "xxaybz"));
  EXPECT_FALSE(glob_match("*a*b*", "xxbyaz"));
  // A '*' that must give characters back: "*ab" against "aab", "a*b*c" against "abcbc".
  EXPECT_TRUE(glob_match("*ab", "aab"));
  EXPECT_TRUE(glob_match("a*b*c", "abcbc"));
  EXPECT_FALSE(glob_match("a*b*c", "abcb"));
  // '?' matches exactly one character.
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_TRUE(glob_match("a?c", "a.c"));
  EXPECT_FALSE(glob_match("a?c", "ac"));
  EXPECT_FALSE(glob_match("a?c", "abbc"));
  EXPECT_FALSE(glob_match("?", ""));
  EXPECT_TRUE(glob_match("?*", "x"));
  EXPECT_FALSE(glob_match("?*", ""));
  // The empty pattern matches only the empty name.
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "a"));
  // Everything else is literal and the whole name must match.
  EXPECT_TRUE(glob_match("fc.weight", "fc.weight"));
  EXPECT_FALSE(glob_match("fc.weight", "fc.weights"));
  EXPECT_FALSE(glob_match("fc.weight", "xfc.weight"));
  EXPECT_FALSE(glob_match("a.c", "abc"));
  EXPECT_FALSE(glob_match("Fc", "fc"));
}

}  // namespace
}  // namespace gradzip::pipeline
