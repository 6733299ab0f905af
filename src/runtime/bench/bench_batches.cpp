#include "runtime/bench/bench_batches.hpp"

#include "pope/data.hpp"
#include "pope/rng.hpp"

namespace pope {

namespace {

TokenBatch random_batch(int vocab_size, int batch, int seq_len, Rng& rng) {
  TokenBatch out;
  out.inputs.reserve(std::size_t(batch) * seq_len);
  out.targets.reserve(out.inputs.capacity());
  for (int b = 0; b < batch; ++b) {
    auto token = static_cast<std::int32_t>(rng.below(std::uint64_t(vocab_size)));
    for (int t = 0; t < seq_len; ++t) {
      const auto next = static_cast<std::int32_t>(rng.below(std::uint64_t(vocab_size)));
      out.inputs.push_back(token);
      out.targets.push_back(next);
      token = next;
    }
  }
  return out;
}

}  // namespace

std::vector<TokenBatch> make_token_batches(const RunConfig& config, int count, bool use_data, std::uint64_t seed) {
  const int B = config.train.micro_batch_size, T = config.train.seq_len;
  std::vector<TokenBatch> batches;
  if (!use_data) {
    Rng rng(seed);
    for (int i = 0; i < count; ++i) batches.push_back(random_batch(config.model.vocab_size, B, T, rng));
    return batches;
  }
  if (config.data.train.empty())
    throw ConfigError("data.train", "--data needs a training token file in data.train (see data/README.md)");
  const TokenDataset dataset = TokenDataset::open(config.data.train, config.model.vocab_size);
  const RandomWindowSampler sampler(dataset, T, seed);
  for (int i = 0; i < count; ++i) {
    TokenBatch batch{std::vector<std::int32_t>(std::size_t(B) * T), std::vector<std::int32_t>(std::size_t(B) * T)};
    sampler.fill(std::uint64_t(i) * B, B, batch.inputs.data(), batch.targets.data());
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace pope
