// The indirect-indexing task of the PoPE paper (the PoPE paper's "Indirect indexing" setup): given
// a string of distinct letters, one of its characters and a signed shift, name the character
// that sits `shift` places from it.  One example, as text and as the model sees it:
//
//   NZTUIGWkXFrhCJDzscat, N, +4, I
//   └── prompt: every token up to and including the last space ──┘└ target
//
// Character-level vocabulary of 66 tokens: 'A'..'Z' = 0..25, 'a'..'z' = 26..51,
// '0'..'9' = 52..61, ',' = 62, '+' = 63, '-' = 64 (the paper's '−'), ' ' = 65.
//
// Every example is a pure function of (data seed, split, index): the 1M training examples
// are never stored. Splits are disjoint by construction: a validation example equal to a
// test example, and a training example equal to either, is rejected and drawn again from
// the same index's stream (the held-out 20k are kept as a hash set of their contents).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pope/config.hpp"

namespace pope {

class Model;

namespace indirect_indexing {

constexpr int kLetters = 52;
constexpr int kVocabSize = 66;
// Right padding after the prompt. Attention is causal, so no padding token can influence
// the prediction at the prompt's last position; the space is as good as any.
constexpr std::int32_t kPadToken = 65;

// Throws std::invalid_argument for a character outside the vocabulary.
std::int32_t token_of(char c);
// Throws std::invalid_argument for a token outside [0, kVocabSize).
char char_of(std::int32_t token);
// Decimal digits of |shift| (1 for 0..9, 2 for 10..99).
int digits_of(int shift);
// The longest prompt the config can produce: max_len + ", c, " + sign + digits + ", ".
int max_prompt_length(const IndirectIndexingConfig& config);
// The rules between the task's keys (min_len ≤ max_len; some shift allowed); throws
// ConfigError naming the key and, when known, the config file `source`.
void check_config(const IndirectIndexingConfig& config, const std::string& source);

}  // namespace indirect_indexing

enum class IndirectSplit { train, val, test };
std::string_view split_name(IndirectSplit split);

struct IndirectExample {
  std::string source;    // distinct letters
  int source_index = 0;  // where the source character sits in `source`
  int shift = 0;         // the target is source[source_index + shift]

  char source_char() const { return source[std::size_t(source_index)]; }
  char target() const { return source[std::size_t(source_index + shift)]; }
  std::string text() const;                        // "NZTU…, N, +4, I"
  std::vector<std::int32_t> prompt_tokens() const;  // the text's tokens without the target
  std::uint64_t hash() const;                       // equal examples hash equally
  bool operator==(const IndirectExample&) const = default;
};

class IndirectIndexingTask {
 public:
  // Draws the test and validation splits to build the held-out sets. Throws ConfigError
  // (see check_config) for settings that admit no example.
  explicit IndirectIndexingTask(const IndirectIndexingConfig& config);

  const IndirectIndexingConfig& config() const { return config_; }
  std::uint64_t size(IndirectSplit split) const;
  // Example `index` (< size(split)) of a split; throws std::out_of_range past the end and
  // DataError when no example outside the held-out sets turns up (an example space too
  // small for the split sizes).
  IndirectExample example(IndirectSplit split, std::uint64_t index) const;

  // One row of seq_len tokens: the prompt then kPadToken; targets −1 (masked) everywhere
  // except at the prompt's last position, which holds the target. Throws
  // std::invalid_argument when the prompt does not fit.
  static void fill_row(const IndirectExample& example, int seq_len, std::int32_t* inputs, std::int32_t* targets);
  // Rows for examples first .. first+count−1 of a split.
  void fill_split(IndirectSplit split, std::uint64_t first, int count, int seq_len, std::int32_t* inputs,
                  std::int32_t* targets) const;
  // Training rows: sample n of a run is the training example at a uniform index drawn from
  // (sampling_seed, n), so the sampler state is one counter, as for RandomWindowSampler.
  void fill_training(std::uint64_t sampling_seed, std::uint64_t first_sample, int batch, int seq_len,
                     std::int32_t* inputs, std::int32_t* targets) const;

 private:
  IndirectExample draw(IndirectSplit split, std::uint64_t index) const;

  IndirectIndexingConfig config_;
  std::unordered_set<std::uint64_t> test_hashes_;      // rejected by validation
  std::unordered_set<std::uint64_t> held_out_hashes_;  // test and validation: rejected by training
};

// Accuracy (argmax over the real vocabulary at the target position == target) and the
// target token's mean NLL over a split, overall and per shift.
struct IndirectIndexingScore {
  struct Tally {
    long examples = 0;
    long correct = 0;
    double accuracy() const { return examples > 0 ? double(correct) / double(examples) : 0.0; }
  };
  Tally total;
  double loss_sum = 0.0;
  std::map<int, Tally> by_shift;

  double accuracy() const { return total.accuracy(); }
  double mean_loss() const { return total.examples > 0 ? loss_sum / double(total.examples) : 0.0; }
  bool complete = true;  // false: stopped before the last example
};

// Evaluates every example of `split` in batches of `batch` rows of seq_len tokens (the
// trainer passes its micro-batch shape, so the model's activations are not reallocated; a
// short last batch is padded with rows whose predictions are ignored).
// `stop`, when given, is asked between batches: true ends the evaluation early, the score then
// marked incomplete (a run stopped by a signal does not wait for a long validation).
IndirectIndexingScore evaluate_indirect_indexing(Model& model, const IndirectIndexingTask& task, IndirectSplit split,
                                                 int batch, int seq_len, const std::function<bool()>& stop = {});

// {"examples", "accuracy", "loss", "by_shift": {"-15": {"examples", "accuracy"}, …}}
nlohmann::json score_to_json(const IndirectIndexingScore& score);

}  // namespace pope
