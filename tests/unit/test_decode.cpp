// Incremental decoding with the key/value cache (Model::decode, Backend::attention_decode on the
// CPU) for every encoding of the registry and RoPE with dynamic NTK (its cached keys encoded again
// at every length; one layer, see decode_case_config): each step's logits equal a full forward's
// over the same tokens, prefill in one call or in pieces, within the training length and past it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "model_shape.hpp"
#include "pope/backend.hpp"
#include "pope/model.hpp"
#include "pope/position.hpp"
#include "pope/rng.hpp"

using namespace pope;

namespace {

constexpr int kBatch = 2;

ModelConfig decode_model(const std::string& name, int context_length) {
  // Head dim 8 takes every method's constraints (RoPE pairs, PJ-rotary blocks of 4 at K = 1).
  return pope::testing::decode_case_config(
      {.vocab_size = 61, .padded_vocab_size = 64, .n_layer = 2, .n_head = 2, .n_embd = 16,
       .context_length = context_length},
      name);
}

// Initialised weights moved off their exact initial values (zero T5 buckets, zero PoPE δ), so
// that every parameter shapes the logits.
void perturb(Model& model, std::uint64_t seed) {
  std::vector<float> values = model.parameters_to_host();
  Rng rng(seed);
  for (float& v : values) v += float(0.1 * rng.normal());
  model.parameters_from_host(values);
}

std::vector<std::int32_t> random_tokens(int count, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  for (auto& t : tokens) t = std::int32_t(rng.below(std::uint64_t(vocab)));
  return tokens;
}

// The first `length` tokens of every sequence of `tokens` ([kBatch, total]).
std::vector<std::int32_t> prefix(const std::vector<std::int32_t>& tokens, int total, int length) {
  std::vector<std::int32_t> out;
  for (int b = 0; b < kBatch; ++b)
    out.insert(out.end(), tokens.begin() + b * total, tokens.begin() + b * total + length);
  return out;
}

// Tokens [first, first + n) of every sequence.
std::vector<std::int32_t> slice(const std::vector<std::int32_t>& tokens, int total, int first, int n) {
  std::vector<std::int32_t> out;
  for (int b = 0; b < kBatch; ++b)
    out.insert(out.end(), tokens.begin() + b * total + first, tokens.begin() + b * total + first + n);
  return out;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0.0, error = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, double(std::abs(want[i])));
    error = std::max(error, double(std::abs(got[i] - want[i])));
  }
  return error / std::max(scale, 1e-30);
}

class DecodeSuite : public ::testing::TestWithParam<std::string> {
 protected:
  // Decodes `total` tokens per sequence in the pieces `steps` (their sum is total) and checks
  // every piece's logits against a full forward over the tokens up to it: the last row of each
  // sequence, and with all_rows every new row.
  void expect_decode_matches_full_forward(int context_length, int total, const std::vector<int>& steps,
                                          const char* precision, double tolerance) {
    const ModelConfig config = decode_model(GetParam(), context_length);
    auto backend = make_backend(DeviceChoice::cpu, precision, 1);
    Model model(config, *backend);
    model.initialize(3);
    perturb(model, 5);
    const std::vector<std::int32_t> tokens = random_tokens(kBatch * total, config.vocab_size, 7);
    const std::size_t V = std::size_t(config.vocab_size);
    for (bool all_rows : {false, true}) {
      auto cache = model.make_kv_cache(kBatch, total);
      int done = 0;
      for (int n : steps) {
        const std::vector<float> got = model.decode(*cache, slice(tokens, total, done, n), n, all_rows);
        done += n;
        ASSERT_EQ(cache->length(), done);
        // The full forward over positions [0, done): what the new rows' logits must be.
        std::vector<std::int64_t> rows;
        for (int b = 0; b < kBatch; ++b)
          for (int i = all_rows ? done - n : done - 1; i < done; ++i) rows.push_back(std::int64_t(b) * done + i);
        const std::vector<float> want = model.logits_at(prefix(tokens, total, done).data(), kBatch, done, rows);
        ASSERT_EQ(got.size(), rows.size() * V);
        EXPECT_LT(max_relative_error(got, want), tolerance)
            << GetParam() << " " << precision << ": positions up to " << done << (all_rows ? " (all rows)" : "");
      }
    }
  }
};

TEST_P(DecodeSuite, StepLogitsEqualTheFullForwardInDouble) {
  expect_decode_matches_full_forward(16, 12, {5, 1, 3, 1, 1, 1}, "double", 1e-12);
}

TEST_P(DecodeSuite, StepLogitsEqualTheFullForwardInFloat) {
  expect_decode_matches_full_forward(16, 12, {1, 1, 4, 6}, "float", 1e-5);
}

