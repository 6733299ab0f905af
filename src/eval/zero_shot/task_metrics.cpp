// The tasks' rules and metrics: the choice each example makes, accuracies with their sample
// standard error, LAMBADA's perplexity with its delta-method standard error, BLiMP per paradigm.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "pope/zero_shot.hpp"

namespace pope {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The first index of the largest value (the harness's np.argmax).
template <class Value>
int argmax(const std::vector<ChoiceResult>& choices, Value value) {
  int best = 0;
  for (int i = 1; i < int(choices.size()); ++i)
    if (value(choices[std::size_t(i)]) > value(choices[std::size_t(best)])) best = i;
  return best;
}

}  // namespace

MetricValue accuracy_metric(std::string name, std::size_t correct, std::size_t examples) {
  const double n = double(examples);
  const double p = n > 0 ? double(correct) / n : kNaN;
  return {std::move(name), p, n >= 2 ? std::sqrt(p * (1 - p) / (n - 1)) : kNaN};
}

MetricValue perplexity_metric(std::span<const double> log_likelihoods) {
  const double n = double(log_likelihoods.size());
  if (n == 0) return {"ppl", kNaN, kNaN};
  double mean = 0.0;
  for (const double ll : log_likelihoods) mean += ll / n;
  double squares = 0.0;
  for (const double ll : log_likelihoods) squares += (ll - mean) * (ll - mean);
  const double ppl = std::exp(-mean);
  return {"ppl", ppl, n >= 2 ? ppl * std::sqrt(squares / (n - 1) / n) : kNaN};
}

void apply_rule(TaskRule rule, ExampleResult& example) {
  switch (rule) {
    case TaskRule::last_word:
      example.chosen = example.chosen_norm = 0;
      example.correct = example.correct_norm = example.choices.at(0).greedy;
      return;
    case TaskRule::minimal_pair:
      // Strictly more likely: a tie counts as wrong, as the harness's LL(good) > LL(bad).
      example.chosen = example.chosen_norm = example.choices.at(0).log_likelihood > example.choices.at(1).log_likelihood
                                                 ? 0
                                                 : 1;
      break;
    case TaskRule::multiple_choice:
      example.chosen = argmax(example.choices, [](const ChoiceResult& c) { return c.log_likelihood; });
      example.chosen_norm = argmax(example.choices, [](const ChoiceResult& c) {
        return c.log_likelihood / double(std::max<std::size_t>(c.bytes, 1));
      });
      break;
  }
  example.correct = example.chosen == example.gold;
  example.correct_norm = example.chosen_norm == example.gold;
}

void aggregate_metrics(const TaskDefinition& definition, TaskResult& result) {
  std::size_t correct = 0, correct_norm = 0;
  std::vector<double> log_likelihoods;
  std::map<std::string, std::pair<std::size_t, std::size_t>> by_group;  // correct, examples
  for (const ExampleResult& e : result.examples) {
    correct += e.correct ? 1 : 0;
    correct_norm += e.correct_norm ? 1 : 0;
    log_likelihoods.push_back(e.choices.at(0).log_likelihood);
    if (e.group.empty()) continue;
    auto& [group_correct, group_examples] = by_group[e.group];
    group_correct += e.correct ? 1 : 0;
    ++group_examples;
  }
  const std::size_t n = result.examples.size();
  result.metrics = {accuracy_metric("acc", correct, n)};
  if (definition.acc_norm) result.metrics.push_back(accuracy_metric("acc_norm", correct_norm, n));
  if (definition.rule == TaskRule::last_word) result.metrics.push_back(perplexity_metric(log_likelihoods));
  result.groups.clear();
  for (const auto& [group, counts] : by_group)
    result.groups.push_back({group, counts.second, accuracy_metric("acc", counts.first, counts.second)});
}

const MetricValue* TaskResult::metric(std::string_view name) const {
  const auto it = std::find_if(metrics.begin(), metrics.end(), [&](const MetricValue& m) { return m.name == name; });
  return it == metrics.end() ? nullptr : &*it;
}

}  // namespace pope
