// make_position_encoding: each kind builds the right encoding with the configured options,
// bad options surface as ConfigError naming the key, NoPE keeps every default.
#include <gtest/gtest.h>

#include <utility>

#include "position/encodings.hpp"
#include "position_test_support.hpp"

using namespace pope;
using namespace pope::testing;

namespace {

ModelConfig model_with(const std::string& kind) {
  ModelConfig config;
  config.n_head = 4;
  config.n_embd = 256;  // head_dim 64
  config.position.kind = kind;
  return config;
}

}  // namespace

TEST(PositionFactory, BuildsEachKind) {
  for (const char* kind : {"nope", "rope", "pope", "alibi"})
    EXPECT_EQ(make_position_encoding(model_with(kind))->kind(), kind);
}

TEST(PositionFactory, PassesTheOptionsThrough) {
  ModelConfig config = model_with("pope");
  config.position.pope.learn_delta = false;
  EXPECT_TRUE(make_position_encoding(config)->layer_parameters(4, 64).empty());
  config.position.pope.learn_delta = true;
  EXPECT_EQ(make_position_encoding(config)->layer_parameters(4, 64).size(), 1u);

  config = model_with("alibi");
  config.position.alibi.head_fraction = 0.5;
  std::vector<double> table(3);
  make_position_encoding(config)->score_bias(make_context(3, 64, 4), 2, ParamValues<double>{}, table.data());
  EXPECT_EQ(table[2], 0.0);  // head 2 of 4 has no slope with half the heads biased

  config = model_with("rope");
  config.position.rope.scaling.kind = RopeScalingKind::yarn;
  config.position.rope.scaling.factor = 4.0;
  EXPECT_GT(make_position_encoding(config)->softmax_scale(make_context(8, 64)), 0.125);
}

TEST(PositionFactory, UnknownKindNamesTheKeyAndTheKnownKinds) {
  try {
    make_position_encoding(model_with("sinusoidal"));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "model.position.kind");
    const std::string message = e.what();
    for (const char* kind : {"sinusoidal", "nope", "rope", "pope", "alibi"})
      EXPECT_NE(message.find(kind), std::string::npos) << message;
  }
}

TEST(PositionFactory, RopeFractionIsCheckedAgainstTheHeadDim) {
  ModelConfig config = model_with("rope");
  config.position.rope.fraction = 0.3;  // 19.2 of 64 channels
  try {
    make_position_encoding(config);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "model.position.rope.fraction");
  }
}

TEST(PositionFactory, NopeKeepsEveryDefault) {
  const auto nope = make_position_encoding(model_with("nope"));
  EXPECT_FALSE(nope->transforms_qk());
  EXPECT_FALSE(nope->has_score_bias());
  EXPECT_EQ(nope->qk_width(64), 64);
  EXPECT_TRUE(nope->layer_parameters(4, 64).empty());
  EXPECT_DOUBLE_EQ(nope->softmax_scale(make_context(8, 64)), 0.125);
  EXPECT_THROW(transform_rows(*nope, make_context(1, 4), 0, false, std::vector<double>(4), 4), std::logic_error);
}
