// Reports of a task over one or more checkpoints: the console table (metrics ± stderr, speed,
// skips, BLiMP per paradigm), JSON with every example's result, and a per-choice CSV.
#include <fmt/format.h>

#include <cmath>

#include "pope/zero_shot.hpp"

namespace pope {

namespace {

constexpr std::size_t kSkipsListed = 10;

std::string metric_text(const MetricValue* m) {
  if (m == nullptr) return "-";
  return std::isnan(m->standard_error) ? fmt::format("{:.4f}", m->value)
                                       : fmt::format("{:.4f} ± {:.4f}", m->value, m->standard_error);
}

// RFC 4180 quoting where a field needs it (paths and labels may hold commas).
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

nlohmann::json metric_json(const MetricValue& m) { return {{"value", m.value}, {"stderr", m.standard_error}}; }

nlohmann::json example_json(const TaskResult& result, const ExampleResult& e) {
  nlohmann::json choices = nlohmann::json::array();
  for (const ChoiceResult& c : e.choices)
    choices.push_back({{"log_likelihood", c.log_likelihood}, {"tokens", c.tokens}, {"bytes", c.bytes},
                       {"greedy", c.greedy}});
  nlohmann::json j{{"index", e.index},         {"file", result.files[e.file].string()}, {"line", e.line},
                   {"gold", e.gold},           {"chosen", e.chosen},                    {"chosen_norm", e.chosen_norm},
                   {"correct", e.correct},     {"correct_norm", e.correct_norm},        {"choices", choices}};
  if (!e.group.empty()) j["group"] = e.group;
  return j;
}

}  // namespace

std::string format_task_table(std::span<const TaskRun> runs) {
  if (runs.empty()) return {};
  const TaskResult& first = runs.front().result;
  std::vector<std::string> names;
  for (const MetricValue& m : first.metrics) names.push_back(m.name);
  std::string out = fmt::format("task {}: {}", first.name, first.files.front().string());
  if (first.task == ZeroShotTask::blimp && first.files.size() > 1)
    out += fmt::format(" and {} more paradigm files", first.files.size() - 1);
  out += "\n";
  out += fmt::format("{:<20} {:>8} {:<16} {:>8} {:>7}", "checkpoint", "step", "position", "examples", "skipped");
  for (const std::string& name : names) out += fmt::format(" {:>17}", name);
  out += fmt::format(" {:>10}\n", "tok/s");
  for (const TaskRun& run : runs) {
    const TaskResult& r = run.result;
    out += fmt::format("{:<20} {:>8} {:<16} {:>8} {:>7}", run.label, run.step, run.position, r.examples.size(),
                       r.skipped.size());
    for (const std::string& name : names) out += fmt::format(" {:>17}", metric_text(r.metric(name)));
    out += fmt::format(" {:>10.0f}\n", r.stats.tokens_per_second());
  }
  // Skips depend on the tokenizer only, so one run's list stands for all.
  for (std::size_t i = 0; i < first.skipped.size() && i < kSkipsListed; ++i) {
    const SkippedExample& s = first.skipped[i];
    out += fmt::format("skipped: {} line {}: {}\n", first.files[s.file].string(), s.line, s.reason);
  }
  if (first.skipped.size() > kSkipsListed)
    out += fmt::format("skipped: … and {} more (all in --json)\n", first.skipped.size() - kSkipsListed);
  if (!first.groups.empty()) {
    out += fmt::format("{:<48} {:>8}", "paradigm", "pairs");
    for (const TaskRun& run : runs) out += fmt::format(" {:>20}", run.label);
    out += "\n";
    for (std::size_t g = 0; g < first.groups.size(); ++g) {
      out += fmt::format("{:<48} {:>8}", first.groups[g].group, first.groups[g].examples);
      for (const TaskRun& run : runs)
        out += fmt::format(" {:>20}", g < run.result.groups.size() ? metric_text(&run.result.groups[g].acc) : "-");
      out += "\n";
    }
  }
  return out;
}

nlohmann::json task_runs_to_json(std::span<const TaskRun> runs) {
  nlohmann::json list = nlohmann::json::array();
  for (const TaskRun& run : runs) {
    const TaskResult& r = run.result;
    nlohmann::json files = nlohmann::json::array(), metrics = nlohmann::json::object();
    nlohmann::json skipped = nlohmann::json::array(), groups = nlohmann::json::array();
    nlohmann::json examples = nlohmann::json::array();
    for (const auto& f : r.files) files.push_back(f.string());
    for (const MetricValue& m : r.metrics) metrics[m.name] = metric_json(m);
    for (const SkippedExample& s : r.skipped)
      skipped.push_back({{"file", r.files[s.file].string()}, {"line", s.line}, {"reason", s.reason}});
    for (const GroupResult& g : r.groups) groups.push_back({{"group", g.group}, {"examples", g.examples},
                                                            {"acc", metric_json(g.acc)}});
    for (const ExampleResult& e : r.examples) examples.push_back(example_json(r, e));
    list.push_back({{"label", run.label},
                    {"checkpoint", run.checkpoint},
                    {"step", run.step},
                    {"position", run.position},
                    {"task", r.name},
                    {"files", files},
                    {"examples_scored", r.examples.size()},
                    {"skipped_count", r.skipped.size()},
                    {"skipped", skipped},
                    {"metrics", metrics},
                    {"groups", groups},
                    {"forwards", r.stats.forwards},
                    {"input_tokens", r.stats.input_tokens},
                    {"padded_tokens", r.stats.padded_tokens},
                    {"seconds", r.stats.seconds},
                    {"tokens_per_second", r.stats.tokens_per_second()},
                    {"examples", examples}});
  }
  return {{"runs", list}};
}

std::string format_task_csv(std::span<const TaskRun> runs) {
  std::string out = "label,task,index,file,line,gold,chosen,chosen_norm,correct,correct_norm,choice,log_likelihood,"
                    "tokens,bytes,greedy\n";
  for (const TaskRun& run : runs)
    for (const ExampleResult& e : run.result.examples)
      for (std::size_t c = 0; c < e.choices.size(); ++c) {
        const ChoiceResult& choice = e.choices[c];
        out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{:.17g},{},{},{}\n", csv_field(run.label), run.result.name,
                           e.index, csv_field(run.result.files[e.file].string()), e.line, e.gold, e.chosen,
                           e.chosen_norm, int(e.correct), int(e.correct_norm), c, choice.log_likelihood, choice.tokens,
                           choice.bytes, int(choice.greedy));
      }
  return out;
}

}  // namespace pope
