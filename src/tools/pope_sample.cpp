// pope-sample: generate text from a checkpoint with the key/value cache (pope/sample.hpp), on the
// CPU or the GPU, for every encoding; positions are computed, so generation may run past the
// training length where the encoding is defined there. The text streams to stdout as it is
// decoded (the prompt first), the speed goes to stderr, --json writes every sample's text,
// token ids and log-probabilities.
// Exit codes: 0 done, 1 data/checkpoint/runtime error, 2 usage or config error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "data/regular_file.hpp"
#include "pope/checkpoint.hpp"
#include "pope/eval.hpp"
#include "pope/model.hpp"
#include "pope/position.hpp"
#include "pope/sample.hpp"
#include "pope/tokenizer.hpp"
#include "tools/console_log.hpp"
#include "tools/enum_option.hpp"
#include "tools/number_checks.hpp"
#include "tools/output_file.hpp"
#include "tools/version.hpp"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;
// Prompt plus new tokens at most: the longest window a config may name (model.context_length's
// bound), and a cache that a GPU still holds for the paper's models.
constexpr long kMaxPositions = 1L << 20;
constexpr int kMaxSamples = 1024;

struct Options {
  std::string checkpoint, prompt, prompt_file, device = "auto", json, tokenizer_dir;
  std::vector<std::string> overrides, stops;
  bool prompt_given = false, ignore_eot = false, quiet = false;
  long max_new_tokens = 256;
  int num_samples = 1, threads = 0;
  std::uint64_t seed = 1337;
  pope::SamplingOptions sampling;
};

struct Sample {
  std::string text;
  std::vector<std::int32_t> tokens;
  std::vector<double> log_probabilities;
  std::string stop_reason = "max_new_tokens";
};

// Far above any context a model here takes, and a bound on an endless input (/dev/zero on stdin).
constexpr std::size_t kMaxPromptBytes = std::size_t(16) << 20;

std::string read_bounded(std::istream& in, const std::string& flag, const std::string& source) {
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, std::size_t(in.gcount()));
    if (text.size() > kMaxPromptBytes)
      throw pope::ConfigError(flag, fmt::format("the prompt from {} is longer than {} MiB", source, kMaxPromptBytes >> 20));
  }
  if (in.bad()) throw pope::ConfigError(flag, fmt::format("cannot read {}", source));
  return text;
}

std::string read_prompt(const Options& o) {
  if (o.prompt_given) return o.prompt;
  if (!o.prompt_file.empty()) {
    // A FIFO or a device would block or never end: refused for what it is.
    if (const std::string why = pope::why_not_regular_file(o.prompt_file); !why.empty())
      throw pope::ConfigError("--prompt-file", fmt::format("{}: {}", o.prompt_file, why));
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) throw pope::ConfigError("--prompt-file", fmt::format("cannot read {}", o.prompt_file));
    return read_bounded(in, "--prompt-file", o.prompt_file);
  }
  if (::isatty(STDIN_FILENO))
    throw pope::ConfigError("--prompt", "no prompt: give --prompt TEXT or --prompt-file FILE, or pipe it on stdin");
  return read_bounded(std::cin, "--prompt", "standard input");
}

// The earliest end of a stop string in `text` from `from` on (the bytes before it are the
// sample), or npos.
std::size_t stop_position(const std::string& text, const std::vector<std::string>& stops, std::size_t from) {
  std::size_t best = std::string::npos;
  for (const std::string& stop : stops) {
    const std::size_t at = text.find(stop, from > stop.size() ? from - stop.size() : 0);
    if (at != std::string::npos && at < best) best = at;
  }
  return best;
}

nlohmann::json to_json(const Options& o, const std::string& prompt, const std::vector<std::int32_t>& prompt_tokens,
                       const std::vector<Sample>& samples, const pope::GenerationStats& stats) {
  nlohmann::json out = {{"checkpoint", o.checkpoint},
                        {"prompt", prompt},
                        {"prompt_tokens", prompt_tokens},
                        {"settings",
                         {{"temperature", o.sampling.temperature},
                          {"top_k", o.sampling.top_k},
                          {"top_p", o.sampling.top_p},
                          {"seed", o.seed},
                          {"max_new_tokens", o.max_new_tokens},
                          {"stop", o.stops},
                          {"stop_at_end_of_text", !o.ignore_eot}}},
                        {"prefill_tokens_per_second", stats.prompt_tokens / std::max(stats.prefill_seconds, 1e-12)},
                        {"decode_tokens_per_second", stats.new_tokens / std::max(stats.decode_seconds, 1e-12)}};
  for (const Sample& s : samples)
    out["samples"].push_back({{"text", s.text},
                              {"tokens", s.tokens},
                              {"log_probabilities", s.log_probabilities},
                              {"stop_reason", s.stop_reason}});
  return out;
}

