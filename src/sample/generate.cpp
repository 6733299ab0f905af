// The decode loop: the prompt in one call (prefill), then one new token per sequence per call;
// greedy decoding keeps the chosen tokens on the backend and queues each step one ahead.
#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

#include "pope/sample.hpp"

namespace pope {

GenerationStats generate(Model& model, std::span<const std::int32_t> prompt, int sequences, int max_new_tokens,
                         const SamplingOptions& options, std::uint64_t seed,
                         const std::function<bool(int sequence, const GeneratedToken& token)>& on_token) {
  check_sampling_options(options);
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty: generation needs at least one token");
  if (sequences <= 0) throw std::invalid_argument(fmt::format("{} sequences: expected at least 1", sequences));
  if (max_new_tokens < 0) throw std::invalid_argument(fmt::format("{} new tokens: expected ≥ 0", max_new_tokens));
  const int P = int(prompt.size());
  std::unique_ptr<KvCache> cache = model.make_kv_cache(sequences, P + max_new_tokens);
  std::vector<TokenSampler> samplers;
  for (int s = 0; s < sequences; ++s) samplers.emplace_back(options, seed + std::uint64_t(s));
  std::vector<bool> running(std::size_t(sequences), true);
  const std::size_t V = std::size_t(model.config().vocab_size);
  using Clock = std::chrono::steady_clock;
  GenerationStats stats;

  // Hands one step's tokens to on_token, in sequence order; false once no sequence runs.
  auto deliver = [&](const auto& token_of) {
    bool any = false;
    for (int s = 0; s < sequences; ++s) {
      const GeneratedToken token = token_of(s);
      if (!running[std::size_t(s)]) continue;
      ++stats.new_tokens;
      running[std::size_t(s)] = on_token(s, token);
      any = any || running[std::size_t(s)];
    }
    return any;
  };

  std::vector<std::int32_t> input;
  for (int s = 0; s < sequences; ++s) input.insert(input.end(), prompt.begin(), prompt.end());
  stats.prompt_tokens = long(P) * sequences;
  auto start = Clock::now();
  if (options.temperature == 0.0) {
    model.queue_greedy(*cache, input, P);
    Model::GreedyChoice chosen = model.read_greedy(*cache);
    stats.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    start = Clock::now();
    for (int step = 0; step < max_new_tokens; ++step) {
      const bool more = step + 1 < max_new_tokens;
      if (more) model.queue_greedy(*cache);  // computed while this step's tokens are handed out
      const bool any = deliver([&](int s) {
        return GeneratedToken{chosen.ids[std::size_t(s)], {}, chosen.log_probs[std::size_t(s)]};
      });
      if (more) chosen = model.read_greedy(*cache);  // also when stopping: nothing is left queued
      if (!any || !more) break;
    }
  } else {
    std::vector<float> logits = model.decode(*cache, input, P);
    stats.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    start = Clock::now();
    input.assign(std::size_t(sequences), 0);
    for (int step = 0; step < max_new_tokens; ++step) {
      const bool any = deliver([&](int s) {
        const std::span<const float> row(logits.data() + std::size_t(s) * V, V);
        GeneratedToken token{samplers[std::size_t(s)].next(row), row, 0.0};
        input[std::size_t(s)] = token.id;  // a finished sequence keeps decoding its last token, unread
        return token;
      });
      if (!any || step + 1 == max_new_tokens) break;
      logits = model.decode(*cache, input, 1);
    }
  }
  stats.decode_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace pope
