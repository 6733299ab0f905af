// Perplexity versus window length (pope-eval --lengths): for each length, every window of
// every book (or --max-windows of them spread evenly), forward only, per-token NLL summed in
// double over all tokens and over the last `tail` positions of each window.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>

#include "eval/split_text.hpp"
#include "pope/eval.hpp"

namespace pope {

namespace {

int parse_length(const std::string& text, const std::string& spec) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 1)
    throw ConfigError("--lengths", fmt::format("'{}' in '{}' is not a positive integer (expected FIRST:LAST:STEP, "
                                               "a comma-separated list or one length)",
                                               text, spec));
  return value;
}

// Each length is a pass over all the data, so more than kMaxEvalLengths of them is a typo (a
// step of 1 for 1024), not a sweep anyone waits for.
void check_length_count(const std::string& spec, std::int64_t count) {
  if (count > kMaxEvalLengths)
    throw ConfigError("--lengths", fmt::format("'{}' gives {} lengths; at most {} are allowed (raise STEP or list "
                                               "fewer lengths)",
                                               spec, count, kMaxEvalLengths));
}

double ratio(double numerator, double denominator) {
  return denominator > 0 ? numerator / denominator : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

std::vector<int> parse_lengths(const std::string& spec) {
  std::vector<int> lengths;
  if (spec.find(':') != std::string::npos) {
    const auto parts = split_text(spec, ':');
    if (parts.size() != 3)
      throw ConfigError("--lengths", fmt::format("'{}': expected FIRST:LAST:STEP, e.g. 1024:10240:1024", spec));
    const int first = parse_length(parts[0], spec), last = parse_length(parts[1], spec),
              step = parse_length(parts[2], spec);
    if (last < first) throw ConfigError("--lengths", fmt::format("'{}': LAST {} is below FIRST {}", spec, last, first));
    // Counted before expanding: 1:2147483647:1 would otherwise fill gigabytes of lengths.
    check_length_count(spec, (std::int64_t(last) - first) / step + 1);
    for (long length = first; length <= last; length += step) lengths.push_back(int(length));
  } else {
    const auto parts = split_text(spec, ',');
    check_length_count(spec, std::int64_t(parts.size()));
    for (const auto& part : parts) lengths.push_back(parse_length(part, spec));
  }
  for (std::size_t i = 1; i < lengths.size(); ++i)
    if (lengths[i] <= lengths[i - 1])
      throw ConfigError("--lengths", fmt::format("'{}': lengths must be strictly increasing", spec));
  return lengths;
}

int windows_per_forward(std::uint64_t windows, int length, std::int64_t max_batch_tokens) {
  if (windows == 0 || length < 1 || max_batch_tokens < 1)
    throw std::invalid_argument(fmt::format("windows_per_forward: {} windows of {} tokens, budget {} tokens", windows,
                                            length, max_batch_tokens));
  // Cap at what an int batch and the model's int row counts can hold.
  const std::uint64_t cap = std::uint64_t(std::clamp<std::int64_t>(max_batch_tokens / length, 1,
                                                                   std::numeric_limits<int>::max() / length));
  const std::uint64_t forwards = (windows + cap - 1) / cap;
  return int((windows + forwards - 1) / forwards);
}

double LengthResult::mean_nll() const { return ratio(nll_sum, double(tokens)); }
double LengthResult::perplexity() const { return std::exp(mean_nll()); }
double LengthResult::tail_mean_nll() const { return ratio(tail_nll_sum, double(tail_tokens)); }
double LengthResult::tail_perplexity() const { return std::exp(tail_mean_nll()); }
double LengthResult::tokens_per_second() const { return ratio(double(tokens), seconds); }

std::vector<LengthResult> sweep_lengths(Model& model, const TokenDataset& data, const LengthSweepOptions& options,
                                        LengthProgress progress, void* progress_context) {
  if (options.tail < 1) throw std::invalid_argument(fmt::format("tail must be positive, got {}", options.tail));
  std::vector<LengthResult> results;
  for (const int L : options.lengths) {
    const SequentialWindowSampler sampler(data, L);
    const std::uint64_t available = sampler.window_count();
    LengthResult r;
    r.length = L;
    r.windows = options.max_windows > 0 ? std::min(options.max_windows, available) : available;
    if (r.windows > 0) {
      const int B = windows_per_forward(r.windows, L, options.max_batch_tokens);
      r.batch = B;
      const std::size_t row = std::size_t(L);
      std::vector<std::int32_t> inputs(std::size_t(B) * row), targets(inputs.size());
      std::vector<float> losses(inputs.size());
      const int tail_start = std::max(0, L - options.tail);
      const auto start = std::chrono::steady_clock::now();
      for (std::uint64_t first = 0; first < r.windows; first += std::uint64_t(B)) {
        const int filled = int(std::min<std::uint64_t>(std::uint64_t(B), r.windows - first));
        for (int b = 0; b < filled; ++b) {
          const std::uint64_t i = first + std::uint64_t(b);
          const std::uint64_t window = r.windows == available ? i : spread_window_index(i, r.windows, available);
          sampler.fill(window, 1, inputs.data() + std::size_t(b) * row, targets.data() + std::size_t(b) * row);
        }
        // Masked padding rows keep one activation size for the whole length (see windows_per_forward).
        std::fill(inputs.begin() + std::ptrdiff_t(filled) * L, inputs.end(), 0);
        std::fill(targets.begin() + std::ptrdiff_t(filled) * L, targets.end(), -1);
        const LossSum part = model.forward(inputs.data(), targets.data(), B, L, losses.data());
        r.nll_sum += part.sum;
        r.tokens += part.count;
        for (int b = 0; b < filled; ++b)
          for (int t = tail_start; t < L; ++t) r.tail_nll_sum += double(losses[std::size_t(b) * row + std::size_t(t)]);
        r.tail_tokens += std::int64_t(filled) * (L - tail_start);
      }
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (progress) progress(r, progress_context);
    results.push_back(r);
  }
  return results;
}

}  // namespace pope