int run(const Options& o) {
  pope::check_sampling_options(o.sampling);
  const std::string prompt = read_prompt(o);
  if (prompt.empty()) throw pope::ConfigError("--prompt", "the prompt is empty: generation needs at least one token");
  const pope::Gpt2Tokenizer tokenizer = pope::Gpt2Tokenizer::load_default(o.tokenizer_dir);
  const std::vector<std::uint16_t> ids = tokenizer.encode(prompt, pope::SpecialTokens::allowed);
  const std::vector<std::int32_t> prompt_tokens(ids.begin(), ids.end());
  if (long(prompt_tokens.size()) + o.max_new_tokens > kMaxPositions)
    throw pope::ConfigError("--max-new-tokens", fmt::format("the prompt's {} tokens plus {} new ones exceed {} "
                                                            "positions",
                                                            prompt_tokens.size(), o.max_new_tokens, kMaxPositions));

  const pope::EvalCheckpoint checkpoint = pope::open_eval_checkpoint(o.checkpoint, o.overrides);
  const pope::RunConfig& config = checkpoint.config;
  if (config.data.kind != pope::DataKind::tokens)
    throw pope::ConfigError("--checkpoint", fmt::format("{} was trained on data.kind {}, not on GPT-2 text tokens",
                                                        checkpoint.step_dir.string(), pope::name_of(config.data.kind)));
  for (std::int32_t id : prompt_tokens)
    if (id >= config.model.vocab_size)
      throw pope::ConfigError("--prompt", fmt::format("the prompt holds GPT-2 token {}, outside the model's vocabulary "
                                                      "of {} (model.vocab_size of {})",
                                                      id, config.model.vocab_size, checkpoint.config_file.string()));
  const long positions = long(prompt_tokens.size()) + o.max_new_tokens;
  if (positions > config.model.context_length && !pope::make_position_encoding(config.model)->extrapolates())
    throw pope::ConfigError(
        "--max-new-tokens",
        fmt::format("model.position.kind {} is defined up to the training length {}; the prompt's {} tokens plus {} "
                    "new ones need {} positions (shorten them, or sample with a RoPE scaling such as --set "
                    "model.position.rope.scaling.kind=dynamic_ntk)",
                    config.model.position.kind, config.model.context_length, prompt_tokens.size(),
                    o.max_new_tokens, positions));
  auto backend = pope::make_backend(*pope::enum_from_name<pope::DeviceChoice>(o.device), "float", o.threads);
  auto model = pope::load_eval_model(checkpoint, *backend);
  if (!o.quiet)
    spdlog::info("pope-sample: {} at step {} ({}, trained at {}) on {} | prompt {} tokens", checkpoint.step_dir.string(),
                 checkpoint.step, pope::describe_position(config.model.position), config.train.seq_len,
                 backend->description(), prompt_tokens.size());

  // Stop strings may end in a later token: the bytes that could begin one are held back.
  std::size_t hold = 0;
  for (const std::string& stop : o.stops) hold = std::max(hold, stop.size() - 1);
  std::vector<Sample> samples(std::size_t(o.num_samples));
  pope::GenerationStats total;
  for (int i = 0; i < o.num_samples; ++i) {
    if (o.num_samples > 1) std::printf("%s--- sample %d\n", i > 0 ? "\n" : "", i + 1);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
    Sample& sample = samples[std::size_t(i)];
    std::size_t printed = 0;
    auto print_up_to = [&](std::size_t end) {
      if (end > printed) std::fwrite(sample.text.data() + printed, 1, end - printed, stdout);
      printed = std::max(printed, end);
      std::fflush(stdout);
    };
    const pope::GenerationStats stats = pope::generate(
        *model, prompt_tokens, 1, int(o.max_new_tokens), o.sampling, o.seed + std::uint64_t(i),
        [&](int, const pope::GeneratedToken& token) {
          if (token.id == pope::kGpt2EndOfText && !o.ignore_eot) {
            sample.stop_reason = "end_of_text";
            return false;
          }
          const std::size_t before = sample.text.size();
          sample.text += tokenizer.token_bytes(std::uint16_t(token.id));
          sample.tokens.push_back(token.id);
          sample.log_probabilities.push_back(token.log_probability());
          const std::size_t stop = stop_position(sample.text, o.stops, before);
          if (stop != std::string::npos) {
            sample.text.resize(stop);
            sample.stop_reason = "stop";
            return false;
          }
          print_up_to(sample.text.size() > hold ? sample.text.size() - hold : 0);
          return true;
        });
    print_up_to(sample.text.size());
    total.prompt_tokens += stats.prompt_tokens;
    total.new_tokens += stats.new_tokens;
    total.prefill_seconds += stats.prefill_seconds;
    total.decode_seconds += stats.decode_seconds;
  }
  std::printf("\n");
  std::fflush(stdout);
  if (!o.quiet)
    spdlog::info("prefill {} tokens in {:.3f} s ({:.1f} tokens/s), decode {} tokens in {:.3f} s ({:.1f} tokens/s)",
                 total.prompt_tokens, total.prefill_seconds, total.prompt_tokens / std::max(total.prefill_seconds, 1e-12),
                 total.new_tokens, total.decode_seconds, total.new_tokens / std::max(total.decode_seconds, 1e-12));
  if (!o.json.empty())
    pope::write_file_atomic(o.json, to_json(o, prompt, prompt_tokens, samples, total)
                                            .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                                        "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pope::tools::log_to_stderr("pope-sample");
  CLI::App app{"pope-sample: generate text from a checkpoint with a key/value cache (CPU or GPU, every encoding)"};
  Options o;
  app.add_option("--checkpoint", o.checkpoint, "a run directory (its latest checkpoint) or a step directory")
      ->required();
  auto* prompt = app.add_option("--prompt", o.prompt, "the prompt text (<|endoftext|> is the end-of-text token)");
  auto* prompt_file = app.add_option("--prompt-file", o.prompt_file, "read the prompt from this file; with neither "
                                                                     "flag it is read from stdin");
  prompt->excludes(prompt_file);
  app.add_option("--max-new-tokens", o.max_new_tokens,
                 fmt::format("tokens to generate per sample (default 256; prompt + new tokens at most {})",
                             kMaxPositions))
      ->check(pope::tools::integer_check(o.max_new_tokens, 0, kMaxPositions));
  app.add_option("--temperature", o.sampling.temperature, "softmax temperature; 0: greedy (default 1)")
      ->check(pope::tools::at_least(0));
  app.add_option("--top-k", o.sampling.top_k, "sample from the k most likely tokens only; 0: all (default)")
      ->check(pope::tools::integer_check(o.sampling.top_k, 0));
  app.add_option("--top-p", o.sampling.top_p, "nucleus sampling: the fewest most likely tokens reaching probability "
                                              "p, in (0, 1] (default 1: all)");
  app.add_option("--seed", o.seed, "random seed; sample i uses seed + i (default 1337)")
      ->check(pope::tools::integer_check(o.seed));
  app.add_option("--num-samples", o.num_samples, fmt::format("samples to draw, one after another (default 1, at "
                                                             "most {})",
                                                             kMaxSamples))
      ->check(pope::tools::integer_check(o.num_samples, 1, kMaxSamples));
  app.add_option("--stop", o.stops, "end a sample where this text appears (not printed); may be repeated")
      ->each([](const std::string& s) {
        if (s.empty()) throw CLI::ValidationError("--stop", "an empty stop string would end every sample at once");
      });
  app.add_flag("--ignore-eot", o.ignore_eot, "keep going past the end-of-text token (by default it ends a sample)");
  app.add_option("--json", o.json, "write the prompt, every sample's text, token ids and log-probabilities (the "
                                   "model's, before temperature and truncation), the settings and the speed")
      ->check(pope::tools::kOutputFile);
  app.add_option("--set", o.overrides, "override a model.* key of the checkpoint's config, e.g. "
                                       "model.position.rope.scaling.kind=dynamic_ntk");
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(pope::tools::one_of_names<pope::DeviceChoice>());
  app.add_option("--threads", o.threads, "CPU threads; 0: all cores")->check(pope::tools::threads_check(o.threads));
  app.add_option("--tokenizer-dir", o.tokenizer_dir, "directory with encoder.json and vocab.bpe (default: "
                                                     "$POPE_TOKENIZER_DIR, else data/tokenizer in or above the "
                                                     "working directory, else PREFIX/share/pope/tokenizer of an "
                                                     "installed binary, else data/tokenizer above the binary)");
  app.add_flag("-q,--quiet", o.quiet, "no information lines on stderr (the text still streams to stdout)");
  pope::tools::finish_cli(app, "pope-sample");
  try {
    app.parse(argc, argv);
    o.prompt_given = prompt->count() > 0;
    if (!(o.sampling.top_p > 0.0 && o.sampling.top_p <= 1.0))
      throw CLI::ValidationError("--top-p", fmt::format("expected a probability in (0, 1], got {}", o.sampling.top_p));
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitConfig;
  }
  try {
    return run(o);
  } catch (const pope::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    return kExitConfig;
  } catch (const std::bad_alloc&) {
    spdlog::error("{}", pope::tools::kOutOfMemory);
    return kExitRuntime;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return kExitRuntime;
  }
}
