// Scoring a model on an indirect-indexing split: the argmax over the real vocabulary at the
// position that predicts the target, and the target's NLL (log-softmax in double).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "pope/indirect_indexing.hpp"
#include "pope/model.hpp"

namespace pope {

namespace {

// −log softmax(z)[target], computed in double from the logits.
double target_nll(const float* z, int vocab_size, int target) {
  const double max_logit = *std::max_element(z, z + vocab_size);
  double sum = 0.0;
  for (int j = 0; j < vocab_size; ++j) sum += std::exp(double(z[j]) - max_logit);
  return std::log(sum) + max_logit - double(z[target]);
}

}  // namespace

IndirectIndexingScore evaluate_indirect_indexing(Model& model, const IndirectIndexingTask& task, IndirectSplit split,
                                                 int batch, int seq_len, const std::function<bool()>& stop) {
  if (batch <= 0 || seq_len <= 0)
    throw std::invalid_argument(fmt::format("evaluate_indirect_indexing: batch {} × length {} must be positive", batch,
                                            seq_len));
  const int V = model.config().vocab_size;
  if (V != indirect_indexing::kVocabSize)
    throw std::invalid_argument(fmt::format("evaluate_indirect_indexing: the model's vocabulary has {} tokens, the "
                                            "task's {}",
                                            V, indirect_indexing::kVocabSize));
  const std::size_t T = std::size_t(seq_len);
  std::vector<std::int32_t> inputs(std::size_t(batch) * T), targets(inputs.size());
  std::vector<std::int64_t> rows;
  std::vector<int> shifts, answers;
  IndirectIndexingScore score;
  const std::uint64_t total = task.size(split);
  for (std::uint64_t first = 0; first < total; first += std::uint64_t(batch)) {
    if (stop && stop()) {
      score.complete = false;
      break;
    }
    const int filled = int(std::min<std::uint64_t>(std::uint64_t(batch), total - first));
    rows.clear();
    shifts.clear();
    answers.clear();
    for (int b = 0; b < filled; ++b) {
      const IndirectExample example = task.example(split, first + std::uint64_t(b));
      std::int32_t* row_targets = targets.data() + std::size_t(b) * T;
      IndirectIndexingTask::fill_row(example, seq_len, inputs.data() + std::size_t(b) * T, row_targets);
      const auto position = std::find_if(row_targets, row_targets + T, [](std::int32_t t) { return t >= 0; });
      rows.push_back(std::int64_t(b) * seq_len + (position - row_targets));
      shifts.push_back(example.shift);
      answers.push_back(*position);
    }
    // Rows past `filled` keep the previous batch's tokens: the same shape keeps the model's
    // activations (and a recorded training step) in place, and their logits are not read.
    const std::vector<float> logits = model.logits_at(inputs.data(), batch, seq_len, rows);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const float* z = logits.data() + i * std::size_t(V);
      const bool correct = int(std::max_element(z, z + V) - z) == answers[i];
      score.loss_sum += target_nll(z, V, answers[i]);
      for (IndirectIndexingScore::Tally* tally : {&score.total, &score.by_shift[shifts[i]]}) {
        ++tally->examples;
        tally->correct += correct ? 1 : 0;
      }
    }
  }
  return score;
}

nlohmann::json score_to_json(const IndirectIndexingScore& score) {
  nlohmann::json by_shift = nlohmann::json::object();
  for (const auto& [shift, tally] : score.by_shift)
    by_shift[fmt::format("{:+}", shift)] = {{"examples", tally.examples}, {"accuracy", tally.accuracy()}};
  return {{"examples", score.total.examples},
          {"accuracy", score.accuracy()},
          {"loss", score.mean_loss()},
          {"by_shift", by_shift}};
}

}  // namespace pope
