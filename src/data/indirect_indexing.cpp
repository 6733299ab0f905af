// The indirect-indexing generator: vocabulary, example drawing, held-out rejection and the
// rows the trainer and the evaluation feed to the model.
#include "pope/indirect_indexing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <stdexcept>

#include "config/config_schema.hpp"
#include "pope/data.hpp"
#include "pope/rng.hpp"

namespace pope {

namespace indirect_indexing {

namespace {

constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
constexpr std::int32_t kDigitZero = 52, kComma = 62, kPlus = 63, kMinus = 64, kSpace = 65;
static_assert(kAlphabet.size() == kLetters && kSpace == kPadToken && kSpace + 1 == kVocabSize);

}  // namespace

std::int32_t token_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
  if (c >= '0' && c <= '9') return kDigitZero + (c - '0');
  switch (c) {
    case ',': return kComma;
    case '+': return kPlus;
    case '-': return kMinus;
    case ' ': return kSpace;
    default: throw std::invalid_argument(fmt::format("character '{}' is not in the indirect-indexing vocabulary", c));
  }
}

char char_of(std::int32_t token) {
  if (token < 0 || token >= kVocabSize)
    throw std::invalid_argument(fmt::format("token {} is outside the indirect-indexing vocabulary [0, {})", token,
                                            kVocabSize));
  if (token < kLetters) return kAlphabet[std::size_t(token)];
  if (token < kComma) return char('0' + (token - kDigitZero));
  constexpr std::array<char, 4> punctuation{',', '+', '-', ' '};
  return punctuation[std::size_t(token - kComma)];
}

int digits_of(int shift) {
  int digits = 1;
  for (int rest = std::abs(shift); rest >= 10; rest /= 10) ++digits;
  return digits;
}

int max_prompt_length(const IndirectIndexingConfig& config) {
  // source + ", " + c + ", " + sign + digits + ", "
  return config.max_len + 8 + digits_of(config.max_shift);
}

void check_config(const IndirectIndexingConfig& config, const std::string& source) {
  if (config.min_len > config.max_len)
    config_schema::fail("data.indirect_indexing.min_len",
                        fmt::format("expected at most data.indirect_indexing.max_len ({}), found {}", config.max_len,
                                    config.min_len),
                        source);
  if (config.max_shift == 0 && !config.zero_shift)
    config_schema::fail("data.indirect_indexing.max_shift",
                        "expected at least 1 while data.indirect_indexing.zero_shift is false (no shift would be "
                        "left), found 0",
                        source);
}

}  // namespace indirect_indexing

namespace {

using indirect_indexing::token_of;

// Each split reads its own streams of the data seed.
std::uint64_t split_stream(IndirectSplit split) { return 0x1d1ec7ull + std::uint64_t(split); }

// Gives up on an index after this many held-out draws: only an example space barely larger
// than the held-out splits (tiny strings, tiny shifts) gets anywhere near it.
constexpr int kMaxDraws = 10000;

IndirectExample draw_example(const IndirectIndexingConfig& config, Rng& rng) {
  const int length = config.min_len + int(rng.below(std::uint64_t(config.max_len - config.min_len + 1)));
  // The first `length` letters of a random permutation (partial Fisher–Yates): distinct.
  std::string letters(indirect_indexing::kAlphabet);
  for (int i = 0; i < length; ++i) {
    const auto j = std::size_t(i) + std::size_t(rng.below(std::uint64_t(indirect_indexing::kLetters - i)));
    std::swap(letters[std::size_t(i)], letters[j]);
  }
  IndirectExample example;
  example.source = letters.substr(0, std::size_t(length));
  example.source_index = int(rng.below(std::uint64_t(length)));
  // A shift uniform over those that keep the target inside the string (the paper's
  // "resample otherwise", drawn directly): [low, high] ∋ 0, without 0 unless allowed.
  const int low = std::max(-config.max_shift, -example.source_index);
  const int high = std::min(config.max_shift, length - 1 - example.source_index);
  const int choices = high - low + (config.zero_shift ? 1 : 0);
  int shift = low + int(rng.below(std::uint64_t(choices)));
  if (!config.zero_shift && shift >= 0) ++shift;
  example.shift = shift;
  return example;
}

}  // namespace

std::string_view split_name(IndirectSplit split) {
  switch (split) {
    case IndirectSplit::train: return "train";
    case IndirectSplit::val: return "val";
    case IndirectSplit::test: return "test";
  }
  return "?";
}

std::string IndirectExample::text() const {
  return fmt::format("{}, {}, {}{}, {}", source, source_char(), shift < 0 ? '-' : '+', std::abs(shift), target());
}

