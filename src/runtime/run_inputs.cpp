// The run's start-up checks, shared by the trainer (which stops at the first problem) and
// check_run_inputs (pope-train --dry-run, which reports them all).
#include "runtime/run_inputs.hpp"

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "data/regular_file.hpp"
#include "pope/checkpoint.hpp"

namespace pope {

namespace {

// What a refused resume changed, in the config's terms: each hashed key the run's config.json
// holds another value of, else (no readable config.json) the two hashes.
std::string describe_config_changes(const std::optional<RunConfig>& saved, const RunConfig& config,
                                    const std::string& checkpoint_hash, const std::string& hash) {
  std::vector<std::string> changes;
  if (saved)
    for (const ConfigChange& change : config_hash_changes(*saved, config))
      changes.push_back(fmt::format("{} = {}, this config says {}", change.key, change.before, change.after));
  if (changes.empty()) return fmt::format("hash {} vs {}", checkpoint_hash, hash);
  return fmt::format("{}", fmt::join(changes, "; "));
}

}  // namespace

// --resume as a checkpoint to read, or none; a fresh run refuses a directory holding another
// run's checkpoints or records.
std::optional<std::filesystem::path> resume_source(const std::filesystem::path& run_dir, const std::string& resume) {
  if (resume == "auto") return latest_checkpoint(run_dir);
  if (!resume.empty()) return std::filesystem::path(resume);
  if (auto existing = latest_checkpoint(run_dir))
    throw ConfigError("--out", fmt::format("run directory {} already holds checkpoint {}; continue it with "
                                           "--resume auto or choose another --out",
                                           run_dir.string(), existing->filename().string()));
  // A run that wrote no checkpoint yet still has a record a new run would append to or overwrite.
  for (const char* record : {"metrics.jsonl", "config.json"}) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(run_dir / record, ec)))
      throw ConfigError("--out", fmt::format("run directory {} already holds another run's {}; continue that run "
                                             "with --resume auto or choose another --out",
                                             run_dir.string(), record));
  }
  return std::nullopt;
}

void require_train_data(const RunConfig& config) {
  if (config.data.train.empty())
    throw ConfigError("data.train", "a training token file is required (see data/README.md)");
}

// A relative data path is read from the working directory (as in nanoGPT and litgpt); a
// problem with one says which directory that was, e.g. for a resume started elsewhere.
TokenDataset open_token_data(const char* key, const std::string& spec, int vocab_size) {
  try {
    return TokenDataset::open(spec, vocab_size);
  } catch (const DataError& error) {
    if (!spec.empty() && std::filesystem::path(spec).is_relative())
      throw DataError(fmt::format("{}: {} (a relative data path is read from the working directory, {})", key,
                                  error.what(), std::filesystem::current_path().string()));
    throw DataError(fmt::format("{}: {}", key, error.what()));
  }
}

// Checked at start: with train.eval_every = 0 only the final evaluation reads it, after every step has trained.
void check_validation_windows(const SequentialWindowSampler& sampler, const RunConfig& config) {
  if (sampler.window_count() == 0)
    throw DataError(fmt::format("validation data {} holds no window of train.seq_len + 1 = {} tokens (windows "
                                "never cross files)",
                                config.data.val, config.train.seq_len + 1));
}

// train.sample_prompt as token ids of the model's vocabulary, short enough for its encoding.
std::vector<std::int32_t> encode_sample_prompt(const RunConfig& config, const Gpt2Tokenizer& tokenizer,
                                               const PositionEncoding& position) {
  const TrainConfig& tc = config.train;
  std::vector<std::int32_t> prompt;
  for (std::uint16_t id : tokenizer.encode(tc.sample_prompt, SpecialTokens::allowed)) {
    if (id >= config.model.vocab_size)
      throw ConfigError("train.sample_prompt", fmt::format("the prompt holds GPT-2 token {}, outside the model's "
                                                           "vocabulary of {} (model.vocab_size)",
                                                           id, config.model.vocab_size));
    prompt.push_back(id);
  }
  const long positions = long(prompt.size()) + tc.sample_tokens;
  if (positions > config.model.context_length && !position.extrapolates())
    throw ConfigError("train.sample_tokens",
                      fmt::format("the prompt's {} tokens plus {} new ones exceed the training length {}, past which "
                                  "model.position.kind {} is not defined",
                                  prompt.size(), tc.sample_tokens, config.model.context_length,
                                  config.model.position.kind));
  return prompt;
}

