// The scoring engine of the zero-shot tasks: log p(continuation | context) for many requests in
// few forwards. Requests are sorted by length (longest first, so that a budget too large for
// the device fails at once), grouped by their padded row length, and each group is shared
// evenly between the fewest forwards its budget allows (windows_per_forward, as the length
// sweep): one activation size per group, the last forward padded with masked rows.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "pope/eval.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

constexpr int kRowMultiple = 64;

std::int64_t row_positions(const ContinuationRequest& r) {
  return std::int64_t(r.context.size() + r.continuation.size()) - 1;
}

// log softmax(z)[target] in double, and whether target is the first argmax.
std::pair<double, bool> log_probability(const float* z, int vocab_size, int target) {
  const float* best = std::max_element(z, z + vocab_size);
  const double max_logit = *best;
  double sum = 0.0;
  for (int j = 0; j < vocab_size; ++j) sum += std::exp(double(z[j]) - max_logit);
  return {double(z[target]) - max_logit - std::log(sum), best - z == target};
}

void check_request(const Model& model, const ContinuationRequest& r, std::size_t index) {
  if (r.context.empty() || r.continuation.empty())
    throw std::invalid_argument(fmt::format("score_continuations: request {} has {} context and {} continuation "
                                            "tokens; both must be non-empty",
                                            index, r.context.size(), r.continuation.size()));
  const std::int64_t tokens = row_positions(r) + 1;
  const auto bound = max_request_tokens(model);
  if (bound && tokens > *bound)
    throw std::invalid_argument(request_too_long_message(model, fmt::format("request {}", index), tokens));
  if (tokens > std::numeric_limits<int>::max() / 2)
    throw std::invalid_argument(fmt::format("score_continuations: request {} holds {} tokens", index, tokens));
}

// One forward of `rows` requests (the rest of the B rows padded), writing their scores.
class BatchScorer {
 public:
  BatchScorer(Model& model, const ScoringOptions& options, std::span<const ContinuationRequest> requests,
              std::vector<ContinuationScore>& scores)
      : model_(model), options_(options), requests_(requests), scores_(scores) {}

  void run(std::span<const std::size_t> rows, int B, int T) {
    const std::size_t row = std::size_t(T);
    tokens_.assign(std::size_t(B) * row, 0);
    targets_.assign(tokens_.size(), -1);
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const ContinuationRequest& r = requests_[rows[b]];
      std::int32_t* in = tokens_.data() + b * row;
      std::int32_t* target = targets_.data() + b * row;
      // Inputs: context + continuation without its last token; targets: the continuation,
      // predicted from the context's last position on.
      std::copy(r.context.begin(), r.context.end(), in);
      std::copy(r.continuation.begin(), r.continuation.end() - 1, in + r.context.size());
      std::copy(r.continuation.begin(), r.continuation.end(), target + r.context.size() - 1);
    }
    if (options_.greedy) score_greedy(rows, B, T);
    else score_losses(rows, B, T);
  }

 private:
  void score_losses(std::span<const std::size_t> rows, int B, int T) {
    losses_.resize(tokens_.size());
    model_.forward(tokens_.data(), targets_.data(), B, T, losses_.data());
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const ContinuationRequest& r = requests_[rows[b]];
      const std::size_t first = b * std::size_t(T) + r.context.size() - 1;
      double nll = 0.0;
      for (std::size_t i = 0; i < r.continuation.size(); ++i) nll += double(losses_[first + i]);
      scores_[rows[b]] = {-nll, int(r.continuation.size()), false};
    }
  }

  void score_greedy(std::span<const std::size_t> rows, int B, int T) {
    positions_.clear();
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const ContinuationRequest& r = requests_[rows[b]];
      const std::int64_t first = std::int64_t(b) * T + std::int64_t(r.context.size()) - 1;
      for (std::size_t i = 0; i < r.continuation.size(); ++i) positions_.push_back(first + std::int64_t(i));
    }
    const std::vector<float> logits = model_.logits_at(tokens_.data(), B, T, positions_);
    const int V = model_.config().vocab_size;
    std::size_t at = 0;
    for (const std::size_t index : rows) {
      const ContinuationRequest& r = requests_[index];
      ContinuationScore score{0.0, int(r.continuation.size()), true};
      for (const std::int32_t target : r.continuation) {
        const auto [log_p, argmax] = log_probability(logits.data() + at++ * std::size_t(V), V, target);
        score.log_likelihood += log_p;
        score.greedy = score.greedy && argmax;
      }
      scores_[index] = score;
    }
  }

  Model& model_;
  const ScoringOptions& options_;
  std::span<const ContinuationRequest> requests_;
  std::vector<ContinuationScore>& scores_;
  std::vector<std::int32_t> tokens_, targets_;
  std::vector<float> losses_;
  std::vector<std::int64_t> positions_;
};

}  // namespace

double ScoringStats::tokens_per_second() const {
  return seconds > 0 ? double(input_tokens) / seconds : std::numeric_limits<double>::quiet_NaN();
}

int scoring_row_length(const Model& model, int length) {
  if (length < 1) throw std::invalid_argument(fmt::format("scoring_row_length: length {}", length));
  if (model.position().transform_varies_with_length()) return length;
  const int context_length = model.config().context_length;
  const int padded = int((std::int64_t(length) + kRowMultiple - 1) / kRowMultiple * kRowMultiple);
  return length <= context_length ? std::min(padded, context_length) : padded;
}

std::optional<std::int64_t> max_request_tokens(const Model& model) {
  if (model.position().extrapolates()) return std::nullopt;
  return std::int64_t(model.config().context_length) + 1;
}

std::string request_too_long_message(const Model& model, std::string_view where, std::int64_t tokens) {
  return fmt::format("model.position.kind {} is defined up to the training length {} (model.context_length), and {} "
                     "needs {} positions (context + continuation − 1); evaluate with a RoPE scaling "
                     "(--rope-scaling) or an encoding that extrapolates",
                     model.position().kind(), model.config().context_length, where, tokens - 1);
}

std::vector<ContinuationScore> score_continuations(Model& model, std::span<const ContinuationRequest> requests,
                                                   const ScoringOptions& options, ScoringStats* stats) {
  if (options.max_batch_tokens < 1)
    throw std::invalid_argument(fmt::format("max_batch_tokens must be positive, got {}", options.max_batch_tokens));
  for (std::size_t i = 0; i < requests.size(); ++i) check_request(model, requests[i], i);
  std::vector<std::size_t> order(requests.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return row_positions(requests[a]) > row_positions(requests[b]);
  });

  std::vector<ContinuationScore> scores(requests.size());
  BatchScorer scorer(model, options, requests, scores);
  ScoringStats local;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t begin = 0; begin < order.size();) {
    const int T = scoring_row_length(model, int(row_positions(requests[order[begin]])));
    std::size_t end = begin;
    while (end < order.size() && scoring_row_length(model, int(row_positions(requests[order[end]]))) == T) ++end;
    const int B = windows_per_forward(end - begin, T, options.max_batch_tokens);
    for (std::size_t first = begin; first < end; first += std::size_t(B)) {
      const std::span<const std::size_t> rows(order.data() + first, std::min(end, first + std::size_t(B)) - first);
      scorer.run(rows, B, T);
      ++local.forwards;
      local.padded_tokens += std::int64_t(B) * T;
      for (const std::size_t index : rows) local.input_tokens += row_positions(requests[index]);
    }
    begin = end;
  }
  local.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stats) *stats = local;
  return scores;
}

}  // namespace pope
