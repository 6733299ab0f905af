// Batch samplers: random training windows and sequential validation windows. Each window
// holds seq_len + 1 tokens: the inputs are its first seq_len, the targets the last seq_len.
#include <fmt/format.h>
#include <fmt/std.h>

#include <algorithm>
#include <stdexcept>

#include "pope/data.hpp"
#include "pope/rng.hpp"

namespace pope {

namespace {

void check_seq_len(int seq_len) {
  if (seq_len <= 0) throw DataError(fmt::format("sequence length must be positive, got {}", seq_len));
}

// window[0, seq_len] → inputs = window[0, seq_len), targets = window[1, seq_len].
void split_window(const std::int32_t* window, int seq_len, std::int32_t* inputs, std::int32_t* targets) {
  std::copy(window, window + seq_len, inputs);
  std::copy(window + 1, window + seq_len + 1, targets);
}

std::string file_list(const TokenDataset& dataset) {
  std::vector<std::string> names;
  for (const auto& file : dataset.files()) names.push_back(file.path().string());
  return fmt::format("{}", fmt::join(names, ", "));
}

std::size_t largest_file_tokens(const TokenDataset& dataset) {
  std::size_t largest = 0;
  for (const auto& file : dataset.files()) largest = std::max(largest, file.size());
  return largest;
}

}  // namespace

RandomWindowSampler::RandomWindowSampler(const TokenDataset& dataset, int seq_len, std::uint64_t seed)
    : dataset_(&dataset), seq_len_(seq_len), seed_(seed) {
  check_seq_len(seq_len);
  if (dataset.window_count(seq_len + 1) == 0)
    throw DataError(fmt::format("token data ({}) is too small for one training window: the largest file has {} tokens, "
                                "a window needs seq_len + 1 = {} (windows never cross files)",
                                file_list(dataset), largest_file_tokens(dataset), seq_len + 1));
}

void RandomWindowSampler::fill(std::uint64_t first_sample, int batch, std::int32_t* inputs,
                               std::int32_t* targets) const {
  const int window_length = seq_len_ + 1;
  const std::uint64_t windows = dataset_->window_count(window_length);
  std::vector<std::int32_t> window(static_cast<std::size_t>(window_length));
  for (int b = 0; b < batch; ++b) {
    // A fresh generator per sample keeps sample i independent of every other sample, and
    // Rng::below avoids the modulo bias of mix64(seed, i) % windows.
    Rng rng(mix64(seed_, first_sample + static_cast<std::uint64_t>(b)));
    dataset_->read_window(rng.below(windows), window_length, window.data());
    const std::size_t row = static_cast<std::size_t>(b) * static_cast<std::size_t>(seq_len_);
    split_window(window.data(), seq_len_, inputs + row, targets + row);
  }
}

SequentialWindowSampler::SequentialWindowSampler(const TokenDataset& dataset, int seq_len)
    : dataset_(&dataset), seq_len_(seq_len) {
  check_seq_len(seq_len);
  const auto stride = static_cast<std::size_t>(seq_len);
  // Window w of a file covers [w·T, w·T + T + 1), so it fits while w·T + T + 1 ≤ size.
  for (const auto& file : dataset.files())
    windows_per_file_.push_back(file.size() > stride ? (file.size() - 1) / stride : 0);
}

std::uint64_t SequentialWindowSampler::window_count() const {
  std::uint64_t count = 0;
  for (auto windows : windows_per_file_) count += windows;
  return count;
}

int SequentialWindowSampler::fill(std::uint64_t first, int batch, std::int32_t* inputs, std::int32_t* targets) const {
  const auto& files = dataset_->files();
  std::size_t file_index = 0;
  std::uint64_t local = first;  // window index inside files[file_index]
  int filled = 0;
  std::vector<std::int32_t> window(static_cast<std::size_t>(seq_len_) + 1);
  while (filled < batch) {
    while (file_index < files.size() && local >= windows_per_file_[file_index]) local -= windows_per_file_[file_index++];
    if (file_index == files.size()) break;
    files[file_index].read(static_cast<std::size_t>(local) * static_cast<std::size_t>(seq_len_), window.size(),
                           window.data());
    const std::size_t row = static_cast<std::size_t>(filled) * static_cast<std::size_t>(seq_len_);
    split_window(window.data(), seq_len_, inputs + row, targets + row);
    ++filled;
    ++local;
  }
  return filled;
}

std::uint64_t spread_window_index(std::uint64_t i, std::uint64_t wanted, std::uint64_t windows) {
  if (wanted == 0 || wanted > windows || i >= wanted)
    throw std::invalid_argument(fmt::format("spread_window_index: window {} of {} spread over {} windows", i, wanted,
                                            windows));
  // 128-bit product: i·windows overflows 64 bits for a large file with many windows wanted.
  return static_cast<std::uint64_t>(static_cast<unsigned __int128>(i) * windows / wanted);
}

}  // namespace pope
