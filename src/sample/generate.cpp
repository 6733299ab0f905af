// The decode loop: the prompt in one call (prefill), then one new token per sequence per call.
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

  std::vector<std::int32_t> input;
  for (int s = 0; s < sequences; ++s) input.insert(input.end(), prompt.begin(), prompt.end());
  auto start = Clock::now();
  std::vector<float> logits = model.decode(*cache, input, P);
  stats.prefill_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats.prompt_tokens = long(P) * sequences;

  start = Clock::now();
  input.assign(std::size_t(sequences), 0);
  for (int step = 0; step < max_new_tokens; ++step) {
    bool any = false;
    for (int s = 0; s < sequences; ++s) {
      const std::span<const float> row(logits.data() + std::size_t(s) * V, V);
      GeneratedToken token;
      token.id = samplers[std::size_t(s)].next(row);
      token.logits = row;
      input[std::size_t(s)] = token.id;  // a finished sequence keeps decoding its last token, unread
      if (!running[std::size_t(s)]) continue;
      ++stats.new_tokens;
      running[std::size_t(s)] = on_token(s, token);
      any = any || running[std::size_t(s)];
    }
    if (!any || step + 1 == max_new_tokens) break;
    logits = model.decode(*cache, input, 1);
  }
  stats.decode_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace pope