std::vector<std::int32_t> IndirectExample::prompt_tokens() const {
  std::string prompt = text();
  prompt.pop_back();  // the target
  std::vector<std::int32_t> tokens(prompt.size());
  std::transform(prompt.begin(), prompt.end(), tokens.begin(), token_of);
  return tokens;
}

std::uint64_t IndirectExample::hash() const {
  std::uint64_t h = mix64(source.size());
  for (char c : source) h = mix64(h, std::uint64_t(static_cast<unsigned char>(c)));
  h = mix64(h, std::uint64_t(source_index));
  return mix64(h, std::uint64_t(std::int64_t(shift)));
}

IndirectIndexingTask::IndirectIndexingTask(const IndirectIndexingConfig& config) : config_(config) {
  indirect_indexing::check_config(config_, "");
  // Test first, then validation (which rejects test examples), then both feed training's rejection.
  for (std::uint64_t i = 0; i < size(IndirectSplit::test); ++i) test_hashes_.insert(draw(IndirectSplit::test, i).hash());
  held_out_hashes_ = test_hashes_;
  for (std::uint64_t i = 0; i < size(IndirectSplit::val); ++i)
    held_out_hashes_.insert(draw(IndirectSplit::val, i).hash());
}

std::uint64_t IndirectIndexingTask::size(IndirectSplit split) const {
  switch (split) {
    case IndirectSplit::train: return std::uint64_t(config_.train_size);
    case IndirectSplit::val: return std::uint64_t(config_.val_size);
    case IndirectSplit::test: return std::uint64_t(config_.test_size);
  }
  return 0;
}

IndirectExample IndirectIndexingTask::example(IndirectSplit split, std::uint64_t index) const {
  if (index >= size(split))
    throw std::out_of_range(fmt::format("indirect-indexing {} example {} does not exist: the split has {}",
                                        split_name(split), index, size(split)));
  return draw(split, index);
}

IndirectExample IndirectIndexingTask::draw(IndirectSplit split, std::uint64_t index) const {
  Rng rng(mix64(mix64(config_.seed, split_stream(split)), index));
  const std::unordered_set<std::uint64_t>* rejected = split == IndirectSplit::train ? &held_out_hashes_
                                                      : split == IndirectSplit::val ? &test_hashes_
                                                                                    : nullptr;
  for (int attempt = 0; attempt < kMaxDraws; ++attempt) {
    IndirectExample example = draw_example(config_, rng);
    // Equal examples hash equally, so no held-out example can pass; a collision of two
    // different ones only costs one more draw.
    if (!rejected || !rejected->contains(example.hash())) return example;
  }
  throw DataError(fmt::format(
      "indirect indexing: {} draws for {} example {} all hit the held-out splits; the example space of "
      "data.indirect_indexing.min_len/max_len/max_shift is too small for val_size + test_size = {}",
      kMaxDraws, split_name(split), index, config_.val_size + config_.test_size));
}

void IndirectIndexingTask::fill_row(const IndirectExample& example, int seq_len, std::int32_t* inputs,
                                    std::int32_t* targets) {
  const std::vector<std::int32_t> prompt = example.prompt_tokens();
  if (int(prompt.size()) > seq_len)
    throw std::invalid_argument(fmt::format("indirect-indexing prompt \"{}\" has {} tokens, more than the row length {}",
                                            example.text(), prompt.size(), seq_len));
  std::copy(prompt.begin(), prompt.end(), inputs);
  std::fill(inputs + prompt.size(), inputs + seq_len, indirect_indexing::kPadToken);
  std::fill(targets, targets + seq_len, -1);
  targets[prompt.size() - 1] = token_of(example.target());
}

void IndirectIndexingTask::fill_split(IndirectSplit split, std::uint64_t first, int count, int seq_len,
                                      std::int32_t* inputs, std::int32_t* targets) const {
  for (int b = 0; b < count; ++b) {
    const std::size_t row = std::size_t(b) * std::size_t(seq_len);
    fill_row(example(split, first + std::uint64_t(b)), seq_len, inputs + row, targets + row);
  }
}

void IndirectIndexingTask::fill_training(std::uint64_t sampling_seed, std::uint64_t first_sample, int batch,
                                         int seq_len, std::int32_t* inputs, std::int32_t* targets) const {
  for (int b = 0; b < batch; ++b) {
    Rng rng(mix64(sampling_seed, first_sample + std::uint64_t(b)));
    const std::size_t row = std::size_t(b) * std::size_t(seq_len);
    fill_row(example(IndirectSplit::train, rng.below(size(IndirectSplit::train))), seq_len, inputs + row,
             targets + row);
  }
}

}  // namespace pope
