// The checks a run makes at start-up, before it writes anything: the run directory, what
// --resume reads, the data (validation data too, which only the last evaluation may read)
// and the sample prompt. Each throws ConfigError or DataError naming the key or file;
// check_run_inputs (pope/train.hpp) runs them all and collects their problems.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pope/checkpoint.hpp"
#include "pope/config.hpp"
#include "pope/data.hpp"
#include "pope/position.hpp"
#include "pope/tokenizer.hpp"
#include "pope/train.hpp"

namespace pope {

// --resume as a checkpoint to read, or none; a fresh run refuses a directory holding another
// run's checkpoints or records.
std::optional<std::filesystem::path> resume_source(const std::filesystem::path& run_dir, const std::string& resume);

void require_train_data(const RunConfig& config);

// A token dataset, a problem with it named by its config key (and, for a relative path, the
// working directory it was read from).
TokenDataset open_token_data(const char* key, const std::string& spec, int vocab_size);

// The validation data holds at least one window of train.seq_len + 1 tokens.
void check_validation_windows(const SequentialWindowSampler& sampler, const RunConfig& config);

// train.sample_prompt as token ids of the model's vocabulary, short enough for its encoding.
std::vector<std::int32_t> encode_sample_prompt(const RunConfig& config, const Gpt2Tokenizer& tokenizer,
                                               const PositionEncoding& position);

// The run's own config.json beside the checkpoint, if readable.
std::optional<RunConfig> saved_run_config(const std::filesystem::path& checkpoint);

// trainer.json of `step_dir`, checked against `config` before any tensor is read.
TrainerState checked_resume_state(const std::filesystem::path& step_dir, const std::optional<RunConfig>& saved,
                                  const RunConfig& config);

// The run's records (config.json, metrics.jsonl, train.log) are regular files where they exist: a
// FIFO there would block the trainer in open(), where a signal cannot stop it.
void check_run_records(const std::filesystem::path& run_dir);

// What creating the run directory and its checkpoints/ would refuse, found without creating anything.
void check_run_directory(const std::filesystem::path& run_dir);

}  // namespace pope