// Past the training length: positions 0..19 of a model trained at 8, for every encoding that
// is defined there; the others refuse the cache, saying why.
TEST_P(DecodeSuite, PastTheTrainingLengthOrRefused) {
  const ModelConfig config = decode_model(GetParam(), 8);
  if (make_position_encoding(config)->extrapolates()) {
    expect_decode_matches_full_forward(8, 20, {6, 1, 1, 10, 1, 1}, "double", 1e-12);
    return;
  }
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(config, *backend);
  try {
    (void)model.make_kv_cache(1, 9);
    FAIL() << GetParam() << " accepted 9 positions past its training length 8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("training length 8"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((void)model.make_kv_cache(1, 8));
}

INSTANTIATE_TEST_SUITE_P(Registry, DecodeSuite, ::testing::ValuesIn(pope::testing::decode_cases()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Decode, RefusesCallsTheCacheCannotHold) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(decode_model("pope", 16), *backend);
  model.initialize(1);
  auto cache = model.make_kv_cache(1, 4);
  EXPECT_THROW(model.decode(*cache, std::vector<std::int32_t>{1, 2, 3, 4, 5}, 5), std::invalid_argument);
  EXPECT_THROW(model.decode(*cache, std::vector<std::int32_t>{1, 2}, 3), std::invalid_argument);  // 2 ≠ 1 × 3
  EXPECT_THROW(model.decode(*cache, std::vector<std::int32_t>{61}, 1), std::invalid_argument);     // outside vocab
  EXPECT_EQ(cache->length(), 0);
  EXPECT_EQ(model.decode(*cache, std::vector<std::int32_t>{1, 2, 3, 4}, 4).size(), 61u);
  EXPECT_THROW(model.decode(*cache, std::vector<std::int32_t>{1}, 1), std::invalid_argument);  // full
  cache->clear();
  EXPECT_NO_THROW(model.decode(*cache, std::vector<std::int32_t>{1}, 1));
  EXPECT_THROW(model.make_kv_cache(0, 4), std::invalid_argument);
}

// Greedy choices kept on the backend (Model::queue_greedy, one step queued ahead) give the
// tokens and log-probabilities that decode()'s host logits give, for a batch of sequences.
TEST(Decode, GreedyOnTheBackendEqualsTheHostArgmax) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(decode_model("pope", 32), *backend);
  model.initialize(3);
  perturb(model, 4);
  const int prompt_length = 5, steps = 9;
  const std::vector<std::int32_t> prompt = random_tokens(kBatch * prompt_length, 61, 5);

  auto host_cache = model.make_kv_cache(kBatch, prompt_length + steps);
  std::vector<std::vector<std::int32_t>> want_ids;
  std::vector<std::vector<double>> want_log_probs;
  std::vector<float> logits = model.decode(*host_cache, prompt, prompt_length);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int32_t> ids;
    std::vector<double> log_probs;
    for (int b = 0; b < kBatch; ++b) {
      const std::span<const float> row(logits.data() + b * 61, 61);
      ids.push_back(std::int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
      double sum = 0.0;
      for (float x : row) sum += std::exp(double(x) - double(row[std::size_t(ids.back())]));
      log_probs.push_back(-std::log(sum));
    }
    want_ids.push_back(ids);
    want_log_probs.push_back(log_probs);
    logits = model.decode(*host_cache, ids, 1);
  }

  auto cache = model.make_kv_cache(kBatch, prompt_length + steps);
  model.queue_greedy(*cache, prompt, prompt_length);
  for (int step = 0; step < steps; ++step) {
    model.queue_greedy(*cache);  // one ahead: queued before this step's choice is read
    const Model::GreedyChoice got = model.read_greedy(*cache);
    EXPECT_EQ(got.ids, want_ids[std::size_t(step)]) << "step " << step;
    for (int b = 0; b < kBatch; ++b)
      EXPECT_NEAR(got.log_probs[std::size_t(b)], want_log_probs[std::size_t(step)][std::size_t(b)], 1e-5);
  }
  EXPECT_EQ(model.read_greedy(*cache).ids.size(), std::size_t(kBatch));
  EXPECT_EQ(cache->length(), prompt_length + steps);
}

TEST(Decode, GreedyRefusesCallsOutOfOrder) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(decode_model("rope", 16), *backend);
  model.initialize(1);
  auto cache = model.make_kv_cache(1, 8);
  EXPECT_THROW(model.queue_greedy(*cache), std::invalid_argument);  // nothing chose its tokens yet
  EXPECT_THROW(model.read_greedy(*cache), std::invalid_argument);   // nothing queued
  model.queue_greedy(*cache, std::vector<std::int32_t>{1, 2}, 2);
  model.queue_greedy(*cache);
  EXPECT_THROW(model.queue_greedy(*cache), std::invalid_argument);  // two unread
  EXPECT_THROW(model.decode(*cache, std::vector<std::int32_t>{1}, 1), std::invalid_argument);
  model.read_greedy(*cache);
  model.read_greedy(*cache);
  model.decode(*cache, std::vector<std::int32_t>{1}, 1);
  EXPECT_THROW(model.queue_greedy(*cache), std::invalid_argument);  // decode() fed host tokens
  cache->clear();
  EXPECT_THROW(model.queue_greedy(*cache), std::invalid_argument);
}

}  // namespace
