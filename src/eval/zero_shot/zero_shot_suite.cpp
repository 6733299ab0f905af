// pope-eval --task zero-shot-suite: the task files a directory holds (by their release names,
// as the download commands of the README unpack them) and the paper's Table 6 layout, one row
// per checkpoint, one column per task and their average.
#include <fmt/format.h>

#include <cmath>

#include "pope/data.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

struct SuiteColumn {
  std::string_view name;
  ZeroShotTask task;
  std::vector<std::string_view> candidates;  // relative paths, the first one present is read
};

const std::vector<SuiteColumn>& suite_columns() {
  static const std::vector<SuiteColumn> columns{
      {"lambada", ZeroShotTask::lambada, {"lambada_test.jsonl"}},
      {"blimp", ZeroShotTask::blimp, {"blimp", "blimp/data"}},
      {"cbt_cn", ZeroShotTask::cbt, {"cbtest_CN_test_2500ex.txt", "CBTest/data/cbtest_CN_test_2500ex.txt"}},
      {"cbt_ne", ZeroShotTask::cbt, {"cbtest_NE_test_2500ex.txt", "CBTest/data/cbtest_NE_test_2500ex.txt"}},
      {"hellaswag", ZeroShotTask::hellaswag, {"hellaswag_val.jsonl"}},
      {"piqa", ZeroShotTask::piqa, {"valid.jsonl", "piqa/valid.jsonl"}},
      {"arc_easy", ZeroShotTask::arc_easy, {"ARC-Easy-Test.jsonl", "ARC-V1-Feb2018-2/ARC-Easy/ARC-Easy-Test.jsonl"}},
  };
  return columns;
}

double suite_value(const TaskResult& result) {
  const MetricValue* m = result.metric(kSuiteMetric);
  return m ? 100.0 * m->value : std::nan("");
}

// The mean over tasks, as the paper averages its six: CBT's two files (common nouns, named
// entities) count as one task, their mean.
double average(const std::vector<TaskResult>& results) {
  double sum = 0.0;
  int tasks = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    double value_sum = 0.0;
    int files = 0;
    bool seen = false;
    for (std::size_t j = 0; j < results.size(); ++j) {
      if (results[j].task != results[i].task) continue;
      seen = seen || j < i;
      value_sum += suite_value(results[j]);
      ++files;
    }
    if (seen) continue;  // the task was counted at its first column
    sum += value_sum / files;
    ++tasks;
  }
  return tasks == 0 ? std::nan("") : sum / tasks;
}

}  // namespace

std::string suite_layout() {
  std::string out;
  for (const SuiteColumn& column : suite_columns()) {
    out += fmt::format("{:<10}", column.name);
    for (std::size_t i = 0; i < column.candidates.size(); ++i) out += (i ? " or " : " ") + std::string(column.candidates[i]);
    out += "\n";
  }
  return out;
}

std::vector<SuiteEntry> find_suite_files(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw DataError(fmt::format("{} is not a directory (--data-dir names the directory holding the task files)",
                                dir.string()));
  std::vector<SuiteEntry> found;
  for (const SuiteColumn& column : suite_columns())
    for (const std::string_view candidate : column.candidates)
      if (std::filesystem::exists(dir / candidate, ec)) {
        found.push_back({std::string(column.name), column.task, dir / candidate});
        break;
      }
  if (found.empty())
    throw DataError(fmt::format("{} holds none of the suite's task files; it looks for\n{}", dir.string(),
                                suite_layout()));
  return found;
}

std::string format_suite_table(std::span<const SuiteRow> rows) {
  if (rows.empty()) return {};
  std::string out = fmt::format("zero-shot {} (%)\n{:<20}", kSuiteMetric, "checkpoint");
  for (const TaskResult& r : rows.front().results) out += fmt::format(" {:>9}", r.name);
  out += fmt::format(" {:>9}\n", "average");
  for (const SuiteRow& row : rows) {
    out += fmt::format("{:<20}", row.label);
    for (const TaskResult& r : row.results) out += fmt::format(" {:>9.2f}", suite_value(r));
    out += fmt::format(" {:>9.2f}\n", average(row.results));
  }
  return out;
}

nlohmann::json suite_to_json(std::span<const SuiteRow> rows) {
  nlohmann::json list = nlohmann::json::array();
  for (const SuiteRow& row : rows) {
    nlohmann::json tasks = nlohmann::json::object();
    for (const TaskResult& r : row.results) {
      nlohmann::json metrics = nlohmann::json::object();
      for (const MetricValue& m : r.metrics) metrics[m.name] = {{"value", m.value}, {"stderr", m.standard_error}};
      tasks[r.name] = {{"file", r.files.front().string()}, {"examples", r.examples.size()},
                       {"skipped", r.skipped.size()}, {"metrics", metrics},
                       {"tokens_per_second", r.stats.tokens_per_second()}};
    }
    list.push_back({{"label", row.label}, {"tasks", tasks}, {"average", average(row.results)}});
  }
  return {{"metric", kSuiteMetric}, {"rows", list}};
}

}  // namespace pope
