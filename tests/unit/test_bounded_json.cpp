// The nesting bound of JSON read from users (config/bounded_json.hpp).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "config/bounded_json.hpp"

using namespace pope;

namespace {

std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

}  // namespace

TEST(ConfigJsonDepth, AcceptsTheLimitAndRefusesOneLevelMore) {
  EXPECT_FALSE(excess_json_nesting(nested_arrays(kMaxJsonDepth)));
  EXPECT_EQ(excess_json_nesting(nested_arrays(kMaxJsonDepth + 1)), std::size_t(kMaxJsonDepth));
  EXPECT_NO_THROW(parse_json(nested_arrays(kMaxJsonDepth)));
  // Depth is nesting, not the number of brackets.
  std::string siblings;
  for (int i = 0; i < 1000; ++i) siblings += nested_arrays(8) + ",";
  siblings.back() = ']';
  EXPECT_FALSE(excess_json_nesting("[" + siblings));
}

TEST(ConfigJsonDepth, BracketsInStringsDoNotCount) {
  const std::string text = R"({"a": ")" + std::string(1000, '[') + R"(\"[{", "b": [1]})";
  EXPECT_FALSE(excess_json_nesting(text));
  EXPECT_EQ(parse_json(text).at("b").at(0), 1);
}

// 100,000 levels overflowed the stack in dump() and in copies once parsed; now they never are.
TEST(ConfigJsonDepth, DeepTextIsASyntaxErrorNamingTheLine) {
  const std::string deep = "{\n\"x\": " + nested_arrays(100000) + "}";
  try {
    (void)parse_json(deep);
    ADD_FAILURE() << "expected a parse error";
  } catch (const nlohmann::json::parse_error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("nested deeper than 64 levels"), std::string::npos) << what;
    // The object is level 1, so the 64th '[' (column 5 + 64) opens level 65.
    EXPECT_NE(what.find("line 2, column 69"), std::string::npos) << what;
  }
  EXPECT_TRUE(parse_json(deep, nullptr, /*allow_exceptions=*/false).is_discarded());
  EXPECT_TRUE(parse_json("{\"x\": " + std::string(100000, '{'), nullptr, false).is_discarded());
}
