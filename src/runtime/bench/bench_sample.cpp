// pope-bench sample: prefill and decode tokens/s of generation with the key/value cache.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "pope/backend.hpp"
#include "pope/bench.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "pope/sample.hpp"
#include "runtime/bench/bench_median.hpp"

namespace pope {

SampleBenchResult run_sample_benchmark(const RunConfig& config, const SampleBenchOptions& options) {
  if (options.batch <= 0 || options.prompt_tokens <= 0 || options.new_tokens <= 0 || options.rounds <= 0)
    throw ConfigError("--batch", fmt::format("expected a positive batch ({}), prompt ({}), new tokens ({}) and rounds "
                                             "({})",
                                             options.batch, options.prompt_tokens, options.new_tokens, options.rounds));
  auto backend = make_backend(config.train.device, "float", config.train.threads);
  Model model(config.model, *backend);
  model.initialize(config.train.seed);
  Rng rng(options.seed);
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(options.prompt_tokens));
  for (auto& t : prompt) t = std::int32_t(rng.below(std::uint64_t(config.model.vocab_size)));
  const SamplingOptions greedy{.temperature = 0.0};
  std::vector<double> prefill, decode;
  for (int round = 0; round <= options.rounds; ++round) {  // round 0 warms up
    const GenerationStats stats =
        generate(model, prompt, options.batch, options.new_tokens, greedy, options.seed, [](int, const GeneratedToken&) {
          return true;
        });
    if (round == 0) continue;
    prefill.push_back(stats.prefill_seconds);
    decode.push_back(stats.decode_seconds);
  }
  SampleBenchResult result;
  result.backend = backend->description();
  result.position_kind = config.model.position.kind;
  result.parameters = model.parameter_count();
  result.options = options;
  result.prefill_tokens_per_second = double(options.batch) * options.prompt_tokens / median(prefill);
  result.decode_tokens_per_second = double(options.batch) * options.new_tokens / median(decode);
  result.decode_ms_per_step = 1e3 * median(decode) / options.new_tokens;
  return result;
}

std::string format_sample_bench(const SampleBenchResult& r) {
  return fmt::format(
      "{} | {} | {:.1f}M parameters | batch {} | prompt {} + {} new tokens\n"
      "prefill {:.0f} tokens/s | decode {:.0f} tokens/s ({:.3f} ms per step)\n",
      r.backend, r.position_kind, r.parameters / 1e6, r.options.batch, r.options.prompt_tokens, r.options.new_tokens,
      r.prefill_tokens_per_second, r.decode_tokens_per_second, r.decode_ms_per_step);
}

nlohmann::json sample_bench_to_json(const SampleBenchResult& r) {
  return {{"backend", r.backend},
          {"position_kind", r.position_kind},
          {"parameters", r.parameters},
          {"batch", r.options.batch},
          {"prompt_tokens", r.options.prompt_tokens},
          {"new_tokens", r.options.new_tokens},
          {"rounds", r.options.rounds},
          {"prefill_tokens_per_second", r.prefill_tokens_per_second},
          {"decode_tokens_per_second", r.decode_tokens_per_second},
          {"decode_ms_per_step", r.decode_ms_per_step}};
}

}  // namespace pope