// The run's own config.json beside the checkpoint, if readable: what the checkpoint was trained with.
std::optional<RunConfig> saved_run_config(const std::filesystem::path& checkpoint) {
  try {
    return load_config(locate_checkpoint(checkpoint).config_file);
  } catch (const std::exception&) {
    return std::nullopt;  // a missing or unreadable config.json only costs the details of a refusal
  }
}

// The trainer.json of the step directory `step_dir`, checked against `config` before any
// tensor is read: a changed model key would otherwise be reported as a tensor the model does
// not have, or of another shape.
TrainerState checked_resume_state(const std::filesystem::path& step_dir, const std::optional<RunConfig>& saved,
                                  const RunConfig& config) {
  const TrainerState state = read_trainer_state(step_dir);
  const std::string hash = config_hash(config);
  if (state.config_hash != hash)
    throw ConfigError("--resume", fmt::format("checkpoint {} was trained with a different config ({}); resuming "
                                              "needs the same model, data and optimizer settings",
                                              step_dir.string(),
                                              describe_config_changes(saved, config, state.config_hash, hash)));
  const TrainConfig& tc = config.train;
  check_trainer_state(state, {tc.steps, tc.batch_size, tc.max_nonfinite_steps}, (step_dir / "trainer.json").string());
  return state;
}

void check_run_records(const std::filesystem::path& run_dir) {
  for (const char* record : {"config.json", "metrics.jsonl", "train.log"}) {
    const std::filesystem::path path = run_dir / record;
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) continue;
    if (const std::string why = why_not_regular_file(path); !why.empty())
      throw ConfigError("--out", fmt::format("{} {}; a run's records must be regular files", path.string(), why));
  }
}

// What creating the run directory and its checkpoints/ would refuse, found without creating anything.
void check_run_directory(const std::filesystem::path& run_dir) {
  std::error_code ec;
  std::filesystem::path existing = run_dir;
  while (!existing.empty() && !std::filesystem::exists(existing, ec)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  if (!std::filesystem::is_directory(existing, ec))
    throw ConfigError("--out", fmt::format("cannot create the run directory {}: {} is not a directory",
                                           run_dir.string(), existing.string()));
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    throw ConfigError("--out", fmt::format("cannot {} the run directory {}: {} is not writable",
                                           existing == run_dir ? "write" : "create", run_dir.string(),
                                           existing.string()));
  check_run_records(run_dir);
  check_checkpoint_directory(run_dir);
}

std::vector<InputProblem> check_run_inputs(const RunConfig& config, const TrainerOptions& options) {
  std::vector<InputProblem> problems;
  const auto check = [&](auto&& work) {
    try {
      work();
    } catch (const ConfigError& error) {
      problems.push_back({error.what(), true});
    } catch (const std::exception& error) {
      problems.push_back({error.what(), false});
    }
  };
  check([&] { check_run_directory(options.run_dir); });
  check([&] {
    if (const auto from = resume_source(options.run_dir, options.resume)) {
      checked_resume_state(checkpoint_step_directory(*from), saved_run_config(*from), config);
    } else if (!options.init_from.empty()) {
      const auto step_dir = checkpoint_step_directory(options.init_from);
      if (!std::filesystem::is_regular_file(step_dir / "model.safetensors"))
        throw CheckpointError(fmt::format("--init-from {}: no model.safetensors in {}", options.init_from.string(),
                                          step_dir.string()));
    }
  });
  if (config.data.kind == DataKind::indirect_indexing) {
    check([&] { IndirectIndexingTask task(config.data.indirect_indexing); });
  } else {
    check([&] {
      require_train_data(config);
      const TokenDataset data = open_token_data("data.train", config.data.train, config.model.vocab_size);
      RandomWindowSampler(data, config.train.seq_len, config.train.seed);
    });
    if (!config.data.val.empty())
      check([&] {
        const TokenDataset data = open_token_data("data.val", config.data.val, config.model.vocab_size);
        check_validation_windows(SequentialWindowSampler(data, config.train.seq_len), config);
      });
  }
  if (config.train.sample_every > 0)
    check([&] { encode_sample_prompt(config, Gpt2Tokenizer::load_default(), *make_position_encoding(config.model)); });
  return problems;
}


}  // namespace pope
