// The token sampler (pope/sample.hpp): greedy, temperature, top-k and nucleus truncation against
// the distributions they define, reproducibility per seed, and the options' refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pope/sample.hpp"

using namespace pope;

namespace {

// Frequencies of each token over `draws` draws.
std::vector<double> frequencies(const SamplingOptions& options, const std::vector<float>& logits, int draws) {
  TokenSampler sampler(options, 42);
  std::vector<double> counts(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) counts[std::size_t(sampler.next(logits))] += 1.0 / draws;
  return counts;
}

const std::vector<float> kLogits{std::log(0.5f), std::log(0.3f), std::log(0.2f)};

}  // namespace

TEST(TokenSampler, GreedyTakesTheMostLikelyTokenAndTheLowestIdOfTies) {
  TokenSampler greedy(SamplingOptions{.temperature = 0.0}, 1);
  EXPECT_EQ(greedy.next(std::vector<float>{0.1f, 2.0f, -1.0f}), 1);
  EXPECT_EQ(greedy.next(std::vector<float>{3.0f, 1.0f, 3.0f}), 0);
  TokenSampler top1(SamplingOptions{.temperature = 5.0, .top_k = 1}, 1);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(top1.next(kLogits), 0);
}

TEST(TokenSampler, DrawsFromTheSoftmaxAtTheTemperature) {
  const std::vector<double> plain = frequencies({}, kLogits, 40000);
  EXPECT_NEAR(plain[0], 0.5, 0.01);
  EXPECT_NEAR(plain[1], 0.3, 0.01);
  EXPECT_NEAR(plain[2], 0.2, 0.01);
  // Temperature 2: probabilities ∝ p^(1/2).
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  const std::vector<double> warm = frequencies({.temperature = 2.0}, kLogits, 40000);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(warm[std::size_t(i)], std::sqrt(double(std::exp(kLogits[std::size_t(i)]))) / z, 0.01);
}

TEST(TokenSampler, TopKAndTopPRenormaliseWhatTheyKeep) {
  const std::vector<double> top2 = frequencies({.top_k = 2}, kLogits, 40000);
  EXPECT_NEAR(top2[0], 0.625, 0.01);
  EXPECT_NEAR(top2[1], 0.375, 0.01);
  EXPECT_EQ(top2[2], 0.0);
  // p = 0.7: the 0.5 token alone falls short, with the 0.3 one the mass reaches 0.8.
  const std::vector<double> nucleus = frequencies({.top_p = 0.7}, kLogits, 40000);
  EXPECT_NEAR(nucleus[0], 0.625, 0.01);
  EXPECT_EQ(nucleus[2], 0.0);
  // p = 0.5 is reached by the first token alone; a tiny p keeps the most likely one.
  EXPECT_NEAR(frequencies({.top_p = 0.5}, kLogits, 2000)[0], 1.0, 1e-9);
  EXPECT_NEAR(frequencies({.top_p = 1e-9}, kLogits, 2000)[0], 1.0, 1e-9);
  const std::vector<double> both = frequencies({.top_k = 2, .top_p = 0.55}, kLogits, 2000);
  EXPECT_NEAR(both[0], 1.0, 1e-9);
}

TEST(TokenSampler, TheSameSeedDrawsTheSameTokens) {
  std::vector<float> logits(1000);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  for (const SamplingOptions& options : {SamplingOptions{}, SamplingOptions{.top_k = 50}, SamplingOptions{.top_p = 0.9}}) {
    TokenSampler a(options, 7), b(options, 7), c(options, 8);
    std::vector<std::int32_t> from_a, from_b, from_c;
    for (int i = 0; i < 100; ++i) {
      from_a.push_back(a.next(logits));
      from_b.push_back(b.next(logits));
      from_c.push_back(c.next(logits));
    }
    EXPECT_EQ(from_a, from_b);
    EXPECT_NE(from_a, from_c);
  }
}

TEST(TokenSampler, LogProbabilityIsTheLogSoftmax) {
  EXPECT_NEAR(token_log_probability(kLogits, 1), std::log(0.3), 1e-6);
  EXPECT_NEAR(token_log_probability(std::vector<float>{1000.0f, 0.0f}, 1), -1000.0, 1e-3);
  EXPECT_THROW(token_log_probability(kLogits, 3), std::invalid_argument);
}

TEST(TokenSampler, RefusesBadOptionsNamingThem) {
  auto message = [](const SamplingOptions& options) {
    try {
      check_sampling_options(options);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.temperature = -1.0}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({.temperature = INFINITY}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({.top_k = -2}).find("--top-k"), std::string::npos);
  EXPECT_NE(message({.top_p = 0.0}).find("--top-p"), std::string::npos);
  EXPECT_NE(message({.top_p = 1.5}).find("--top-p"), std::string::npos);
  EXPECT_EQ(message({}), "");
  TokenSampler sampler({}, 1);
  EXPECT_THROW(sampler.next(std::vector<float>{0.0f, NAN}), std::runtime_error);
}
