// PIQA (valid.jsonl with {"goal", "sol1", "sol2"} per line, and valid-labels.lst with one 0/1
// per line, line i labelling record i): "Question: {goal}\nAnswer:" with " " + each solution.
#include <fmt/format.h>

#include "eval/zero_shot/task_files.hpp"
#include "pope/data.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

std::filesystem::path default_labels(const std::filesystem::path& path) {
  std::string name = path.filename().string();
  if (name.size() > 6 && name.ends_with(".jsonl")) name.resize(name.size() - 6);
  return path.parent_path() / (name + "-labels.lst");
}

}  // namespace

TaskData read_piqa(const std::filesystem::path& path, const std::filesystem::path& labels_path) {
  const std::filesystem::path labels_file = labels_path.empty() ? default_labels(path) : labels_path;
  TaskData data{ZeroShotTask::piqa, "piqa", {path, labels_file}, {}};
  const std::vector<zero_shot::JsonRecord> records = zero_shot::read_jsonl(path);
  std::vector<std::string> labels = zero_shot::read_lines(labels_file);
  while (!labels.empty() && labels.back().empty()) labels.pop_back();  // the file's final newline
  if (labels.size() != records.size())
    throw DataError(fmt::format("{} holds {} labels for the {} records of {}; expected one per record",
                                labels_file.string(), labels.size(), records.size(), path.string()));
  for (std::size_t i = 0; i < records.size(); ++i) {
    const zero_shot::JsonRecord& record = records[i];
    TaskExample example;
    example.line = record.line();
    example.context = fmt::format("Question: {}\nAnswer:", record.string("goal"));
    example.choices = {fmt::format(" {}", record.string("sol1")), fmt::format(" {}", record.string("sol2"))};
    if (labels[i] != "0" && labels[i] != "1")
      throw DataError(fmt::format("{} line {}: label '{}' is not 0 or 1", labels_file.string(), i + 1, labels[i]));
    example.gold = labels[i] == "1" ? 1 : 0;
    data.examples.push_back(std::move(example));
  }
  return data;
}

}  // namespace pope
