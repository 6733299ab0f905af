// Text generation from a trained model: a token sampler (temperature, top-k, nucleus) and the
// decode loop over Model::decode's key/value cache. Used by pope-sample, by the trainer's
// periodic samples (train.sample_every) and by pope-bench sample.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "pope/model.hpp"
#include "pope/rng.hpp"

namespace pope {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the most likely token, the lowest id among ties)
  int top_k = 0;             // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the fewest most likely tokens whose probability reaches p, in (0, 1]
};

// Throws std::invalid_argument naming the option (temperature ≥ 0 and finite, top_k ≥ 0,
// top_p in (0, 1]).
void check_sampling_options(const SamplingOptions& options);

// log softmax(logits)[id]: the model's own log-probability of a token (before temperature and
// truncation), in double.
double token_log_probability(std::span<const float> logits, std::int32_t id);

// Draws one token from fp32 logits over the vocabulary with its own random stream: the same
// seed and logits give the same tokens on every machine (ties and sorting are broken by id).
class TokenSampler {
 public:
  TokenSampler(const SamplingOptions& options, std::uint64_t seed);
  std::int32_t next(std::span<const float> logits);

 private:
  SamplingOptions options_;
  Rng rng_;
  std::vector<std::pair<float, std::int32_t>> order_;  // scratch: (scaled logit, id)
  std::vector<double> weights_;
};

struct GeneratedToken {
  std::int32_t id = 0;
  // The step's fp32 logits over the vocabulary where they were read back (sampling), valid
  // during the callback; empty where the backend chose the token (greedy).
  std::span<const float> logits;
  double chosen_log_probability = 0.0;  // greedy: the backend's log-probability of the token
  // The model's log-probability of the token, before temperature and truncation (computed from
  // the logits on demand when sampling).
  double log_probability() const {
    return logits.empty() ? chosen_log_probability : token_log_probability(logits, id);
  }
};

struct GenerationStats {
  long prompt_tokens = 0, new_tokens = 0;  // over all sequences
  double prefill_seconds = 0.0, decode_seconds = 0.0;
};

// Generates up to max_new_tokens tokens after `prompt` for `sequences` sequences at once (one
// cache of that batch): sequence i samples with TokenSampler(options, seed + i); greedy
// decoding (temperature 0) chooses on the backend instead (Model::queue_greedy), one step
// queued ahead, so that a sequence that stops costs one step that is not read. on_token is
// called for every new token of every sequence still running, in order, and returns false to
// end that sequence (a stop string, the end-of-text token); the loop ends when none runs. The
// cache holds prompt + max_new_tokens positions: Model::make_kv_cache's refusals apply.
GenerationStats generate(Model& model, std::span<const std::int32_t> prompt, int sequences, int max_new_tokens,
                         const SamplingOptions& options, std::uint64_t seed,
                         const std::function<bool(int sequence, const GeneratedToken& token)>& on_token);

}  // namespace pope
