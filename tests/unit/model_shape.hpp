// Small GPT shapes for tests: one place that fills a ModelConfig's sizes, so that each test
// states only the shape it needs (and says why) and the encoding it runs.
#pragma once

#include <string>
#include <vector>

#include "pope/config.hpp"
#include "pope/position.hpp"

namespace pope::testing {

struct ModelShape {
  int vocab_size = 64;
  int padded_vocab_size = 64;
  int n_layer = 2;
  int n_head = 2;
  int n_embd = 16;
  int context_length = 16;
};

inline ModelConfig model_config(const ModelShape& shape, const std::string& position_kind) {
  ModelConfig c;
  c.vocab_size = shape.vocab_size;
  c.padded_vocab_size = shape.padded_vocab_size;
  c.n_layer = shape.n_layer;
  c.n_head = shape.n_head;
  c.n_embd = shape.n_embd;
  c.context_length = shape.context_length;
  c.position.kind = position_kind;
  return c;
}

// The decode suites' cases: every registered kind, then kDynamicNtkCase, RoPE with dynamic NTK
// (the one scaling that no model.position.kind names).
inline constexpr const char* kDynamicNtkCase = "rope_dynamic_ntk";

inline std::vector<std::string> decode_cases() {
  std::vector<std::string> cases = position_kinds();
  cases.emplace_back(kDynamicNtkCase);
  return cases;
}

// model_config for a decode case. kDynamicNtkCase has one layer: past the training length a full
// forward feeds every row's later layers inputs computed at the new length, while a cache keeps
// the values and raw keys its rows had at their own lengths (it encodes only those keys again), so
// the two agree only in the first layer.
inline ModelConfig decode_case_config(const ModelShape& shape, const std::string& name) {
  const bool dynamic_ntk = name == kDynamicNtkCase;
  ModelConfig c = model_config(shape, dynamic_ntk ? "rope" : name);
  if (dynamic_ntk) {
    c.position.rope.scaling.kind = RopeScalingKind::dynamic_ntk;
    c.n_layer = 1;
  }
  return c;
}

// 2 layers of width 8 over a 29-token vocabulary padded to 32: the CPU gradient-check size.
inline constexpr ModelShape kTinyShape{.vocab_size = 29, .padded_vocab_size = 32, .n_layer = 2, .n_head = 2,
                                       .n_embd = 8, .context_length = 8};
// 256 wide (head_dim 64, as in every paper model) over 500 tokens: the GPU-vs-CPU size.
inline constexpr ModelShape kGpuTestShape{.vocab_size = 500, .padded_vocab_size = 512, .n_layer = 2, .n_head = 4,
                                          .n_embd = 256, .context_length = 128};

}  // namespace pope::testing
