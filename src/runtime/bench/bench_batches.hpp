// Token batches for pope-bench: random tokens from a fixed seed, or windows of data.train.
#pragma once

#include <cstdint>
#include <vector>

#include "pope/config.hpp"

namespace pope {

// One micro-batch: inputs and targets [micro_batch_size × seq_len], host int32.
struct TokenBatch {
  std::vector<std::int32_t> inputs, targets;
};

// `count` distinct micro-batches of the config's shape. Random batches are windows of a
// uniform random token stream in [0, vocab_size) (targets = inputs shifted by one, as in
// real data); with use_data they are random windows of data.train (throws ConfigError when
// data.train is empty, DataError for a bad file).
std::vector<TokenBatch> make_token_batches(const RunConfig& config, int count, bool use_data, std::uint64_t seed);

}  // namespace pope
